package activation

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// TestMonitorWarnsNoRuntime (newuser F12): an agent that finds no container runtime under its
// host root logs one warning saying what it looked at (each runtime's reason, the host and proc
// roots) and that /readyz stays 503, instead of nothing; not again at every interval, and again
// after a runtime came and went.
func TestMonitorWarnsNoRuntime(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	var logs mirrortest.LogBuffer
	reg := prometheus.NewRegistry()
	m, err := NewMonitor(MonitorOptions{Evaluate: n.opts(), Readiness: ReadinessActivation,
		Serving: func(context.Context) error { return nil }, Logger: zerolog.New(&logs), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	warnings := func() []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var e map[string]any
			if json.Unmarshal([]byte(line), &e) == nil && e["message"] == "no container runtime found on this node" {
				out = append(out, e)
			}
		}
		return out
	}

	for range 2 {
		if rep := m.Check(t.Context()); rep.State != NotApplicable || m.Ready() {
			t.Fatalf("empty node: state %s, ready %v", rep.State, m.Ready())
		}
	}
	if got := gaugeSeries(t, reg); got != `none=0` {
		t.Fatalf("gauge series with no runtime: %q, want none=0 (an alert on == 0 must fire)", got)
	}
	w := warnings()
	if len(w) != 1 {
		t.Fatalf("%d no-runtime warnings after two checks, want 1:\n%s", len(w), logs.String())
	}
	line, _ := json.Marshal(w[0])
	for _, want := range []string{`"level":"warn"`, `"host_root":"` + n.Root + `"`, "containerd: no containerd process",
		"crio: no crio process", "/readyz stays 503", "--host-root"} {
		if !strings.Contains(string(line), want) {
			t.Errorf("warning lacks %s: %s", want, line)
		}
	}

	n.file(cfgFile, v3Config(certsDir, ""), t0+100) // a runtime appears (config, no process yet)
	if rep := m.Check(t.Context()); rep.State == NotApplicable {
		t.Fatalf("with %s: still not_applicable", cfgFile)
	}
	if got := gaugeSeries(t, reg); got != `containerd=0` {
		t.Fatalf("gauge series with containerd configured, not running: %q, want containerd=0 only", got)
	}
	if err := os.Remove(filepath.Join(n.Root, cfgFile)); err != nil {
		t.Fatal(err)
	}
	m.Check(t.Context())
	if w := warnings(); len(w) != 2 {
		t.Fatalf("%d no-runtime warnings after the runtime went again, want 2:\n%s", len(w), logs.String())
	}
	if got := gaugeSeries(t, reg); got != `none=0` {
		t.Fatalf("gauge series after the runtime went: %q, want none=0", got)
	}
}

// gaugeSeries is nodecache_runtime_config_active in reg as "runtime=value" pairs, sorted and
// space-separated.
func gaugeSeries(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "nodecache_runtime_config_active" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			out = append(out, fmt.Sprintf("%s=%g", mt.GetLabel()[0].GetValue(), mt.GetGauge().GetValue()))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}
