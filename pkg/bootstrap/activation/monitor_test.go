package activation

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// The agent's loop: containerd restarted after the agent wrote its configuration turns the
// node ACTIVE without restarting the agent; /activez, readiness, the ready file, the gauge and
// the transition log follow.
func TestMonitor(t *testing.T) {
	t.Parallel()
	n := newContainerd23Node(t, t0, t0+100)

	reg := prometheus.NewRegistry()
	var logs mirrortest.LogBuffer
	readyFile := filepath.Join(t.TempDir(), "ready")
	m, err := NewMonitor(MonitorOptions{
		Evaluate:   n.opts(),
		Readiness:  ReadinessActivation,
		Serving:    func(context.Context) error { return nil },
		ReadyFile:  readyFile,
		Registerer: reg,
		Logger:     zerolog.New(&logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	mirror := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("mirror")) })
	srv := httptest.NewServer(m.Handler(mirror))
	t.Cleanup(srv.Close)
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "nodecache_runtime_config_active" {
				continue
			}
			for _, mt := range mf.GetMetric() {
				if mt.GetLabel()[0].GetValue() == RuntimeContainerd {
					return mt.GetGauge().GetValue()
				}
			}
		}
		t.Fatal("gauge nodecache_runtime_config_active{runtime=containerd} not exported")
		return 0
	}

	if code, _ := get(ActivezPath); code != http.StatusServiceUnavailable {
		t.Fatalf("/activez before any evaluation: %d", code)
	}
	m.Check(t.Context())
	code, body := get(ActivezPath)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "restart containerd or cycle the node") {
		t.Fatalf("/activez = %d %q", code, body)
	}
	if code, _ := get(ReadyzPath); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz (activation) while not active = %d", code)
	}
	if _, err := os.Stat(readyFile); !os.IsNotExist(err) {
		t.Fatalf("ready file while not active: %v", err)
	}
	if g := gauge(); g != 0 {
		t.Fatalf("gauge %v", g)
	}
	if code, body := get("/v2/"); code != 200 || body != "mirror" {
		t.Fatalf("other paths must reach the mirror: %d %q", code, body)
	}
	// A second identical evaluation logs nothing new.
	m.Check(t.Context())
	if c := strings.Count(logs.String(), "runtime activation changed"); c != 1 {
		t.Fatalf("%d transition lines, want 1:\n%s", c, logs.String())
	}
	if !strings.Contains(logs.String(), `"remedy":"restart containerd or cycle the node`) {
		t.Fatalf("transition without remedy:\n%s", logs.String())
	}

	// containerd restarts (a new pid, a later start); the agent is not restarted.
	if err := os.RemoveAll(filepath.Join(n.Proc.Root, "1000")); err != nil {
		t.Fatal(err)
	}
	n.containerdProc(1300, t0+300, sock)
	m.Check(t.Context())
	if code, body := get(ActivezPath); code != http.StatusOK || !strings.HasPrefix(body, "active:") {
		t.Fatalf("/activez after restart = %d %q", code, body)
	}
	if code, _ := get(ReadyzPath); code != http.StatusOK {
		t.Fatalf("/readyz after restart = %d", code)
	}
	if _, err := os.Stat(readyFile); err != nil {
		t.Fatalf("ready file after activation: %v", err)
	}
	if g := gauge(); g != 1 {
		t.Fatalf("gauge %v", g)
	}
	if !strings.Contains(logs.String(), `"previous":"not_active"`) {
		t.Fatalf("no transition to active logged:\n%s", logs.String())
	}

	// Serving readiness ignores activation.
	m2, err := NewMonitor(MonitorOptions{Evaluate: n.opts(), Serving: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	n.touch(cfgFile, t0+400)
	if rep := m2.Check(t.Context()); rep.State != NotActive || !m2.Ready() {
		t.Fatalf("serving readiness: state %s ready %v", rep.State, m2.Ready())
	}
	if _, err := NewMonitor(MonitorOptions{Readiness: "maybe", Serving: func(context.Context) error { return nil }}); err == nil {
		t.Fatal("readiness maybe accepted")
	}
}

// The agent on containerd 2.0–2.3 whose config was written within one tick of the daemon's
// start: the rule says NOT active (with a reason that says what settles it); a /v2/ ping does
// not change that, and a manifest the mirror serves to this node turns it ACTIVE at the next
// interval, without a containerd or agent restart.
func TestMonitorSameSecondSettledByTraffic(t *testing.T) {
	t.Parallel()
	msrv := startAppMirror(t)

	started := time.Now().Unix() - 60
	n := newContainerd23Node(t, started, started)
	o := n.opts()
	o.Mirror = parseMirror(t, msrv.URL)

	var logs mirrortest.LogBuffer
	m, err := NewMonitor(MonitorOptions{
		Evaluate:  o,
		Interval:  100 * time.Millisecond,
		Readiness: ReadinessActivation,
		Serving:   func(context.Context) error { return nil },
		Logger:    zerolog.New(&logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	waitState := func(state State) *Report {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if rep := m.Last(); rep != nil && rep.State == state {
				return rep
			}
			if time.Now().After(deadline) {
				rep := m.Last()
				if rep == nil {
					t.Fatalf("no evaluation within 10s, want %s", state)
				}
				t.Fatalf("state %s after 10s, want %s\n%s", rep.State, state, dump(rep))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	rep := waitState(NotActive)
	for _, s := range []string{"within 10ms of the last change", "restart containerd again", "nodecache status --mirror " + msrv.URL} {
		if !strings.Contains(rep.Reason, s) {
			t.Fatalf("reason does not say %q\n%s", s, dump(rep))
		}
	}
	if m.Ready() {
		t.Fatal("ready (activation) while NOT active")
	}

	// containerd pings the mirror: no proof; then pulls a manifest through it (its user agent,
	// from this node's loopback).
	for _, p := range []string{"/v2/", "/v2/team/app/manifests/v1?ns=registry.test"} {
		clientRequest(t, http.MethodGet, msrv.URL+p, "containerd/v2.3.1")
		if p == "/v2/" {
			time.Sleep(300 * time.Millisecond) // three intervals
			if rep := m.Last(); rep == nil || rep.State != NotActive {
				t.Fatalf("after a /v2/ ping: %v, want still NOT active", rep)
			}
		}
	}

	rep = waitState(Active)
	if !strings.Contains(rep.Reason, "the mirror served containerd manifests or blobs to this node") {
		t.Fatalf("active for another reason\n%s", dump(rep))
	}
	if c, _ := check(rep, RuntimeContainerd, "traffic"); c.Result != Pass {
		t.Fatalf("traffic row %+v", c)
	}
	if rt, _ := rep.Runtime(RuntimeContainerd); rt.PID != 1000 {
		t.Fatalf("another daemon examined: %+v", rt)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !m.Ready() || !strings.Contains(logs.String(), `"previous":"not_active"`) {
		if time.Now().After(deadline) {
			t.Fatalf("ready %v; log:\n%s", m.Ready(), logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
