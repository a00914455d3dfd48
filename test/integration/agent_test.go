package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// agentWait bounds each wait for the agent to reach a state (its --interval is 1 s).
const agentWait = 60 * time.Second

// agentProc is a running `nodecache agent` process.
type agentProc struct {
	*servetest.Process
	url  string // http://<--listen>
	murl string // http://<--metrics-listen>
}

// startAgent runs `nodecache agent` next to c, whose files under nodeDir it sees under hostRoot
// (linkHostPath): gen for containerd with certs.d in nodeDir, a mirror in front of upstream
// (upstreamName) on free loopback ports, a pass every second, readiness by activation; extra
// flags follow. The process is stopped when the test ends.
func startAgent(t *testing.T, c *runtimetest.Containerd, hostRoot, nodeDir string, upstream *mirrortest.Registry, extra ...string) *agentProc {
	t.Helper()
	listen, metricsListen := nodecachetest.FreeAddr(t), nodecachetest.FreeAddr(t)
	args := append([]string{"agent",
		"--host-root", hostRoot, "--runtime", "containerd",
		"--containerd-config", c.ConfigFile(), "--containerd-socket", c.Socket(),
		"--certs-dir", filepath.Join(nodeDir, "certs.d"),
		"--listen", listen, "--metrics-listen", metricsListen, "--root", t.TempDir(),
		"--upstream", upstreamName + "=" + upstream.URL.String(),
		"--interval", "1s", "--readiness", "activation"}, extra...)
	return &agentProc{Process: servetest.Start(t, args...), url: "http://" + listen, murl: "http://" + metricsListen}
}

// requests returns the access-log lines of the agent's mirror.
func (a *agentProc) requests(t *testing.T) []nodecachetest.AccessLine {
	t.Helper()
	var out []nodecachetest.AccessLine
	for _, m := range a.Lines() {
		if m["message"] != "request" {
			continue
		}
		b, _ := json.Marshal(m)
		var l nodecachetest.AccessLine
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatalf("access line %s: %v", b, err)
		}
		out = append(out, l)
	}
	return out
}

// get returns the status code and body of GET url within 5 s (0 when the request failed).
func get(ctx context.Context, url string) (int, string) {
	return servetest.Get(ctx, url, 5*time.Second)
}

// waitFor polls cond every 200 ms until it returns "" (met) or agentWait passes, then fails the
// test with cond's last answer. It also fails when the agent exits.
func (a *agentProc) waitFor(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(agentWait)
	for {
		why := cond()
		if why == "" {
			return
		}
		select {
		case <-a.Done():
			t.Fatalf("waiting for %s: the agent exited (%v); last: %s", what, a.Err(), why)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not after %s: %s", what, agentWait, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// gaugeRE finds the activation gauge of containerd in the Prometheus text format.
var gaugeRE = regexp.MustCompile(`(?m)^nodecache_runtime_config_active\{runtime="containerd"\} (\S+)$`)

// activeGauge returns the value of nodecache_runtime_config_active{runtime="containerd"} at url.
func activeGauge(ctx context.Context, url string) (string, error) {
	code, body := get(ctx, url+"/metrics")
	if code != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %d %s", code, body)
	}
	m := gaugeRE.FindStringSubmatch(body)
	if m == nil {
		return "", errors.New("no nodecache_runtime_config_active{runtime=\"containerd\"} in /metrics")
	}
	return m[1], nil
}

// alive fails the test unless pid is a live containerd process.
func alive(t *testing.T, step string, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(b)) != "containerd" {
		t.Fatalf("%s: containerd pid %d is gone (%v %q)", step, pid, err, b)
	}
}

// linkHostPath bind-mounts dir at hostRoot+dir, the way a pod sees the host's dir under its
// --host-root mount: host paths inside dir then mean the same file for the agent (which reads
// them under hostRoot) and for containerd (which reads them as they are). A symbolic link would
// not do: nodecache follows links as the host does (an absolute target restarts at the host
// root), so hostRoot+dir -> dir is a link to itself. Needs root (the caller requires it).
func linkHostPath(t *testing.T, hostRoot, dir string) {
	t.Helper()
	at := filepath.Join(hostRoot, dir)
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dir, at, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount %s at %s: %v", dir, at, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(at, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", at, err)
		}
	})
}

// TestAgentRealContainerd runs `nodecache agent` as a process next to a real containerd 2.4
// whose files it sees under --host-root: its gen pass writes the files, /activez, the readiness
// answer, the ready file and the gauge say NOT active until containerd restarts (which the test
// does, never the agent), then ACTIVE without restarting the agent; a CRI pull then goes through
// the agent's mirror, and --warm filled an image at start.
func TestAgentRealContainerd(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)

	upstream := appUpstream(t, 4096, 2)
	upstream.PushImage(t, "team/warm", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))

	// The node: containerd's files under nodeDir, seen by the agent at the same host path under
	// hostRoot. No config_path yet: containerd 2.4 runs with its default list.
	hostRoot, nodeDir := t.TempDir(), t.TempDir()
	linkHostPath(t, hostRoot, nodeDir)
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{Dir: nodeDir})
	if !strings.HasPrefix(c.Socket(), nodeDir+"/") {
		t.Fatalf("containerd socket %s is outside %s (path too long?)", c.Socket(), nodeDir)
	}
	pid := c.PID()
	readyFile := filepath.Join(t.TempDir(), "ready")
	a := startAgent(t, c, hostRoot, nodeDir, upstream,
		"--ready-file", readyFile, "--warm", upstreamName+"/team/warm:v1")
	ctx := t.Context()

	// 1. Gen pass done, containerd not restarted: NOT active everywhere.
	a.waitFor(t, "the gen pass", func() string {
		for _, l := range a.Lines() {
			if l["message"] == "gen containerd" {
				if l["restart_required"] != true || !strings.Contains(fmt.Sprint(l["remedy"]), "restart containerd or cycle the node") {
					t.Fatalf("gen containerd line %v: want restart_required and the remedy", l)
				}
				return ""
			}
		}
		return "no gen containerd line"
	})
	a.waitFor(t, "a NOT active evaluation", func() string {
		code, body := get(ctx, a.url+"/activez")
		if code == http.StatusServiceUnavailable && strings.HasPrefix(body, "not_active:") {
			return ""
		}
		return fmt.Sprintf("/activez %d %q", code, body)
	})
	code, body := get(ctx, a.url+"/activez")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "config_path on disk is already "+filepath.Join(nodeDir, "certs.d")+": restart containerd or cycle the node") {
		t.Fatalf("/activez before restart: %d %q", code, body)
	}
	for _, u := range []string{a.url, a.murl} {
		if code, body := get(ctx, u+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not active") {
			t.Fatalf("%s/readyz before restart: %d %q, want 503 saying not active", u, code, body)
		}
	}
	if _, err := os.Stat(readyFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ready file before restart: %v, want absent", err)
	}
	if v, err := activeGauge(ctx, a.url); err != nil || v != "0" {
		t.Fatalf("gauge before restart: %q %v, want 0", v, err)
	}
	if !logged(a, "runtime activation changed", "state", "not_active") {
		t.Fatalf("no transition line to not_active")
	}
	t.Logf("before restart: /activez %d %q", code, strings.TrimSpace(body))

	// 2. --warm filled an image at start, named as the warm-up in the mirror's log.
	a.waitFor(t, "the warm-up", func() string {
		if logged(a, "warm finished", "warm", true) {
			return ""
		}
		return "no warm finished line"
	})
	var warmBlobs int
	for _, l := range a.requests(t) {
		if l.Repository == "team/warm" && strings.HasPrefix(l.UserAgent, "nodecache-warm/") && strings.Contains(l.Path, "/blobs/") && l.Status == http.StatusOK {
			warmBlobs++
		}
	}
	if warmBlobs == 0 {
		t.Fatalf("the mirror logged no nodecache-warm blob request for team/warm")
	}

	// The agent never restarts or signals containerd (SIGHUP would end it).
	time.Sleep(2 * time.Second) // a few more reconcile passes
	alive(t, "before restart", pid)
	if c.PID() != pid {
		t.Fatalf("containerd pid %d, want %d", c.PID(), pid)
	}

	// 3. The operator restarts containerd: ACTIVE without restarting the agent.
	agentPID := a.Pid()
	c.Restart(t)
	pid = c.PID()
	a.waitFor(t, "/activez 200", func() string {
		code, body := get(ctx, a.url+"/activez")
		if code == http.StatusOK {
			return ""
		}
		return fmt.Sprintf("/activez %d %q", code, body)
	})
	a.waitFor(t, "the ready file", func() string {
		if _, err := os.Stat(readyFile); err != nil {
			return err.Error()
		}
		return ""
	})
	for _, u := range []string{a.url, a.murl} {
		if code, body := get(ctx, u+"/readyz"); code != http.StatusOK {
			t.Fatalf("%s/readyz after restart: %d %q", u, code, body)
		}
	}
	if v, err := activeGauge(ctx, a.url); err != nil || v != "1" {
		t.Fatalf("gauge after restart: %q %v, want 1", v, err)
	}
	if v, err := activeGauge(ctx, a.murl); err != nil || v != "1" {
		t.Fatalf("gauge on the metrics listener after restart: %q %v, want 1", v, err)
	}
	if !logged(a, "runtime activation changed", "state", "active") {
		t.Fatalf("no transition line to active")
	}
	if a.Pid() != agentPID {
		t.Fatalf("agent restarted")
	}

	// 4. A CRI pull goes through the agent's mirror.
	pctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	if _, err := c.PullImage(pctx, upstreamName+"/team/app:v1"); err != nil {
		t.Fatalf("CRI pull: %v", err)
	}
	var app []nodecachetest.AccessLine
	for _, l := range a.requests(t) {
		if l.Repository == "team/app" {
			app = append(app, l)
		}
	}
	checkAccessLog(t, app, c.UserAgent(), upstreamName)

	// 5. Still the same containerd, alive; the agent stops cleanly and withdraws readiness.
	time.Sleep(2 * time.Second)
	alive(t, "at the end", pid)
	if c.PID() != pid {
		t.Fatalf("containerd pid %d, want %d", c.PID(), pid)
	}
	if n := strings.Count(c.Log(), "=== runtimetest: start #"); n != 2 {
		t.Fatalf("containerd started %d times, want 2 (the test's own start and restart)", n)
	}
	if err := a.Stop(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v", err)
	}
	if _, err := os.Stat(readyFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ready file after the agent stopped: %v, want removed", err)
	}
}

// logged reports whether the agent logged a line with message msg and key == value.
func logged(a *agentProc, msg, key string, value any) bool {
	for _, l := range a.Lines() {
		if l["message"] == msg && l[key] == value {
			return true
		}
	}
	return false
}

// TestAgentMatrixRealContainerd: the agent's /activez and readiness (--readiness activation)
// follow the same steps on 2.4, 2.3 and 1.7: NOT active after its gen pass; ACTIVE once
// containerd is restarted right after it; on 2.3 a config changed at the daemon's start tick is
// NOT active again, a /v2/ ping from containerd's user agent changes nothing, and a CRI pull
// through the agent's mirror makes it ACTIVE (2.4 and 1.7 say what they loaded and stay ACTIVE).
func TestAgentMatrixRealContainerd(t *testing.T) {
	t.Parallel()
	eachContainerd(t, func(t *testing.T, bin string) {
		upstream := appUpstream(t, 4096, 1)

		// Short directories: the socket under the host root must fit a unix socket path.
		hostRoot, nodeDir := shortTempDir(t), shortTempDir(t)
		linkHostPath(t, hostRoot, nodeDir)
		c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{Dir: nodeDir})
		a := startAgent(t, c, hostRoot, nodeDir, upstream)
		ctx := t.Context()
		expect := func(step string, active bool) {
			t.Helper()
			want := http.StatusServiceUnavailable
			if active {
				want = http.StatusOK
			}
			a.waitFor(t, step, func() string {
				for _, u := range []string{a.url + "/activez", a.url + "/readyz", a.murl + "/readyz"} {
					if code, body := get(ctx, u); code != want {
						return fmt.Sprintf("%s %d %q, want %d", u, code, body, want)
					}
				}
				return ""
			})
			t.Logf("%s: /activez and /readyz %d", step, want)
		}

		// 1. The gen pass: NOT active until containerd restarts.
		a.waitFor(t, "the gen pass", func() string {
			if logged(a, "gen containerd", "restart_required", true) {
				return ""
			}
			return "no gen containerd line with restart_required"
		})
		expect("after the gen pass", false)

		// 2. Restart right away: ACTIVE.
		c.Restart(t)
		expect("gen then restart", true)

		// 3. config.toml changed at the daemon's start tick.
		h, err := bootstrap.NewHost(bootstrap.HostOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := h.Process(c.PID())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(c.ConfigFile(), p.Start, p.Start); err != nil {
			t.Fatal(err)
		}
		is23 := c.Major() == 2 && strings.HasPrefix(c.Version(), "2.3")
		expect("config at the start tick", !is23)

		// 4. A ping from containerd's user agent proves nothing.
		runtimeRequest(t, http.MethodGet, a.url+"/v2/", c.UserAgent())
		time.Sleep(3 * time.Second) // three intervals
		expect("after a /v2/ ping", !is23)

		// 5. A CRI pull through the agent's mirror: ACTIVE.
		pctx, cancel := context.WithTimeout(ctx, pullTimeout)
		defer cancel()
		if _, err := c.PullImage(pctx, upstreamName+"/team/app:v1"); err != nil {
			t.Fatalf("CRI pull: %v", err)
		}
		expect("after a CRI pull", true)
	})
}
