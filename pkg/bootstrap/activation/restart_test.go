package activation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// The rule's edges: ambiguous only when start − 10 ms < mtime < start + 10 ms.
func TestStartOrder(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 5, 6, 7, 8, 9, 120_000_000, time.UTC)
	for _, tc := range []struct {
		mtime time.Duration
		want  Order
	}{
		{-time.Hour, Loaded},
		{-StartTolerance - time.Nanosecond, Loaded},
		{-StartTolerance, Loaded},
		{-StartTolerance + time.Nanosecond, Ambiguous},
		{-time.Millisecond, Ambiguous},
		{0, Ambiguous},
		{StartTolerance - time.Nanosecond, Ambiguous},
		{StartTolerance, ChangedAfter},
		{time.Second, ChangedAfter},
	} {
		if got := StartOrder(start, start.Add(tc.mtime)); got != tc.want {
			t.Errorf("StartOrder(start, start%+v) = %s, want %s", tc.mtime, got, tc.want)
		}
	}
}

// ContainerdRestart, what gen's restart_required and status share: the containerd serving the
// config's socket (not another one), the newest of config.toml and its imports, a synthetic
// /proc with an injected boot time (10 ms ticks).
func TestContainerdRestart(t *testing.T) {
	t.Parallel()
	start := time.Unix(t0, 0).Add(250 * time.Millisecond)
	for _, tc := range []struct {
		name       string
		main, conf time.Duration // mtimes of config.toml and an import, relative to the start
		otherOnly  bool          // only a containerd on another socket runs
		want       Order         // 0: no evidence (nil)
		file       string
	}{
		{name: "both before", main: -time.Minute, conf: -50 * time.Millisecond, want: Loaded, file: "/etc/containerd/conf.d/10-x.toml"},
		{name: "config written 50ms before start", main: -50 * time.Millisecond, conf: -time.Hour, want: Loaded, file: cfgFile},
		{name: "import within a tick", main: -time.Minute, conf: 5 * time.Millisecond, want: Ambiguous, file: "/etc/containerd/conf.d/10-x.toml"},
		{name: "config 9ms before start", main: -9 * time.Millisecond, conf: -time.Hour, want: Ambiguous, file: cfgFile},
		{name: "import changed after start", main: -time.Minute, conf: time.Second, want: ChangedAfter, file: "/etc/containerd/conf.d/10-x.toml"},
		{name: "only another containerd", main: time.Minute, conf: time.Minute, otherOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newTestNode(t)
			pid := 1000
			if tc.otherOnly {
				n.Proc.AddProcess(77, "containerd", start, "/bin/containerd")
				n.Proc.listen(77, "/system/run/containerd/containerd.sock", 7077)
			} else {
				n.Proc.AddProcess(pid, "containerd", start, "/usr/bin/containerd")
				n.Proc.listen(pid, sock, 8000)
			}
			n.fileAt(cfgFile, v3Config(certsDir, `imports = ["/etc/containerd/conf.d/*.toml"]`), start.Add(tc.main))
			n.fileAt("/etc/containerd/conf.d/10-x.toml", "version = 3\n", start.Add(tc.conf))
			h := n.Proc.Host(n.Root)
			eff, err := bcontainerd.Load(h.FS(), cfgFile, bcontainerd.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ev, err := ContainerdRestart(h, eff, eff.GRPCAddress)
			if tc.otherOnly {
				if err == nil || !strings.Contains(err.Error(), "serves "+sock) || ev != nil {
					t.Fatalf("ContainerdRestart = %+v, %v; want no evidence and an error naming the socket", ev, err)
				}
				return
			}
			if err != nil || ev == nil {
				t.Fatalf("ContainerdRestart = %+v, %v", ev, err)
			}
			if ev.Order != tc.want || ev.File != tc.file || ev.Daemon.PID != pid || !ev.Daemon.Start.Equal(start) {
				t.Fatalf("evidence %+v (%s), want %s on %s, pid %d started %s", ev, ev.Order, tc.want, tc.file, pid, start)
			}
			if ev.RestartRequired() != (tc.want != Loaded) {
				t.Fatalf("RestartRequired = %v for %s", ev.RestartRequired(), ev.Order)
			}
		})
	}
}

// One view of the host: with /etc/containerd/certs.d an absolute symbolic link under the host
// root, gen writes the hosts.toml files where the link leads under the host root, and status
// reads and names the same files (an os.* read of <host-root>/etc/containerd/certs.d would
// follow the link on this machine's own /).
func TestHostViewAbsoluteLink(t *testing.T) {
	t.Parallel()
	n := newContainerdNode(t, &fakeContainerd{version: "v2.4.2", exports: map[string]string{exportConfigPath: certsDir}}, time.Now().Unix()-5, v3Config(certsDir, ""), time.Now().Unix()-60)
	target := "/srv/node-certs-" + filepath.Base(n.Root) // absent on this machine's own /
	if err := os.MkdirAll(filepath.Join(n.Root, target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(n.Root, certsDir)); err != nil {
		t.Fatal(err)
	}
	h := n.Proc.Host(n.Root)
	m := bootstraptest.Mirror(t, mirrorURL)
	plan, err := bcontainerd.Plan(h.FS(), bcontainerd.Options{Mirror: m, Upstreams: []string{"docker.io"}, Daemon: bcontainerd.Release{Major: 2, Minor: 4, Patch: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Applier(zerolog.Nop()).Apply(t.Context(), plan.Changes); err != nil {
		t.Fatal(err)
	}
	var written []string
	for _, c := range plan.Changes {
		if strings.HasSuffix(c.Path, "/hosts.toml") {
			written = append(written, c.Path)
		}
	}
	wantFile := target + "/docker.io/hosts.toml"
	if len(written) != 1 || written[0] != wantFile {
		t.Fatalf("gen wrote %q, want %s", written, wantFile)
	}
	o := n.opts()
	o.Runtime = RuntimeContainerd
	r := n.evaluate(o)
	want(t, r, Active, 0, "")
	c, _ := check(r, RuntimeContainerd, "hosts docker.io")
	if c.Result != Pass || !strings.HasPrefix(c.Reason, wantFile+":") {
		t.Fatalf("status hosts row %+v, want it to name %s\n%s", c, wantFile, dump(r))
	}
}
