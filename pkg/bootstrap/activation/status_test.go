package activation

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

const (
	t0        = testBtime + 1000 // a moment well after boot
	sock      = "/run/containerd/containerd.sock"
	cfgFile   = "/etc/containerd/config.toml"
	certsDir  = "/etc/containerd/certs.d"
	mirrorURL = "http://127.0.0.1:5000"
)

func v3Config(configPath string, extra string) string {
	return fmt.Sprintf("version = 3\n%s\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = %q\n", extra, configPath)
}

func v2Config(configPath string) string {
	return fmt.Sprintf("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = %q\n", configPath)
}

// withHosts writes nodecache's hosts.toml for docker.io and ghcr.io under dir at second sec.
func (n *testNode) withHosts(dir string, sec int64) {
	n.file(dir+"/docker.io/hosts.toml", fmt.Sprintf(hostsTOMLFmt, "https://registry-1.docker.io", mirrorURL), sec)
	n.file(dir+"/ghcr.io/hosts.toml", fmt.Sprintf(hostsTOMLFmt, "https://ghcr.io", mirrorURL), sec)
}

func check(r *Report, runtime, name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Runtime == runtime && c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

func dump(r *Report) string {
	var b bytes.Buffer
	_ = r.WriteText(&b)
	return b.String()
}

func want(t *testing.T, r *Report, state State, exit int, reasonHas string) {
	t.Helper()
	if r.State != state || r.ExitCode() != exit {
		t.Fatalf("state %s (exit %d), want %s (exit %d)\n%s", r.State, r.ExitCode(), state, exit, dump(r))
	}
	if reasonHas != "" && !strings.Contains(r.Reason, reasonHas) {
		t.Fatalf("reason %q does not mention %q\n%s", r.Reason, reasonHas, dump(r))
	}
	// The JSON output carries the same answer.
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		State  State `json:"state"`
		Checks []Check
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil || doc.State != state || len(doc.Checks) != len(r.Checks) {
		t.Fatalf("JSON round trip: %v, state %s, %d checks\n%s", err, doc.State, len(doc.Checks), b.String())
	}
}

// containerd 2.0–2.3 export nothing about their registry configuration: the start time decides.
func TestContainerdStartTimeRule(t *testing.T) {
	t.Parallel()
	// The agent pod (re)created after containerd started writes config and hosts.
	n := newContainerd23Node(t, t0, t0+100)
	o := n.opts()
	o.Runtime = RuntimeContainerd

	r := n.evaluate(o)
	want(t, r, NotActive, 1, "has not loaded")
	if rt, _ := r.Runtime(RuntimeContainerd); rt.Remedy == "" || !strings.Contains(rt.Remedy, "restart containerd") || !rt.Pending {
		t.Fatalf("remedy %q pending %v", rt.Remedy, rt.Pending)
	}

	// containerd restarted later: same options, no agent restart, the new process is found.
	if err := os.RemoveAll(filepath.Join(n.Proc.Root, "1000")); err != nil {
		t.Fatal(err)
	}
	n.containerdProc(1200, t0+200, sock)
	r = n.evaluate(o)
	want(t, r, Active, 0, "started after its configuration last changed")
	if rt, _ := r.Runtime(RuntimeContainerd); rt.PID != 1200 || rt.Evidence != "start-time" || *rt.LoadedConfigPath != certsDir {
		t.Fatalf("runtime report %+v", rt)
	}

	// config.toml rewritten after that restart: not active again (it might say anything now).
	n.file(cfgFile, v3Config(certsDir, "# edited"), t0+300)
	want(t, n.evaluate(o), NotActive, 1, "")

	// An import changed after the restart counts too.
	n.file(cfgFile, v3Config(certsDir, `imports = ["/etc/containerd/conf.d/*.toml"]`), t0+100)
	n.file("/etc/containerd/conf.d/10-x.toml", "version = 3\n", t0+400)
	r = n.evaluate(o)
	want(t, r, NotActive, 1, "")
	if c, _ := check(r, RuntimeContainerd, "start-time"); !strings.Contains(c.Reason, "10-x.toml") {
		t.Fatalf("start-time row does not name the import: %+v", c)
	}
}

// containerd 2.0–2.3 is judged by the restart-evidence rule: a config changed at least 10 ms
// before the start was loaded; within ±10 ms the order cannot be told and it stays NOT active
// with the reason and what settles it (a restart, or a pull the mirror saw); 10 ms or more
// after the start it was certainly not loaded. Start times are exact to the 10 ms tick.
func TestContainerdStartAgainstMtime(t *testing.T) {
	t.Parallel()
	start := time.Unix(t0+100, 0).Add(370 * time.Millisecond) // a whole tick
	for _, tc := range []struct {
		name   string
		mtime  time.Duration // config.toml's change, relative to the start
		mirror string        // --mirror; "" names the mirror from the hosts.toml files
		state  State
		has    string
	}{
		{"changed 10ms before: loaded", -StartTolerance, "", Active, "started after its configuration last changed"},
		{"changed half a second before: loaded", -500 * time.Millisecond, "", Active, "started after its configuration last changed"},
		{"changed 9ms before: cannot tell", -9 * time.Millisecond, "", NotActive, "within 10ms of the last change"},
		{"changed at the start tick: cannot tell", 0, "", NotActive, "within 10ms of the last change"},
		{"changed 9ms after: cannot tell", 9 * time.Millisecond, "http://127.0.0.1:5999", NotActive, "within 10ms of the last change"},
		{"changed 10ms after: not loaded", StartTolerance, "", NotActive, "before /etc/containerd/config.toml last changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			n.serveContainerd(sock, &fakeContainerd{version: "2.2.0"})
			n.Proc.AddProcess(1000, "containerd", start, "/usr/bin/containerd")
			n.Proc.listen(1000, sock, 8000)
			n.fileAt(cfgFile, v3Config(certsDir, ""), start.Add(tc.mtime))
			n.withHosts(certsDir, t0)
			o := n.opts()
			hint := mirrorURL
			if tc.mirror != "" {
				o.Mirror = parseMirror(t, tc.mirror)
				o.NodeAddrs = func() ([]netip.Addr, error) { return nil, nil }
				o.HTTPClient = &http.Client{Transport: answer{}}
				hint = tc.mirror
			}
			r := n.evaluate(o)
			want(t, r, tc.state, tc.state.ExitCode(), tc.has)
			if tc.state == Active {
				return
			}
			rt, _ := r.Runtime(RuntimeContainerd)
			if !strings.Contains(rt.Remedy, "restart containerd or cycle the node") || !rt.Pending {
				t.Errorf("remedy %q pending %v", rt.Remedy, rt.Pending)
			}
			if tc.mtime >= StartTolerance {
				return
			}
			for _, s := range []string{"cannot tell which came first", "restart containerd again", "let a pull prove it: nodecache status --mirror " + hint} {
				if !strings.Contains(r.Reason, s) {
					t.Errorf("reason does not say %q\n%s", s, dump(r))
				}
			}
			if !strings.Contains(rt.Remedy, "--mirror "+hint) {
				t.Errorf("remedy %q does not name the mirror", rt.Remedy)
			}
			if c, _ := check(r, RuntimeContainerd, "start-time"); c.Result != Fail || !strings.Contains(c.Reason, "within 10ms") {
				t.Errorf("start-time row %+v", c)
			}
		})
	}
}

func TestContainerdIntrospection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		loaded    string
		onDisk    string
		cfgSec    int64
		state     State
		pending   bool
		reasonHas string
		checkName string
		checkHas  string
		remedyHas string
	}{
		{name: "single directory", loaded: certsDir, onDisk: certsDir, cfgSec: t0 - 50, state: Active, reasonHas: "introspection"},
		{name: "touched after start: still active, pending", loaded: certsDir, onDisk: certsDir, cfgSec: t0 + 50, state: Active, pending: true, checkName: "pending", checkHas: "pending until containerd restarts"},
		{name: "on-disk differs from loaded", loaded: certsDir, onDisk: "/etc/other.d", cfgSec: t0 - 50, state: Active, pending: true, checkName: "pending", checkHas: `"/etc/other.d"`},
		{name: "list in transfer mode", loaded: certsDir + ":/etc/docker/certs.d", onDisk: certsDir + ":/etc/docker/certs.d", cfgSec: t0 - 50, state: NotActive, reasonHas: "is a list", remedyHas: "set config_path to a single directory"},
		{name: "default list (no config_path)", loaded: bcontainerd.DefaultConfigPath2x, onDisk: "", cfgSec: t0 - 50, state: NotActive, reasonHas: "is a list", remedyHas: "set config_path to a single directory"},
		{name: "loaded from before gen: only the restart is missing", loaded: bcontainerd.DefaultConfigPath2x, onDisk: certsDir, cfgSec: t0 + 50, state: NotActive, pending: true, reasonHas: "is a list", remedyHas: "config_path on disk is already " + certsDir + ": restart containerd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newContainerdNode(t, &fakeContainerd{version: "v2.4.2", exports: map[string]string{exportConfigPath: tt.loaded, "DiscardUnpackedLayers": "false"}}, t0, v3Config(tt.onDisk, ""), tt.cfgSec)
			n.withHosts(certsDir, t0+500) // hosts.toml changes need no restart
			r := n.evaluate(n.opts())
			want(t, r, tt.state, tt.state.ExitCode(), tt.reasonHas)
			rt, _ := r.Runtime(RuntimeContainerd)
			if rt.Pending != tt.pending {
				t.Fatalf("pending = %v, want %v\n%s", rt.Pending, tt.pending, dump(r))
			}
			if tt.pending && len(r.Warnings) == 0 {
				t.Fatalf("pending without a warning\n%s", dump(r))
			}
			if !strings.Contains(rt.Remedy, tt.remedyHas) {
				t.Fatalf("remedy %q, want %q\n%s", rt.Remedy, tt.remedyHas, dump(r))
			}
			if tt.checkName != "" {
				c, ok := check(r, RuntimeContainerd, tt.checkName)
				if !ok || !strings.Contains(c.Reason, tt.checkHas) {
					t.Fatalf("row %s = %+v, want %q\n%s", tt.checkName, c, tt.checkHas, dump(r))
				}
			}
		})
	}
}

// Imports are merged the way containerd 2.x merges them (pkg/bootstrap/containerd's reader,
// checked there against containerd's own loader): tables key by key, so a setting of the main
// file survives an import that sets config_path in the same table. Here the main file forces
// local pull (max_concurrent_downloads = 5) and a relative glob import sets a list: the list is
// read in order, so the node is ACTIVE; the config row names every file in load order.
func TestContainerdImportsMergeKeyByKey(t *testing.T) {
	t.Parallel()
	list := certsDir + ":/etc/docker/certs.d"
	n := newContainerdNode(t, &fakeContainerd{version: "v2.4.2", exports: map[string]string{exportConfigPath: list}}, t0,
		"version = 3\nimports = [\"conf.d/*.toml\"]\n[plugins.\"io.containerd.cri.v1.images\"]\n  max_concurrent_downloads = 5\n", t0-50)
	n.file("/etc/containerd/conf.d/20-b.toml", fmt.Sprintf("version = 3\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = %q\n", list), t0-60)
	n.file("/etc/containerd/conf.d/10-a.toml", "version = 3\n", t0-70)
	n.withHosts(certsDir, t0-50)
	r := n.evaluate(n.opts())
	want(t, r, Active, 0, "")
	if c, _ := check(r, RuntimeContainerd, "config_path"); !strings.Contains(c.Reason, "max_concurrent_downloads = 5") {
		t.Fatalf("config_path row %+v\n%s", c, dump(r))
	}
	files := cfgFile + " + /etc/containerd/conf.d/10-a.toml + /etc/containerd/conf.d/20-b.toml"
	if c, _ := check(r, RuntimeContainerd, "config"); !strings.Contains(c.Reason, files) {
		t.Fatalf("config row %+v, want %q", c, files)
	}
}

// containerd ≥ 2.1 with local pull forced reads a ":" list in order (the EKS shape).
func TestContainerdListWithLocalPull(t *testing.T) {
	t.Parallel()
	list := certsDir + ":/etc/docker/certs.d"
	n := newContainerdNode(t, &fakeContainerd{version: "v2.4.2", exports: map[string]string{exportConfigPath: list}}, t0,
		v3Config(list, "[plugins.\"io.containerd.cri.v1.images\"]\n  discard_unpacked_layers = true\n"), t0-50)
	n.withHosts(certsDir, t0-50)
	r := n.evaluate(n.opts())
	want(t, r, Active, 0, "")
	if c, _ := check(r, RuntimeContainerd, "config_path"); !strings.Contains(c.Reason, "discard_unpacked_layers = true") {
		t.Fatalf("config_path row %+v", c)
	}
}

func TestContainerdCRIStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		loaded  string
		cfgSec  int64
		state   State
		pending bool
	}{
		{"config_path loaded", certsDir, t0 - 10, Active, false},
		{"touched after start", certsDir, t0 + 10, Active, true},
		{"no config_path loaded", "", t0 - 10, NotActive, true},
		{"list is fine on 1.x", certsDir + ":/etc/docker/certs.d", t0 - 10, Active, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newContainerdNode(t, &fakeContainerd{version: "1.7.35", criConfig: criStatusConfig(tt.loaded)}, t0, v2Config(certsDir), tt.cfgSec)
			n.withHosts(certsDir, t0)
			r := n.evaluate(n.opts())
			want(t, r, tt.state, tt.state.ExitCode(), "")
			rt, _ := r.Runtime(RuntimeContainerd)
			if rt.Pending != tt.pending || (tt.state == Active && rt.Evidence != "cri-status") {
				t.Fatalf("runtime %+v\n%s", rt, dump(r))
			}
		})
	}
}

// Talos runs two containerd daemons; the one serving --containerd-socket is examined.
func TestTwoContainerdProcesses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		criStart int64
		state    State
	}{
		{"CRI daemon started before the config", t0, NotActive},
		{"CRI daemon started after the config", t0 + 200, Active},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			n.serveContainerd(sock, &fakeContainerd{version: "v2.3.0"})
			n.containerdProc(77, t0+500, "/system/run/containerd/containerd.sock", "--address", "/system/run/containerd/containerd.sock")
			n.containerdProc(900, tt.criStart, sock, "--config", cfgFile)
			n.Proc.seeSocket(77, sock, 7900)
			n.file(cfgFile, v3Config(certsDir, ""), t0+100)
			n.withHosts(certsDir, t0+100)
			r := n.evaluate(n.opts())
			want(t, r, tt.state, tt.state.ExitCode(), "")
			if rt, _ := r.Runtime(RuntimeContainerd); rt.PID != 900 {
				t.Fatalf("examined pid %d, want 900\n%s", rt.PID, dump(r))
			}
		})
	}
	t.Run("no process serves the socket", func(t *testing.T) {
		t.Parallel()
		n := newTestNode(t)
		n.containerdProc(77, t0, "/system/run/containerd/containerd.sock")
		n.containerdProc(78, t0, "/run/other.sock")
		n.file(cfgFile, v3Config(certsDir, ""), t0-100)
		want(t, n.evaluate(n.opts()), Unknown, 3, "serves "+sock)
	})
}

func TestContainerdUnreadableEvidence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		break_ func(n *testNode)
		has    string
	}{
		{"unreadable stat", func(n *testNode) {
			f := filepath.Join(n.Proc.Root, "1000", "stat")
			_ = os.Remove(f)
			_ = os.Mkdir(f, 0o755)
		}, "read process 1000 start"},
		{"non-digit start time", func(n *testNode) {
			n.Proc.write("1000/stat", strings.Replace(statLine(1000, "containerd", ticksAt(t0)), fmt.Sprint(ticksAt(t0)), "12abc", 1))
		}, "read process 1000 start"},
		{"comm with spaces and parenthesis elsewhere", func(n *testNode) {
			n.Proc.addProcess(1001, "a) b (c", 5)
			n.Proc.write("1000/stat", strings.Replace(statLine(1000, "containerd", ticksAt(t0)), "(containerd)", "(containerd) x)", 1))
		}, "stat says"},
		{"missing CLK_TCK", func(n *testNode) { n.Proc.WriteBytes("self/auxv", bootstrap.EncodeAuxv([2]uint64{6, 4096})) }, "AT_CLKTCK"},
		{"zero CLK_TCK", func(n *testNode) { n.Proc.WriteBytes("self/auxv", bootstrap.EncodeAuxv([2]uint64{17, 0})) }, "AT_CLKTCK"},
		{"config unreadable", func(n *testNode) {
			p := filepath.Join(n.Root, cfgFile)
			_ = os.Remove(p)
			_ = os.Mkdir(p, 0o755)
		}, "config.toml"},
		// newuser2 item 2: a FIFO is refused after a stat, never opened (which would block).
		{"config is a FIFO", func(n *testNode) {
			p := filepath.Join(n.Root, cfgFile)
			_ = os.Remove(p)
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "config.toml is a named pipe (FIFO)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newContainerdNode(t, &fakeContainerd{version: "v2.3.0"}, t0, v3Config(certsDir, ""), t0-10)
			n.withHosts(certsDir, t0-10)
			tt.break_(n)
			r := n.evaluate(n.opts())
			want(t, r, Unknown, 3, "")
			found := false
			for _, c := range r.Checks {
				found = found || (c.Result == Unread && strings.Contains(c.Reason, tt.has))
			}
			if !found {
				t.Fatalf("no unknown row mentioning %q\n%s", tt.has, dump(r))
			}
		})
	}
}

func TestNotApplicable(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	n.Proc.addProcess(5, "kubelet", 10)
	n.file("/etc/os-release", "NAME=\"Debian GNU/Linux\"\nID=debian\n", t0)
	// A runtime asked for by name but absent says so, with what was looked at.
	for rt, reason := range map[string]string{
		RuntimeAuto:       "",
		RuntimeContainerd: "no containerd found under --host-root " + n.Root + ": no process named containerd under " + n.Proc.Root + " and no " + cfgFile,
		RuntimeCRIO:       "no CRI-O found under --host-root " + n.Root + ": no process named crio",
		RuntimeTalos:      "no Talos found under --host-root " + n.Root + ": /etc/os-release says ID=debian",
	} {
		o := n.opts()
		o.Runtime = rt
		want(t, n.evaluate(o), NotApplicable, 3, reason)
	}
	// A config without a daemon cannot be judged.
	n.file(cfgFile, v3Config(certsDir, ""), t0)
	o := n.opts()
	o.Runtime = RuntimeContainerd
	want(t, n.evaluate(o), Unknown, 3, "no containerd process is visible")
}

// --runtime talos on a node that is not Talos is "cannot tell" (exit 3), not NOT ACTIVE, even
// with a containerd whose hosts files would make it NOT ACTIVE; nothing suggests a Talos patch.
func TestTalosRequestedButAbsent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(n *testNode)
		state State
		has   string
	}{
		{"another distribution", func(n *testNode) {
			n.file("/etc/os-release", "ID=\"ubuntu\"\nVERSION_ID=\"24.04\"\n", t0)
		}, NotApplicable, "/etc/os-release says ID=ubuntu"},
		{"no os-release", func(n *testNode) {}, NotApplicable, "there is no /etc/os-release"},
		{"os-release without ID", func(n *testNode) { n.file("/etc/os-release", "NAME=x\n", t0) }, NotApplicable, "/etc/os-release has no ID"},
		{"os-release unreadable", func(n *testNode) {
			if err := os.MkdirAll(filepath.Join(n.Root, "etc", "os-release"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, Unknown, "cannot tell whether the host under --host-root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newContainerd24Node(t)
			tc.setup(n)
			o := n.opts()
			o.Runtime = RuntimeTalos
			r := n.evaluate(o)
			want(t, r, tc.state, 3, tc.has)
			rt, ok := r.Runtime(RuntimeTalos)
			if !ok || rt.Remedy != "" || len(r.Runtimes) != 1 {
				t.Fatalf("runtimes %+v: want only talos, without a remedy\n%s", r.Runtimes, dump(r))
			}
			if tc.state == NotApplicable && !strings.Contains(r.Reason, "no Talos found under --host-root "+n.Root) {
				t.Fatalf("reason %q", r.Reason)
			}
		})
	}
}

// A host root that does not exist or is not a directory is refused: nothing could be judged.
func TestHostRootRefused(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{filepath.Join(t.TempDir(), "nonexistent"), file} {
		_, err := bootstrap.NewHost(bootstrap.HostOptions{Root: root})
		if err == nil || !strings.Contains(err.Error(), root) {
			t.Errorf("host root %s: error %v, want a refusal naming it", root, err)
		}
	}
}

// Without an answer on the runtime's API there is no runtime evidence: UNKNOWN (exit 3), even
// when the start time is after every change and the files point at the mirror.
func TestContainerdSocketSilent(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	n.containerdProc(1000, t0, sock)
	n.file(cfgFile, v3Config(certsDir, ""), t0-10)
	n.withHosts(certsDir, t0-10)
	want(t, n.evaluate(n.opts()), Unknown, 3, "does not answer (unreachable or permission denied")
}

// A CRI plugin that failed to load (introspection's plugin list, 1.x and 2.x) is NOT ACTIVE
// (exit 1), whatever the files and the start time say; so is a config containerd refuses.
func TestContainerdCRIPluginFailed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, version, cfg, has string
		initErr                 string
	}{
		{name: "1.7 with inline mirrors next to config_path", version: "v1.7.35",
			cfg:     "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"docker.io\"]\n  endpoint = [\"http://127.0.0.1:5000\"]\n",
			initErr: "invalid plugin config: `mirrors` cannot be set when `config_path` is provided", has: "io.containerd.grpc.v1.cri: invalid plugin config"},
		{name: "2.3 images plugin failed", version: "v2.3.7", cfg: v3Config(certsDir, ""),
			initErr: "failed to create images plugin", has: "io.containerd.cri.v1.images: failed to create images plugin"},
		{name: "config does not parse", version: "v2.3.7", cfg: "version = = 3", has: "does not parse as TOML"},
		{name: "missing import", version: "v2.3.7", cfg: v3Config(certsDir, `imports = ["/etc/containerd/missing.toml"]`), has: "missing.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newContainerdNode(t, &fakeContainerd{version: tc.version, criInitErr: tc.initErr, criConfig: criStatusConfig(certsDir)}, t0, tc.cfg, t0-10)
			n.withHosts(certsDir, t0-10)
			r := n.evaluate(n.opts())
			want(t, r, NotActive, 1, tc.has)
			if rt, _ := r.Runtime(RuntimeContainerd); !strings.Contains(rt.Remedy, "restart containerd or cycle the node") {
				t.Errorf("remedy %q", rt.Remedy)
			}
		})
	}
}

func TestContainerdHosts(t *testing.T) {
	t.Parallel()
	runHostsCases(t, []hostsCase{
		{name: "all managed hosts point at the mirror", setup: func(n *testNode) { n.withHosts(certsDir, t0) }, state: Active},
		{name: "mirror matches --mirror", setup: func(n *testNode) { n.withHosts(certsDir, t0) }, mirror: mirrorURL, state: Active},
		{name: "another mirror", setup: func(n *testNode) { n.withHosts(certsDir, t0) }, mirror: "http://127.0.0.1:5001", state: NotActive, has: "(docker.io, ghcr.io)"},
		{name: "upstream without hosts.toml", setup: func(n *testNode) { n.withHosts(certsDir, t0) }, upstreams: []string{"docker.io", "quay.io"}, state: NotActive, has: "quay.io"},
		{name: "no hosts.toml", setup: func(n *testNode) {}, state: NotActive, has: "no hosts.toml under " + certsDir + ": containerd pulls from every registry directly"},
		{name: "hosts.toml that does not parse", setup: func(n *testNode) {
			n.withHosts(certsDir, t0)
			n.file(certsDir+"/ghcr.io/hosts.toml", "# managed by nodecache\n[host.\"http://127.0.0.1:5000\"\n", t0)
		}, state: NotActive, has: "ghcr.io"},
		{name: "port form directory", setup: func(n *testNode) {
			n.file(certsDir+"/registry.local_5000_/hosts.toml", fmt.Sprintf(hostsTOMLFmt, "https://registry.local:5000", mirrorURL), t0)
		}, upstreams: []string{"registry.local:5000"}, state: Active},
		{name: "host:port directory (containerd reads it too)", setup: func(n *testNode) {
			n.file(certsDir+"/registry.local:5000/hosts.toml", fmt.Sprintf(hostsTOMLFmt, "https://registry.local:5000", mirrorURL), t0)
		}, upstreams: []string{"registry.local:5000"}, state: Active},
	})
}

// answer is a transport for tests whose mirror answers but has seen no client.
type answer struct{}

func (answer) RoundTrip(r *http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	return &http.Response{StatusCode: http.StatusOK, Header: h, Request: r,
		Body: io.NopCloser(strings.NewReader(`{"clients":[]}`))}, nil
}

func TestTalos(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	n.file("/etc/os-release", "NAME=\"Talos\"\nID=talos\nVERSION_ID=v1.13.8\n", t0)
	// Talos runs its own containerds; whatever they are, the hosts files decide.
	n.containerdProc(77, t0, "/system/run/containerd/containerd.sock")
	r := n.evaluate(n.opts())
	want(t, r, NotActive, 1, "no registry mirror configured")
	n.file(DefaultTalosHostsDir+"/docker.io/hosts.toml", "server = \"https://registry-1.docker.io\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", t0+50)
	// Talos' files carry no nodecache marker: without --mirror nothing tells which host is the
	// mirror (before: a false NOT ACTIVE "not the mirror").
	want(t, n.evaluate(n.opts()), Unknown, 3, "cannot tell which host is the mirror")
	o := n.opts()
	o.Mirror = parseMirror(t, mirrorURL)
	o.HTTPClient = &http.Client{Transport: answer{}}
	r = n.evaluate(o)
	want(t, r, Active, 0, "")
	if _, ok := r.Runtime(RuntimeContainerd); ok {
		t.Fatalf("containerd examined on Talos\n%s", dump(r))
	}
	o.Upstreams = []string{"docker.io", "ghcr.io"}
	want(t, n.evaluate(o), NotActive, 1, "ghcr.io")
}

const crioDropIn = `# managed by nodecache
[[registry]]
prefix = "docker.io"
location = "docker.io"

[[registry.mirror]]
location = "127.0.0.1:5000/docker.io"
insecure = true

[[registry]]
prefix = "ghcr.io"
location = "ghcr.io"

[[registry.mirror]]
location = "127.0.0.1:5000/ghcr.io"
insecure = true
`

func (n *testNode) crio(pid int, sec int64) {
	n.Proc.addProcess(pid, "crio", ticksAt(sec), "/usr/bin/crio")
	n.file(DefaultCRIOConfig, "[crio.image]\n", testBtime)
	n.serveContainerd(DefaultCRIOSocket, &fakeContainerd{version: "1.31.0"}) // CRI answers on crio.sock
}

func TestCRIO(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(n *testNode)
		state State
		has   string
	}{
		{"started after the drop-in", func(n *testNode) {
			n.crio(300, t0+200)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
		}, Active, "crio started after"},
		{"drop-in written after start", func(n *testNode) {
			n.crio(300, t0)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
		}, NotActive, "auto_reload_registries was off"},
		{"start within 10ms of the drop-in change", func(n *testNode) {
			n.crio(300, t0+100)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
		}, NotActive, "within 10ms of the last change of /etc/containers/registries.conf.d/90-nodecache.conf"},
		{"auto reload on at start", func(n *testNode) {
			n.crio(300, t0)
			n.file(DefaultCRIODropInDir+"/10-reload.conf", "[crio.image]\nauto_reload_registries = true\n", t0-100)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
		}, Active, "auto_reload_registries was on"},
		{"auto reload enabled only after start", func(n *testNode) {
			n.crio(300, t0)
			n.file(DefaultCRIODropInDir+"/10-reload.conf", "[crio.image]\nauto_reload_registries = true\n", t0+50)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
		}, NotActive, ""},
		{"auto reload turned off by a later drop-in", func(n *testNode) {
			n.crio(300, t0)
			n.file(DefaultCRIODropInDir+"/10-reload.conf", "[crio.image]\nauto_reload_registries = true\n", t0-100)
			n.file(DefaultCRIODropInDir+"/20-off.conf", "[crio.image]\nauto_reload_registries = false\n", t0-100)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
		}, NotActive, ""},
		{"overridden by a later drop-in", func(n *testNode) {
			n.crio(300, t0+200)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
			n.file(DefaultRegistriesDir+"/99-site.conf", "[[registry]]\nprefix = \"ghcr.io\"\nlocation = \"ghcr.io\"\n", t0+100)
		}, NotActive, "ghcr.io"},
		{"invalid drop-in", func(n *testNode) {
			n.crio(300, t0+200)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn+"\n[[registry]]\nprefix = \"x/\"\nlocation = \"\"\n", t0+100)
		}, NotActive, "does not load"},
		{"no drop-in", func(n *testNode) { n.crio(300, t0) }, NotActive, "no nodecache drop-in"},
		// Issue 11: a longer site prefix wins in containers/image whatever the file order; the
		// site file is an absolute link, resolved under the host root as on the host.
		{"longer site prefix through a link", func(n *testNode) {
			n.crio(300, t0+200)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
			n.file("/etc/site/library.conf", "[[registry]]\nprefix = \"docker.io/library\"\nlocation = \"docker.io/library\"\n[[registry.mirror]]\nlocation = \"mirror.corp.example/library\"\n", t0+100)
			if err := os.Symlink("/etc/site/library.conf", filepath.Join(n.Root, DefaultRegistriesDir, "10-library.conf")); err != nil {
				t.Fatal(err)
			}
		}, NotActive, "docker.io/library (a longer prefix than docker.io, without the mirror)"},
		{"longer prefix with the mirror first", func(n *testNode) {
			n.crio(300, t0+200)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn+"\n[[registry]]\nprefix = \"docker.io/library\"\nlocation = \"docker.io/library\"\n[[registry.mirror]]\nlocation = \"127.0.0.1:5000/docker.io/library\"\ninsecure = true\n", t0+100)
		}, Active, ""},
		{"site blocked, merged", func(n *testNode) {
			n.crio(300, t0+200)
			n.file(DefaultRegistriesDir+"/90-nodecache.conf", strings.Replace(crioDropIn, "location = \"docker.io\"\n", "location = \"docker.io\"\nblocked = true\n", 1), t0+100)
		}, NotActive, "docker.io (blocked)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			tt.setup(n)
			r := n.evaluate(n.opts()) // auto: containerd is not applicable, CRI-O decides
			want(t, r, tt.state, tt.state.ExitCode(), tt.has)
			if rt, _ := r.Runtime(RuntimeContainerd); rt.State != NotApplicable {
				t.Fatalf("containerd %+v", rt)
			}
		})
	}
}

func TestBothRuntimes(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T, containerdStart int64) *testNode {
		n := newContainerdNode(t, &fakeContainerd{version: "v2.3.0"}, containerdStart, v3Config(certsDir, ""), t0+100)
		n.withHosts(certsDir, t0+100)
		n.crio(300, t0+200)
		n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0+100)
		return n
	}
	n := setup(t, t0+200)
	want(t, n.evaluate(n.opts()), Active, 0, "")
	n = setup(t, t0)
	r := n.evaluate(n.opts())
	want(t, r, NotActive, 1, "containerd")
	if rt, _ := r.Runtime(RuntimeCRIO); rt.State != Active {
		t.Fatalf("crio %+v", rt)
	}
	o := n.opts()
	o.Runtime = RuntimeCRIO
	want(t, n.evaluate(o), Active, 0, "")
}

// startAppMirror serves a nodecache mirror (on disk) whose upstream, named registry.test, holds
// team/app:v1.
func startAppMirror(t *testing.T) *nodecachetest.Nodecache {
	t.Helper()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/app", "v1", mirrortest.Image(t, 512, 1, "linux/amd64"))
	return nodecachetest.Start(t, nodecachetest.Options{Upstream: up, Alias: "registry.test", Root: t.TempDir()})
}

// clientRequest sends method url to the mirror as a runtime would (user agent ua, asking for a
// manifest), so that the mirror's client evidence counts it.
func clientRequest(t *testing.T, method, url, ua string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", ua)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
}

// The mirror's client evidence proves what the start-time rule cannot: a 2.3 containerd whose
// config was touched after start, but which pulled through the mirror since.
func TestTrafficEvidence(t *testing.T) {
	t.Parallel()
	srv := startAppMirror(t)

	// Started (in real time) a minute ago; config touched after.
	now := time.Now().Unix()
	n := newContainerdNode(t, &fakeContainerd{version: "v2.3.0"}, now-60, v3Config(certsDir, ""), now-30)
	n.withHosts(certsDir, now-30)
	o := n.mirrorOpts(t, srv.URL)

	r := n.evaluate(o)
	want(t, r, NotActive, 1, "")
	if c, _ := check(r, RuntimeContainerd, "traffic"); c.Result != Info || !strings.Contains(c.Reason, "read from the mirror replica at 127.0.0.1:") {
		t.Fatalf("traffic row %+v", c)
	}
	get := func(method, path, ua string) { t.Helper(); clientRequest(t, method, srv.URL+path, ua) }
	// Pings, errors and refused methods from the runtime's user agent prove nothing.
	get(http.MethodGet, "/v2/", "containerd/v2.3.0")
	get(http.MethodGet, "/v2/team/app/manifests/nope?ns=registry.test", "containerd/v2.3.0")
	get(http.MethodDelete, "/v2/team/app/manifests/v1?ns=registry.test", "containerd/v2.3.0")
	get(http.MethodGet, "/nodecache/v1/clients", "containerd/v2.3.0")
	// Content to another family proves nothing about containerd.
	get(http.MethodGet, "/v2/team/app/manifests/v1?ns=registry.test", "nodecache-warm/1.0")
	want(t, n.evaluate(o), NotActive, 1, "")

	get(http.MethodHead, "/v2/team/app/manifests/v1?ns=registry.test", "containerd/v2.3.0")
	r = n.evaluate(o)
	want(t, r, Active, 0, "the mirror served containerd manifests or blobs to this node")
	if len(r.Warnings) == 0 {
		t.Fatalf("no warning about the overturned evidence\n%s", dump(r))
	}
	// A CRI-O node: containerd traffic proves nothing about crio.
	o.Runtime = RuntimeCRIO
	n.crio(300, now-60)
	n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, now-30)
	want(t, n.evaluate(o), NotActive, 1, "")
}

// parseMirror parses a --mirror value the way every command does (name.ParseMirror).
func parseMirror(t *testing.T, s string) *url.URL {
	t.Helper()
	m := bootstraptest.Mirror(t, s)
	return m.URL
}

// The mirror's times are read on this node's clock through the offset of the same exchange:
// its "now" (nanoseconds), else its Date header (whole seconds, so up to a second of doubt is
// held against the pull). A pull from before the daemon started never counts.
func TestTrafficClockOffset(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		offset   time.Duration // mirror clock minus this node's
		pullAgo  time.Duration // when the pull happened, on this node's clock
		startAgo time.Duration // when the daemon started, on this node's clock
		dateOnly bool
		state    State
	}{
		{"mirror an hour ahead, pull after start", time.Hour, 5 * time.Second, 10 * time.Second, false, Active},
		{"mirror an hour ahead, pull before start", time.Hour, 10 * time.Second, 5 * time.Second, false, NotActive},
		{"mirror an hour behind, pull after start", -time.Hour, 5 * time.Second, 10 * time.Second, false, Active},
		{"mirror an hour behind, pull before start", -time.Hour, 10 * time.Second, 5 * time.Second, false, NotActive},
		{"Date only, pull 3s after start", 90 * time.Minute, 2 * time.Second, 5 * time.Second, true, Active},
		{"Date only, pull 100ms after start: within the Date's second", 90 * time.Minute, 4900 * time.Millisecond, 5 * time.Second, true, NotActive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mnow := time.Now().Add(tc.offset)
				if tc.dateOnly {
					mnow = mnow.Truncate(time.Second) // the mirror's clock at a whole second: Date tells it exactly, the bound still doubts a second
				}
				doc := mirrorapi.ClientEvidence{Clients: []mirrorapi.ClientRecord{{Address: "127.0.0.1", LastSeen: mnow,
					UserAgents: map[string]*mirrorapi.AgentRecord{"containerd": {Count: 3, LastSeen: mnow, ContentCount: 1, LastContent: mnow.Add(-tc.pullAgo)}}}}}
				if !tc.dateOnly {
					doc.Now = mnow
				}
				w.Header().Set("Date", mnow.UTC().Format(http.TimeFormat))
				_ = json.NewEncoder(w).Encode(doc)
			}))
			t.Cleanup(srv.Close)
			n := newTestNode(t)
			n.serveContainerd(sock, &fakeContainerd{version: "v2.3.0"})
			start := time.Now().Add(-tc.startAgo)
			n.Proc.AddProcess(1000, "containerd", start, "/usr/bin/containerd")
			n.Proc.listen(1000, sock, 8000)
			n.fileAt(cfgFile, v3Config(certsDir, ""), start.Add(time.Second)) // changed after the start
			n.withHosts(certsDir, t0)
			o := n.mirrorOpts(t, srv.URL)
			r := n.evaluate(o)
			want(t, r, tc.state, tc.state.ExitCode(), "")
		})
	}
}

// With --mirror, a mirror that does not answer makes the runtime NOT ACTIVE (exit 1) whatever
// the configuration evidence says; without --mirror the verdict says reachability was not
// checked.
func TestMirrorUnreachable(t *testing.T) {
	t.Parallel()
	n := newContainerd24Node(t)
	n.withHosts(certsDir, t0-10)
	o := n.opts()
	o.Runtime = RuntimeContainerd
	want(t, n.evaluate(o), Active, 0, "mirror reachability not checked")

	stopped := httptest.NewServer(http.NotFoundHandler())
	stopped.Close()
	o.Mirror = parseMirror(t, stopped.URL)
	o.Upstreams = []string{"docker.io"}
	r := n.evaluate(o)
	want(t, r, NotActive, 1, "does not answer, so no pull goes through it")
	if c, _ := check(r, RuntimeContainerd, "mirror"); c.Result != Fail || !strings.Contains(c.Reason, "connection refused") {
		t.Fatalf("mirror row %+v\n%s", c, dump(r))
	}
}

// A crio process whose CRI socket does not answer gives no runtime evidence: UNKNOWN (exit 3),
// whatever the drop-ins and start time say; when it answers, its version is reported.
func TestCRIOSocketSilent(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	n.Proc.addProcess(300, "crio", ticksAt(t0+100), "/usr/bin/crio")
	n.file(DefaultCRIOConfig, "[crio.image]\n", testBtime)
	n.file(DefaultRegistriesDir+"/90-nodecache.conf", crioDropIn, t0)
	o := n.opts()
	o.Runtime = RuntimeCRIO
	want(t, n.evaluate(o), Unknown, 3, "CRI-O's API at /var/run/crio/crio.sock does not answer")
	n.serveContainerd(DefaultCRIOSocket, &fakeContainerd{version: "1.31.0"})
	r := n.evaluate(o)
	want(t, r, Active, 0, "")
	if rt, _ := r.Runtime(RuntimeCRIO); rt.Version != "1.31.0" {
		t.Fatalf("version %q, want 1.31.0 from the CRI version call", rt.Version)
	}
}

// TestContainerdHostsFIFO (newuser2 item 2): a hosts.toml that is a FIFO is refused after a
// stat, never read — containerd's parser would block on it — and the row names it: UNKNOWN.
func TestContainerdHostsFIFO(t *testing.T) {
	t.Parallel()
	n := newContainerdNode(t, &fakeContainerd{version: "v2.3.0"}, t0, v3Config(certsDir, ""), t0-10)
	n.withHosts(certsDir, t0-10)
	p := filepath.Join(n.Root, certsDir, "docker.io", "hosts.toml")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	r := nodecachetest.Within(t, 60*time.Second, "status (blocked on the FIFO?)", func() *Report { return n.evaluate(n.opts()) })
	want(t, r, Unknown, 3, "")
	found := false
	for _, c := range r.Checks {
		found = found || strings.Contains(c.Reason, certsDir+"/docker.io/hosts.toml is a named pipe (FIFO)")
	}
	if !found {
		t.Fatalf("no check names the FIFO\n%s", dump(r))
	}
}
