package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/name"
)

// genReport is what the matrix reads of `nodecache gen containerd --output json`.
type genReport struct {
	RestartRequired bool   `json:"restart_required"`
	RestartReason   string `json:"restart_reason"`
	Daemon          string `json:"containerd_version"`
	DaemonAssumed   bool   `json:"containerd_version_assumed"`
	ConfigPath      string `json:"config_path"`
}

// TestStatusMatrixRealContainerd walks each containerd generation (2.4, 2.3, 1.7) through the
// cases where status used to be wrong in either direction (issue 10):
//  1. gen, then a restart right away: ACTIVE (start times are exact to 10 ms, not whole seconds);
//     gen read the version from the running daemon, not assumed;
//  2. config.toml written 50 ms before the daemon starts: ACTIVE, and gen reports no restart;
//  3. the config changed at the daemon's start tick (cannot be ordered): 2.3 NOT ACTIVE, and
//     only /v2/ pings and errors from the runtime's user agent do not count as traffic;
//  4. a CRI pull through the mirror: ACTIVE, the traffic row passes;
//  5. the mirror stopped: NOT ACTIVE, exit 1, saying so.
//
// Each step also checks gen's and status' answers agree on the restart rule.
func TestStatusMatrixRealContainerd(t *testing.T) {
	t.Parallel()
	eachContainerd(t, func(t *testing.T, bin string) {
		nc, c, certs := appNodecacheAndContainerd(t, bin)
		host := nc.UpstreamHost
		genArgs := []string{"gen", "containerd", "--mirror", nc.URL, "--upstream", host,
			"--containerd-config", c.ConfigFile(), "--certs-dir", certs, "--output", "json"}
		is23 := c.Major() == 2 && strings.HasPrefix(c.Version(), "2.3")

		// 1. gen, then restart at once.
		var rep genReport
		runNodecacheJSON(t, genArgs, &rep)
		genDone := time.Now()
		if !rep.RestartRequired || rep.ConfigPath != certs {
			t.Fatalf("gen: %+v, want restart_required and config_path %s", rep, certs)
		}
		if rep.DaemonAssumed || !strings.HasPrefix(strings.TrimPrefix(rep.Daemon, "v"), strings.SplitN(c.Version(), "+", 2)[0]) {
			t.Fatalf("gen: containerd %q (assumed %v), want the running %s from its version service", rep.Daemon, rep.DaemonAssumed, c.Version())
		}
		// Restart 30 ms after the write at the earliest: closer than 10 ms (plus the 10 ms tick
		// the start time is truncated to) cannot be ordered by design, and an idle machine
		// restarts containerd that fast. On a loaded machine the stop and start can take
		// seconds: then the write is repeated (the file's mtime set to now, as a second gen
		// would) and the restart tried again, up to three times, since a gap over a second is
		// not the case this step is about.
		var r statusResult
		for attempt := 1; ; attempt++ {
			st, err := os.Stat(c.ConfigFile())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Until(st.ModTime().Add(30 * time.Millisecond)))
			c.Restart(t)
			r = runStatus(t, c, "--mirror", nc.URL)
			expectState(t, "gen then restart", r, activation.Active, 0)
			gap := r.runtime(t).ProcessStart.Sub(st.ModTime())
			t.Logf("gen then restart (attempt %d): restart issued %s after gen; daemon started %s after config.toml changed",
				attempt, c.Started().Sub(genDone).Round(time.Millisecond), gap.Round(time.Millisecond))
			if gap <= time.Second {
				break
			}
			if attempt == 3 {
				t.Fatalf("the daemon started %s after the write on each of 3 tries: not the sub-second case this step is about", gap)
			}
			now := time.Now()
			if err := os.Chtimes(c.ConfigFile(), now, now); err != nil {
				t.Fatal(err)
			}
			genDone = now
		}

		// 2. config.toml written 50 ms before the daemon starts.
		c.Stop()
		now := time.Now()
		if err := os.Chtimes(c.ConfigFile(), now, now); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		c.Start(t)
		r = runStatus(t, c, "--mirror", nc.URL)
		expectState(t, "config 50ms before start", r, activation.Active, 0)
		runNodecacheJSON(t, genArgs, &rep)
		if rep.RestartRequired || rep.RestartReason != "" {
			t.Fatalf("gen after a config written 50 ms before the start: %+v, want no restart", rep)
		}

		// 3. The config changed at the daemon's start tick: the order cannot be told.
		start := *r.runtime(t).ProcessStart
		if err := os.Chtimes(c.ConfigFile(), start, start); err != nil {
			t.Fatal(err)
		}
		runNodecacheJSON(t, genArgs, &rep)
		if !rep.RestartRequired || !strings.Contains(rep.RestartReason, "cannot tell which came first") {
			t.Fatalf("gen with config.toml at the start tick: %+v, want restart_required (cannot tell)", rep)
		}
		for _, p := range []struct{ method, path string }{
			{http.MethodGet, "/v2/"},
			{http.MethodGet, "/v2/team/app/manifests/missing?ns=" + host},
			{http.MethodPut, "/v2/team/app/manifests/v1?ns=" + host},
		} {
			runtimeRequest(t, p.method, nc.URL+p.path, c.UserAgent())
		}
		r = runStatus(t, c, "--mirror", nc.URL)
		if row, _ := r.row("traffic"); row.Result == activation.Pass {
			t.Fatalf("pings and errors counted as traffic: %+v\n%s", row, r.Raw)
		}
		if is23 {
			expectState(t, "config at the start tick (2.3)", r, activation.NotActive, 1)
			if !strings.Contains(r.Report.Reason, "cannot tell which came first") {
				t.Fatalf("reason %q", r.Report.Reason)
			}
		} else {
			// 2.4 and 1.7 say what they loaded: the verdict stays, the change is pending.
			expectState(t, "config at the start tick", r, activation.Active, 1)
		}

		// 4. A CRI pull through the mirror.
		statusAfterPull(t, c, nc, "after a CRI pull", 1)

		// 5. The mirror stopped.
		nc.Close()
		r = runStatus(t, c, "--mirror", nc.URL)
		expectState(t, "mirror stopped", r, activation.NotActive, 1)
		if !strings.Contains(r.Report.Reason, "does not answer") {
			t.Fatalf("reason %q does not say the mirror does not answer", r.Report.Reason)
		}
	})
}

// TestStatusCRIPluginFailedRealContainerd17: containerd 1.7 with inline registry.mirrors next to
// config_path starts, but its CRI plugin does not load; introspection's plugin list shows it and
// status says NOT ACTIVE (exit 1) with the plugin's error, whatever the files say.
func TestStatusCRIPluginFailedRealContainerd17(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd17)
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs.d")
	nc := managedNodecache(t, certs, func(host string) string { return host }) // 1.7 reads host:port
	host := nc.UpstreamHost
	c := runtimetest.NewContainerd(t, bin, runtimetest.ContainerdConfig{Dir: dir, ConfigPath: certs,
		AppendTOML: fmt.Sprintf("\n[plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"%s\"]\n  endpoint = [\"%s\"]\n", host, nc.URL)})
	c.StartWithoutCRI(t)
	r := runStatus(t, c, "--mirror", nc.URL)
	expectState(t, "1.7 inline mirrors next to config_path", r, activation.NotActive, 0)
	row, _ := r.row("cri-plugin")
	if row.Result != activation.Fail || !strings.Contains(row.Reason, "io.containerd.grpc.v1.cri") {
		t.Fatalf("cri-plugin row %+v\n%s", row, r.Raw)
	}
}

// runtimeRequest sends one request to the mirror with the runtime's user agent.
func runtimeRequest(t *testing.T, method, url, ua string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", ua)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 400 && method != http.MethodGet {
		t.Fatalf("%s %s answered %d, want an error", method, url, resp.StatusCode)
	}
}

// shortTempDir is a temporary directory with a short path (unix socket paths are limited to
// 108 bytes), removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "nc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// TestStatusPermissionDeniedRealContainerd: status run as an unprivileged user next to a real
// containerd 2.4 whose socket only root may open: the runtime API refuses it, so the answer is
// UNKNOWN (exit 3) saying permission denied — never ACTIVE on files and start time alone.
func TestStatusPermissionDeniedRealContainerd(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)
	dir := shortTempDir(t)
	certs := filepath.Join(dir, "certs.d")
	host := managedNodecache(t, certs, name.HostDir).UpstreamHost
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{Dir: dir, ConfigPath: certs})
	// Everything readable by others except the socket (containerd makes it 0660 root:root).
	for _, p := range []string{dir, certs, filepath.Join(certs, name.HostDir(host))} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(c.ConfigFile(), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runStatus(t, c); r.Report.State != activation.Active {
		t.Fatalf("as root: %s, want active (the setup is right)\n%s", r.Report.State, r.Raw)
	}
	// The test binary's own directory is root's; nobody runs a copy.
	ncBin := filepath.Join(dir, "nodecache")
	b, err := os.ReadFile(servetest.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ncBin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), ncBin, "status", "--runtime", "containerd",
		"--containerd-config", c.ConfigFile(), "--containerd-socket", c.Socket(), "--output", "json")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("status as nobody: %v, want exit 3\n%s", err, out)
	}
	var rep activation.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("status output: %v\n%s", err, out)
	}
	if rep.State != activation.Unknown || !strings.Contains(rep.Reason, "permission denied") {
		t.Fatalf("status as nobody: %s %q, want unknown saying permission denied", rep.State, rep.Reason)
	}
	t.Logf("as nobody: %s (%s)", rep.State, rep.Reason)
}
