package activation

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// TestMonitorWarnsNoRuntime (newuser F12): an agent that finds no container runtime under its
// host root logs one warning saying what it looked at (each runtime's reason, the host and proc
// roots) and that /readyz stays 503, instead of nothing; not again at every interval, and again
// after a runtime came and went.
func TestMonitorWarnsNoRuntime(t *testing.T) {
	t.Parallel()
	n := newTestNode(t)
	var logs syncBuffer
	m, err := NewMonitor(MonitorOptions{Evaluate: n.opts(), Readiness: ReadinessActivation,
		Serving: func(context.Context) error { return nil }, Logger: zerolog.New(&logs)})
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
	if err := os.Remove(filepath.Join(n.Root, cfgFile)); err != nil {
		t.Fatal(err)
	}
	m.Check(t.Context())
	if w := warnings(); len(w) != 2 {
		t.Fatalf("%d no-runtime warnings after the runtime went again, want 2:\n%s", len(w), logs.String())
	}
}
