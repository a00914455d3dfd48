package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// statusResult is `nodecache status --output json` and its exit code.
type statusResult struct {
	Exit   int
	Report activation.Report
	Raw    string
}

func (r statusResult) runtime(t *testing.T) activation.RuntimeReport {
	t.Helper()
	rt, ok := r.Report.Runtime(activation.RuntimeContainerd)
	if !ok {
		t.Fatalf("no containerd verdict in:\n%s", r.Raw)
	}
	return rt
}

func (r statusResult) row(name string) (activation.Check, bool) {
	for _, c := range r.Report.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return activation.Check{}, false
}

// runStatus runs the status command against a test containerd (real /proc, host root /).
func runStatus(t *testing.T, c *runtimetest.Containerd, extra ...string) statusResult {
	t.Helper()
	args := append([]string{"status", "--runtime", "containerd", "--containerd-config", c.ConfigFile(),
		"--containerd-socket", c.Socket(), "--output", "json"}, extra...)
	out := servetest.Run(t, args...)
	res := statusResult{Exit: out.Exit, Raw: string(out.Stdout)}
	if err := json.Unmarshal(out.Stdout, &res.Report); err != nil {
		t.Fatalf("status output is not the JSON report: %v\nstdout:\n%s\nstderr:\n%s", err, out.Stdout, out.Stderr)
	}
	if res.Exit != res.Report.State.ExitCode() {
		t.Fatalf("exit %d does not match state %s\n%s", res.Exit, res.Report.State, res.Raw)
	}
	return res
}

// pendingAny: the config file may have been written in the daemon's start second, which counts
// as "changed after start" (whole seconds, strictly), so pending may be either.
const pendingAny = -1

func expectState(t *testing.T, step string, r statusResult, state activation.State, pendingWant int) {
	t.Helper()
	rt := r.runtime(t)
	pending := rt.Pending
	if pendingWant != pendingAny {
		pending = pendingWant == 1
	}
	if r.Report.State != state || r.Exit != state.ExitCode() || rt.Pending != pending {
		t.Fatalf("%s: state %s exit %d pending %v; want %s exit %d pending %v\n%s", step, r.Report.State, r.Exit, rt.Pending, state, state.ExitCode(), pending, r.Raw)
	}
	if pending && len(r.Report.Warnings) == 0 {
		t.Fatalf("%s: pending without a warning\n%s", step, r.Raw)
	}
	t.Logf("%s: %s (%s)", step, r.Report.State, r.Report.Reason)
}

// expectTraffic fails the test unless status' traffic row passes.
func expectTraffic(t *testing.T, r statusResult) {
	t.Helper()
	if row, _ := r.row("traffic"); row.Result != activation.Pass {
		t.Fatalf("traffic row %+v\n%s", row, r.Raw)
	}
}

// statusAfterPull pulls team/app:v1 through c's CRI and runs status --mirror with nc: ACTIVE,
// pending as pendingWant says, with the traffic row passing.
func statusAfterPull(t *testing.T, c *runtimetest.Containerd, nc *nodecachetest.Nodecache, step string, pendingWant int) statusResult {
	t.Helper()
	if err := criPull(t, c, nc.UpstreamHost+"/team/app:v1"); err != nil {
		t.Fatalf("CRI pull: %v", err)
	}
	r := runStatus(t, c, "--mirror", nc.URL)
	expectState(t, step, r, activation.Active, pendingWant)
	expectTraffic(t, r)
	return r
}

// genOptions are gen containerd's options for the running c: mirror at mirrorURL for upstream,
// hosts.toml files under certs.
func genOptions(t *testing.T, c *runtimetest.Containerd, mirrorURL, upstream, certs string) bcontainerd.Options {
	t.Helper()
	bm := bootstraptest.Mirror(t, mirrorURL)
	v, err := bootstrap.ParseVersion(c.Version())
	if err != nil {
		t.Fatal(err)
	}
	return bcontainerd.Options{Mirror: bm, Upstreams: []string{upstream}, Config: c.ConfigFile(), CertsDir: certs, Daemon: bcontainerd.Release(v)}
}

// genContainerd runs the gen engineer's containerd plan and applier on the test daemon's files.
func genContainerd(t *testing.T, c *runtimetest.Containerd, mirrorURL, upstream, certs string) {
	t.Helper()
	plan, err := bcontainerd.Plan(os.DirFS("/"), genOptions(t, c, mirrorURL, upstream, certs))
	if err != nil {
		t.Fatalf("gen containerd: %v", err)
	}
	if err := (bootstrap.Applier{Root: "/"}).Apply(t.Context(), plan.Changes); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if !plan.RestartRequired {
		t.Fatalf("gen did not change config_path (action %s)", plan.ConfigPathAction)
	}
}

// afterTwoSeconds sleeps past the next whole second but one: start times and mtimes are compared
// in whole seconds, strictly, and /proc/stat's btime is truncated, so a computed start time can
// read up to a second early.
func afterTwoSeconds() {
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(2*time.Second + 50*time.Millisecond).Sub(now))
}

// TestStatusRealContainerd walks each containerd generation through the life of a node: no
// config_path, gen without restart, restart, a CRI pull seen by --mirror, then config.toml touched.
func TestStatusRealContainerd(t *testing.T) {
	t.Parallel()
	eachContainerd(t, func(t *testing.T, bin string) {
		nc, c, certs := appNodecacheAndContainerd(t, bin)
		host := nc.UpstreamHost

		// 1. No config_path: 2.x reads its default two-directory list (ignored in transfer
		// mode), 1.7 reads no hosts.toml at all.
		expectState(t, "no config_path", runStatus(t, c, "--mirror", nc.URL), activation.NotActive, pendingAny)

		// 2. gen without restart: the files are right, the running daemon is not.
		genContainerd(t, c, nc.URL, host, certs)
		r := runStatus(t, c, "--mirror", nc.URL)
		rt := r.runtime(t)
		if r.Report.State != activation.NotActive || !strings.Contains(rt.Remedy, "restart containerd or cycle the node") {
			t.Fatalf("after gen without restart: %s, remedy %q\n%s", r.Report.State, rt.Remedy, r.Raw)
		}
		t.Logf("after gen, no restart: %s (%s)", r.Report.State, r.Report.Reason)
		// The canary cannot pass yet: the daemon dials the upstream, which has no canary.
		r = runStatus(t, c, "--mirror", nc.URL, "--canary")
		if row, _ := r.row("canary"); r.Report.State != activation.NotActive || row.Result != activation.Fail {
			t.Fatalf("--canary before restart: %s, canary row %+v\n%s", r.Report.State, row, r.Raw)
		} else {
			t.Logf("--canary before restart: %s", row.Reason)
		}

		// 3. Restart: active.
		afterTwoSeconds()
		c.Restart(t)
		r = runStatus(t, c, "--mirror", nc.URL)
		expectState(t, "after restart", r, activation.Active, 0)
		want := map[int]string{2: "introspection", 1: "cri-status"}[c.Major()]
		if c.Major() == 2 && !strings.HasPrefix(c.Version(), "2.4") {
			want = "start-time"
		}
		if got := r.runtime(t).Evidence; got != want {
			t.Fatalf("evidence %q, want %q\n%s", got, want, r.Raw)
		}

		// 4. A CRI pull goes through the mirror, and --mirror sees it.
		if err := criPull(t, c, host+"/team/app:v1"); err != nil {
			t.Fatalf("CRI pull: %v", err)
		}
		checkAccessLog(t, nc.Requests(t), c.UserAgent(), host)
		r = runStatus(t, c, "--mirror", nc.URL)
		expectTraffic(t, r)
		expectState(t, "after a CRI pull", r, activation.Active, 0)

		// 5. --canary: a fresh tag of the repository only the mirror serves is pulled through
		// the CRI socket, seen by the mirror, and removed again.
		checkCanary(t, c, nc)

		// 6. config.toml touched after the start.
		now := time.Now()
		if err := os.Chtimes(c.ConfigFile(), now, now); err != nil {
			t.Fatal(err)
		}
		if c.Major() == 2 && !strings.HasPrefix(c.Version(), "2.4") {
			// 2.0–2.3 export nothing: the start time is all there is (no --mirror here: the
			// traffic seen above would prove it active).
			expectState(t, "touched (2.3)", runStatus(t, c), activation.NotActive, 1)
		} else {
			expectState(t, "touched", runStatus(t, c, "--mirror", nc.URL), activation.Active, 1)
		}

		// 7. newuser2 item 17: a --containerd-socket no daemon serves is named as the one
		// given, never answered with "pass --containerd-socket".
		wrong := filepath.Join(t.TempDir(), "nosock")
		r = runStatus(t, c, "--containerd-socket", wrong)
		if !strings.Contains(r.Raw, "serves "+wrong+" (--containerd-socket): give the socket of the containerd that serves the kubelet") || strings.Contains(r.Raw, "pass --containerd-socket") {
			t.Fatalf("--containerd-socket %s: %s\n%s", wrong, r.Report.State, r.Raw)
		}
	})
}

// TestStatusRealContainerdList: containerd 2.4 with config_path "<dir>:/etc/docker/certs.d" pulls
// through the transfer service, which reads the list as one directory: NOT active, although the
// first directory holds a correct hosts.toml.
func TestStatusRealContainerdList(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)
	certs := t.TempDir()
	nc := managedNodecache(t, certs, name.HostDir)
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs + ":/etc/docker/certs.d"})
	r := runStatus(t, c, "--mirror", nc.URL)
	expectState(t, "list config_path", r, activation.NotActive, pendingAny)
	if row, _ := r.row("config_path"); row.Result != activation.Fail || !strings.Contains(row.Reason, "is a list") {
		t.Fatalf("config_path row %+v\n%s", row, r.Raw)
	}
}

// checkCanary runs `status --canary --mirror` on a daemon whose configuration is active: exit 0,
// the canary row passes, the mirror logged the canary pull from the daemon, and the daemon's
// image store holds no canary image afterwards.
func checkCanary(t *testing.T, c *runtimetest.Containerd, nc *nodecachetest.Nodecache) {
	t.Helper()
	r := runStatus(t, c, "--mirror", nc.URL, "--canary")
	expectState(t, "--canary", r, activation.Active, 0)
	row, ok := r.row("canary")
	if !ok || row.Result != activation.Pass {
		t.Fatalf("canary row %+v (present %v)\n%s", row, ok, r.Raw)
	}
	if cleanup, ok := r.row("canary-cleanup"); ok {
		t.Fatalf("canary image not removed: %+v\n%s", cleanup, r.Raw)
	}
	var canaryReqs int
	for _, l := range nc.Requests(t) {
		if l.Repository == mirrorapi.CanaryRepository {
			canaryReqs++
			if l.UserAgent != c.UserAgent() || l.Status >= 400 {
				t.Errorf("canary request %s %s from %q answered %d, want %s and < 400", l.Method, l.Path, l.UserAgent, l.Status, c.UserAgent())
			}
		}
	}
	if canaryReqs == 0 {
		t.Fatalf("the mirror logged no request for %s", mirrorapi.CanaryRepository)
	}
	is, err := c.ImageService()
	if err != nil {
		t.Fatal(err)
	}
	list, err := is.ListImages(t.Context(), &runtimeapi.ListImagesRequest{})
	if err != nil {
		t.Fatalf("CRI ListImages: %v", err)
	}
	for _, img := range list.GetImages() {
		for _, name := range append(img.GetRepoTags(), img.GetRepoDigests()...) {
			if strings.Contains(name, mirrorapi.CanaryRepository) {
				t.Fatalf("canary image %s (%s) still in the daemon's image store", name, img.GetId())
			}
		}
	}
	t.Logf("--canary: %s", row.Reason)
}

// TestStatusSameSecondRealContainerd23: containerd 2.3 exports nothing about its registry
// configuration, so the start time decides; a config.toml whose mtime falls in the second the
// daemon started cannot be ordered against it (whole seconds, strictly: NOT active). The answer
// says so and what settles it, and a CRI pull the mirror sees from this node settles it: ACTIVE
// with --mirror, without restarting containerd.
func TestStatusSameSecondRealContainerd23(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd23)

	nc := startAppNodecache(t, 4096, 2)
	c := runtimetest.NewContainerd(t, bin, runtimetest.ContainerdConfig{})
	genContainerd(t, c, nc.URL, nc.UpstreamHost, filepath.Join(c.Dir(), "certs.d"))
	c.Start(t)
	rt := runStatus(t, c).runtime(t)
	if rt.ProcessStart == nil || rt.PID != c.PID() {
		t.Fatalf("daemon not identified: %+v", rt)
	}
	// The config written at the daemon's start tick: within 10 ms, the order cannot be told.
	tie := *rt.ProcessStart
	if err := os.Chtimes(c.ConfigFile(), tie, tie); err != nil {
		t.Fatal(err)
	}

	r := runStatus(t, c)
	expectState(t, "same second", r, activation.NotActive, 1)
	for _, s := range []string{"within 10ms of the last change", "cannot tell which came first",
		"restart containerd again", "let a pull prove it: nodecache status --mirror " + nc.URL} {
		if !strings.Contains(r.Report.Reason, s) {
			t.Fatalf("reason does not say %q\n%s", s, r.Raw)
		}
	}
	if rt := r.runtime(t); !strings.Contains(rt.Remedy, "restart containerd or cycle the node") || !strings.Contains(rt.Remedy, "--mirror "+nc.URL) {
		t.Fatalf("remedy %q", rt.Remedy)
	}
	// --mirror before any pull: no traffic, still NOT active.
	r = runStatus(t, c, "--mirror", nc.URL)
	expectState(t, "same second, no pull yet", r, activation.NotActive, 1)

	r = statusAfterPull(t, c, nc, "same second, after a CRI pull", 1)
	if rt := r.runtime(t); rt.PID != c.PID() {
		t.Fatalf("containerd was restarted: pid %d, was %d", rt.PID, c.PID())
	}
}

// TestStatusRefusalsProcess: the binary's exit codes for a --host-root that is not a directory
// (2) and for --runtime talos on a host that is not Talos (3, not applicable).
func TestStatusRefusalsProcess(t *testing.T) {
	t.Parallel()
	notTalos := bootstraptest.HostRoot(t, map[string]string{"/etc/os-release": "ID=debian\n"})
	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"host root missing", []string{"status", "--host-root", filepath.Join(notTalos, "nonexistent")}, 2, "does not exist"},
		{"agent host root missing", []string{"agent", "--host-root", filepath.Join(notTalos, "nonexistent")}, 2, "does not exist"},
		{"agent interval zero", []string{"agent", "--host-root", notTalos, "--interval", "0"}, 2, "--interval 0s"},
		{"talos asked for, not Talos", []string{"status", "--runtime", "talos", "--host-root", notTalos}, 3, "no Talos found under --host-root " + notTalos + ": /etc/os-release says ID=debian"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := servetest.Run(t, tc.args...)
			if out := string(r.Stdout) + string(r.Stderr); r.Exit != tc.code || !strings.Contains(out, tc.says) {
				t.Fatalf("exit %d, want %d saying %q; output:\n%s", r.Exit, tc.code, tc.says, out)
			}
		})
	}
}
