package activation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// The agent's reconcile loop: it only reads. Every Interval it evaluates activation, publishes
// the answer on /activez, in the gauge nodecache_runtime_config_active{runtime}, in the readiness
// answer (and its --ready-file copy), and logs only transitions, with the remedy.

// Readiness modes (docs/contracts.md, "Readiness and activation").
const (
	// ReadinessServing: /readyz says whether the mirror can serve.
	ReadinessServing = "serving"
	// ReadinessActivation: /readyz also requires the runtime configuration to be ACTIVE, so a
	// DaemonSet's ready count reports bypassing nodes and rolling updates wait for activation.
	ReadinessActivation = "activation"
)

// DefaultInterval is the agent's default re-evaluation period.
const DefaultInterval = 60 * time.Second

// MonitorOptions configure a Monitor.
type MonitorOptions struct {
	// Evaluate says where to look (see Options).
	Evaluate Options
	// Interval between evaluations. Default DefaultInterval.
	Interval time.Duration
	// Readiness is ReadinessServing (default) or ReadinessActivation.
	Readiness string
	// Serving reports whether the mirror can serve (its /readyz check). Required.
	Serving func(context.Context) error
	// ReadyFile, when set, exists exactly while the readiness answer is "ready" (for exec
	// probes); it is created atomically and removed when readiness is lost.
	ReadyFile string
	// Registerer receives the gauge nodecache_runtime_config_active{runtime}. Default: none.
	Registerer prometheus.Registerer
	// Logger receives one line per state transition. Default: disabled.
	Logger zerolog.Logger
}

// Monitor re-evaluates activation and publishes the answer.
type Monitor struct {
	opts  MonitorOptions
	gauge *prometheus.GaugeVec

	mu    sync.Mutex
	last  *Report
	ready bool
	seen  map[string]State // last logged state per runtime
	// noRuntime is set while no runtime is present (every one not_applicable), after the one
	// warning that says so: without it a pod with a wrong host mount sat NotReady with a silent log.
	noRuntime bool
}

// NewMonitor checks the options and registers the gauge. It starts nothing: call Run.
func NewMonitor(opts MonitorOptions) (*Monitor, error) {
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Interval < 0 {
		return nil, fmt.Errorf("interval %s: want a positive duration", opts.Interval)
	}
	switch opts.Readiness {
	case "":
		opts.Readiness = ReadinessServing
	case ReadinessServing, ReadinessActivation:
	default:
		return nil, fmt.Errorf("readiness %q: want serving or activation", opts.Readiness)
	}
	if opts.Serving == nil {
		return nil, errors.New("serving check: required")
	}
	// Validate evaluation options now, so a bad flag fails before serving.
	probe := opts.Evaluate
	probe.Upstreams = append([]string(nil), opts.Evaluate.Upstreams...)
	if err := probe.setDefaults(); err != nil {
		return nil, err
	}
	m := &Monitor{opts: opts, seen: map[string]State{}}
	m.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodecache_runtime_config_active",
		Help: "1 while the runtime's running configuration pulls through this mirror (ACTIVE), 0 while it does not or cannot be told; runtimes not present on the node are absent, and runtime=\"" + NoRuntimeLabel + "\" is 0 while no runtime is found at all.",
	}, []string{"runtime"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(m.gauge); err != nil {
			return nil, fmt.Errorf("register nodecache_runtime_config_active: %w", err)
		}
	}
	return m, nil
}

// Run evaluates at once and then every Interval until ctx ends. It returns nil when ctx ends.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	for {
		m.Check(ctx)
		select {
		case <-ctx.Done():
			m.setReady(false)
			return nil
		case <-t.C:
		}
	}
}

// Check runs one evaluation and publishes it.
func (m *Monitor) Check(ctx context.Context) *Report {
	o := m.opts.Evaluate
	o.Upstreams = append([]string(nil), m.opts.Evaluate.Upstreams...)
	rep, err := Evaluate(ctx, o)
	if err != nil { // refused options: validated in NewMonitor, so only a programming error
		rep = &Report{State: Unknown, Reason: err.Error(), CheckedAt: time.Now().UTC()}
	}
	m.mu.Lock()
	m.last = rep
	m.mu.Unlock()
	m.publish(rep)
	serving := m.opts.Serving(ctx) == nil
	m.setReady(serving && (m.opts.Readiness == ReadinessServing || rep.State == Active))
	return rep
}

// Last returns the latest report (nil before the first evaluation).
func (m *Monitor) Last() *Report {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

func (m *Monitor) publish(rep *Report) {
	log := m.opts.Logger
	present := map[string]bool{}
	for _, rt := range rep.Runtimes {
		if rt.State == NotApplicable {
			continue
		}
		present[rt.Runtime] = true
		v := 0.0
		if rt.State == Active {
			v = 1
		}
		m.gauge.WithLabelValues(rt.Runtime).Set(v)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for rt := range m.seen {
		if !present[rt] {
			m.gauge.DeleteLabelValues(rt)
		}
	}
	for _, rt := range rep.Runtimes {
		prev, had := m.seen[rt.Runtime]
		m.seen[rt.Runtime] = rt.State
		if (had && prev == rt.State) || (!had && rt.State == NotApplicable) {
			continue
		}
		ev := log.Info()
		if rt.State == NotActive || rt.State == Unknown {
			ev = log.Warn()
		}
		ev = ev.Str("runtime", rt.Runtime).Str("state", string(rt.State)).Str("reason", rt.Reason)
		if had {
			ev = ev.Str("previous", string(prev))
		}
		if rt.Remedy != "" {
			ev = ev.Str("remedy", rt.Remedy)
		}
		if rt.Pending {
			ev = ev.Bool("pending", true)
		}
		ev.Msg("runtime activation changed")
	}
	if len(present) > 0 {
		m.gauge.DeleteLabelValues(NoRuntimeLabel)
		m.noRuntime = false
		return
	}
	// No runtime at all is a node that does not pull through the cache either (often the
	// agent's host root or PID namespace is not the node's): say so as a 0, so that an alert on
	// the gauge fires instead of finding no series.
	m.gauge.WithLabelValues(NoRuntimeLabel).Set(0)
	if m.noRuntime {
		return
	}
	m.noRuntime = true
	var looked []string
	for _, rt := range rep.Runtimes {
		looked = append(looked, rt.Runtime+": "+rt.Reason)
	}
	if len(looked) == 0 {
		looked = append(looked, rep.Reason)
	}
	ev := log.Warn().Str("state", string(rep.State)).Strs("looked_at", looked)
	if h := m.opts.Evaluate.Host; h != nil {
		ev = ev.Str("host_root", h.Root()).Str("proc_root", h.ProcRoot())
	}
	if m.opts.Readiness == ReadinessActivation {
		ev = ev.Str("readiness", "/readyz stays 503 until a runtime pulls through the cache")
	}
	ev.Str("remedy", "mount the node's / at --host-root and run in the host's PID namespace (the chart does both)").
		Msg("no container runtime found on this node")
}

// NoRuntimeLabel is the runtime label of nodecache_runtime_config_active while no container
// runtime is found on the node (its value is then 0).
const NoRuntimeLabel = "none"

func (m *Monitor) setReady(ready bool) {
	m.mu.Lock()
	changed := m.ready != ready
	m.ready = ready
	m.mu.Unlock()
	if m.opts.ReadyFile == "" {
		return
	}
	if err := writeReadyFile(m.opts.ReadyFile, ready); err != nil {
		m.opts.Logger.Error().Err(err).Str("file", m.opts.ReadyFile).Msg("ready file")
	} else if changed {
		m.opts.Logger.Debug().Bool("ready", ready).Str("file", m.opts.ReadyFile).Msg("ready file")
	}
}

// writeReadyFile creates (atomically) or removes the ready file.
func writeReadyFile(name string, ready bool) error {
	if !ready {
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove ready file %s: %w", name, err)
		}
		return nil
	}
	if _, err := os.Stat(name); err == nil {
		return nil
	}
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, ".ready-*")
	if err != nil {
		return fmt.Errorf("write ready file %s: %w", name, err)
	}
	_, werr := f.WriteString("ready\n")
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write ready file %s: %w", name, err)
	}
	if err := os.Rename(f.Name(), name); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write ready file %s: %w", name, err)
	}
	return nil
}

// Ready reports the readiness answer (see MonitorOptions.Readiness).
func (m *Monitor) Ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ready
}

// Readiness is the live /readyz answer: nil when ready. With ReadinessServing it is the
// Serving check; with ReadinessActivation the runtime configuration must also be ACTIVE in the
// latest evaluation. For mirror.ServeOptions.Readiness, so every listener answers alike.
func (m *Monitor) Readiness(ctx context.Context) error {
	if err := m.opts.Serving(ctx); err != nil {
		return fmt.Errorf("not serving: %w", err)
	}
	if m.opts.Readiness != ReadinessActivation {
		return nil
	}
	if rep := m.Last(); rep == nil || rep.State != Active {
		state := "not evaluated yet"
		if rep != nil {
			state = string(rep.State) + ": " + rep.Reason
		}
		return errors.New("runtime configuration not active: " + state)
	}
	return nil
}

// Paths served by Handler.
const (
	ActivezPath = "/activez"
	ReadyzPath  = "/readyz"
)

// Handler serves /activez (200 only while ACTIVE; the body is the state, reason and remedy)
// and, with ReadinessActivation, /readyz from the readiness answer; everything else goes to next.
func (m *Monitor) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == ActivezPath:
			rep := m.Last()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if rep == nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintln(w, "unknown: not evaluated yet")
				return
			}
			if rep.State != Active {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "%s: %s\n", rep.State, rep.Reason)
			for _, rt := range rep.Runtimes {
				if rt.Remedy != "" {
					fmt.Fprintf(&b, "%s: %s\n", rt.Runtime, rt.Remedy)
				}
			}
			_, _ = fmt.Fprint(w, b.String())
		case r.URL.Path == ReadyzPath && m.opts.Readiness == ReadinessActivation:
			if err := m.Readiness(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = fmt.Fprintln(w, "ok")
		default:
			next.ServeHTTP(w, r)
		}
	})
}
