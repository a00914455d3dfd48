package mirror

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/nodecache/nodecache/internal/clitext"
)

// ServeOptions configures Serve.
type ServeOptions struct {
	// Listen is the registry's address, e.g. ":5000" or "127.0.0.1:5000".
	Listen string
	// TLS, when set, makes the registry listener (Listen) serve HTTPS only (TLS 1.2 or later)
	// with this certificate; MetricsListen stays plain HTTP.
	TLS *Certificate
	// MetricsListen, when set, serves /metrics (and the probes) on a separate address too.
	MetricsListen string
	// PeerListen, when set, is where this node answers its peers (--peer-listen: Mirror.PeerHandler,
	// plain HTTP); the mirror must have peers.
	PeerListen string
	// IdleTimeout closes a keep-alive connection that has been idle this long (--idle-timeout),
	// on every listener: an idle connection holds a descriptor, and anyone who reaches the port
	// could hold them all. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxConns is the connection budget: client connections every listener together holds at
	// once (see connTracker). Default ConnBudget of the process's descriptor limit.
	MaxConns int
	// ClientMaxConns is how many connections one client address may hold once the budget is
	// under pressure (--client-max-conns; SNAT and NodePort Services make many nodes one
	// address). Default DefaultClientMaxConns.
	ClientMaxConns int
	// ShutdownTimeout bounds how long in-flight responses may take to finish after ctx ends.
	// Default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// FillGrace is how long blob fills that no client waits for any more may go on after the
	// responses finished; the rest are abandoned (nothing partial is stored). Default
	// DefaultFillGrace.
	FillGrace time.Duration
	// Handler overrides the handler served on Listen (the agent wraps the mirror). Default: the
	// Mirror itself.
	Handler http.Handler
	// Readiness, when set, answers /readyz on both listeners instead of Mirror.Ready (the agent
	// makes readiness follow runtime activation): nil error = 200 "ok", else 503 with the error.
	Readiness func(context.Context) error
	// Logger receives lifecycle messages.
	Logger zerolog.Logger
	// OnListen, when set, is called with the bound registry address once it accepts connections.
	OnListen func(addr net.Addr)
}

// serveHandlers are the handler of the registry listener (o.Handler, else m) and the /readyz
// handler (m, or o.Readiness's probe, which then answers /readyz on the registry listener too).
func serveHandlers(m *Mirror, o ServeOptions) (h, readyz http.Handler) {
	h = o.Handler
	if h == nil {
		h = m
	}
	readyz = m
	if o.Readiness != nil {
		readyz = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.probe(w, r, o.Readiness) })
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/readyz" {
				readyz.ServeHTTP(w, r)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	return h, readyz
}

// listenServers binds the registry listener (o.Listen, serving h, with o.TLS), with
// o.MetricsListen the metrics listener (/metrics, /healthz, and readyz at /readyz), and with
// o.PeerListen the peer port, and returns their servers and listeners in that order; t counts
// the connections of all of them.
func listenServers(ctx context.Context, m *Mirror, o ServeOptions, h, readyz http.Handler, t *connTracker) ([]*http.Server, []net.Listener, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", o.Listen)
	if err != nil {
		return nil, nil, listenError("--listen", o.Listen, err)
	}
	servers := []*http.Server{newServer(h, o.IdleTimeout, t)}
	if o.TLS != nil {
		servers[0].TLSConfig = o.TLS.TLSConfig()
	}
	listeners := []net.Listener{&limitListener{Listener: l, t: t, gated: !m.pull.open(), plain: o.TLS == nil}}
	if o.MetricsListen != "" {
		ml, err := lc.Listen(ctx, "tcp", o.MetricsListen)
		if err != nil {
			_ = l.Close()
			return nil, nil, listenError("--metrics-listen", o.MetricsListen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", m.MetricsHandler())
		mux.Handle("/healthz", m)
		mux.Handle("/readyz", readyz)
		servers = append(servers, newServer(mux, o.IdleTimeout, t))
		listeners = append(listeners, &limitListener{Listener: ml, t: t, plain: true})
	}
	if o.PeerListen != "" {
		ph := m.PeerHandler()
		if ph == nil {
			closeAll(listeners)
			return nil, nil, errors.New("--peer-listen needs --peers")
		}
		pl, err := lc.Listen(ctx, "tcp", o.PeerListen)
		if err != nil {
			closeAll(listeners)
			return nil, nil, listenError("--peer-listen", o.PeerListen, err)
		}
		servers = append(servers, newServer(ph, o.IdleTimeout, t))
		listeners = append(listeners, &limitListener{Listener: pl, t: t, plain: true})
	}
	return servers, listeners, nil
}

// listenError is a failed bind of flag's address: for an address in use, or not this host's,
// what to do about it.
func listenError(flag, addr string, err error) error {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%s %s: another process listens there: stop it, or give %s another port (%w)", flag, addr, flag, err)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return fmt.Errorf("%s %s: no interface of this host has that address: give one of its addresses, or :PORT for all of them (%w)", flag, addr, err)
	}
	return fmt.Errorf("%s %s: %w", flag, addr, err)
}

// DefaultIdleTimeout is ServeOptions.IdleTimeout's default: longer than containerd keeps an idle
// connection to a registry host for its next request of a pull, short enough that idle
// connections do not pile up.
const DefaultIdleTimeout = 30 * time.Second

// DefaultShutdownTimeout is ServeOptions.ShutdownTimeout's default, 5 minutes: a large blob to a
// slow client finishes after the stop signal.
const DefaultShutdownTimeout = 5 * time.Minute

// DefaultFillGrace is ServeOptions.FillGrace's default, 30 seconds.
const DefaultFillGrace = 30 * time.Second

// StopGrace is the longest a serve or agent with the defaults takes from SIGTERM to its exit,
// 330 seconds: DefaultShutdownTimeout for the responses, then DefaultFillGrace for the fills.
// What stops nodecache must wait at least this long before it kills it: the pods'
// terminationGracePeriodSeconds (the chart, examples/kubernetes) and the systemd unit's
// TimeoutStopSec (examples/baremetal) are this many seconds (cmd/nodecache
// TestStopGraceInManifests checks them); a shorter one kills responses still sending a blob.
const StopGrace = DefaultShutdownTimeout + DefaultFillGrace

// MaxHeaderBytes bounds a request's header (request line included): Go answers 431 beyond it.
// Registry requests carry a few hundred bytes of headers.
const MaxHeaderBytes = 64 << 10

// newServer is an HTTP server of h with nodecache's connection bounds: 30 s to read a request's
// header, MaxHeaderBytes of it, idle keep-alive connections closed after idle, and its
// connections counted by t (idle ones closed first under pressure, one-shot connections past a
// bound).
func newServer(h http.Handler, idle time.Duration, t *connTracker) *http.Server {
	return &http.Server{Handler: t.handler(h), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: idle, MaxHeaderBytes: MaxHeaderBytes,
		ConnState: t.connState, ConnContext: t.connContext}
}

// connBounds sets o's connection budget (from the descriptor limit when unset) and
// per-address cap to their defaults, and returns the descriptor limit (0 when o set the budget).
func (o *ServeOptions) connBounds() (uint64, error) {
	switch {
	case o.ClientMaxConns < 0:
		return 0, fmt.Errorf("--client-max-conns %d: want a positive number of connections such as %d", o.ClientMaxConns, DefaultClientMaxConns)
	case o.MaxConns < 0:
		return 0, fmt.Errorf("connection budget %d: want a positive number of connections, or 0 for the descriptor limit's", o.MaxConns)
	}
	if o.ClientMaxConns == 0 {
		o.ClientMaxConns = DefaultClientMaxConns
	}
	if o.MaxConns > 0 {
		return 0, nil
	}
	limit, err := descriptorLimit()
	if err != nil {
		return 0, err
	}
	o.MaxConns = ConnBudget(limit)
	return limit, nil
}

// logListening logs the addresses of listeners (the registry's first) and their connection
// budget, from the descriptor limit limit (0: set by o).
func logListening(o ServeOptions, listeners []net.Listener, limit uint64) {
	for i, ln := range listeners {
		o.Logger.Info().Str("addr", ln.Addr().String()).Bool("tls", i == 0 && o.TLS != nil).Msg("listening")
	}
	o.Logger.Info().Int("budget", o.MaxConns).Uint64("descriptor_limit", limit).Int("client_max_conns", o.ClientMaxConns).
		Msg("connection budget (all listeners)")
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		_ = l.Close()
	}
}

// Serve serves m until ctx ends, then stops accepting, lets in-flight responses finish (bounded by
// ShutdownTimeout), and gives blob fills FillGrace to be stored before abandoning them. It returns
// nil after a clean shutdown, an error when responses were still running at ShutdownTimeout.
func Serve(ctx context.Context, m *Mirror, o ServeOptions) error {
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.FillGrace == 0 {
		o.FillGrace = DefaultFillGrace
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	limit, err := o.connBounds()
	if err != nil {
		return err
	}
	h, readyz := serveHandlers(m, o)
	// The root is taken (locked and swept) before any listener binds: a second process on the
	// same root fails here, before it could answer a single request.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	m.listening = make(chan struct{})
	started, runDone := make(chan struct{}), make(chan error, 1)
	go func() { runDone <- m.run(runCtx, started) }()
	select {
	case <-started:
	case err := <-runDone:
		return err
	}
	stop := func(err error) error {
		stopRun()
		<-runDone
		return err
	}
	tracker := newConnTracker(o.MaxConns, o.ClientMaxConns, m.pull, m.metrics, o.Logger)
	servers, listeners, err := listenServers(ctx, m, o, h, readyz, tracker)
	if err != nil {
		return stop(err)
	}
	close(m.listening)
	l := listeners[0]
	logListening(o, listeners, limit)
	m.logAccess(l.Addr().String())
	if o.OnListen != nil {
		o.OnListen(l.Addr())
	}
	g, gctx := errgroup.WithContext(ctx)
	for i := range servers {
		srv, ln := servers[i], listeners[i]
		g.Go(func() error {
			serve := srv.Serve
			if srv.TLSConfig != nil {
				serve = func(ln net.Listener) error { return srv.ServeTLS(ln, "", "") }
			}
			if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", ln.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error { return awaitRun(gctx, stopRun, runDone) })
	g.Go(func() error {
		<-gctx.Done()
		o.Logger.Info().Str("timeout", clitext.Span(o.ShutdownTimeout)).Msg("shutting down: finishing in-flight responses")
		sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
		defer cancel()
		var errs []error
		for _, srv := range servers {
			if err := srv.Shutdown(sctx); err != nil {
				errs = append(errs, fmt.Errorf("shutdown: %w", err))
			}
		}
		gctx, gcancel := context.WithTimeout(context.Background(), o.FillGrace)
		defer gcancel()
		if n := m.Drain(gctx); n > 0 {
			o.Logger.Warn().Int("fills", n).Str("grace", clitext.Span(o.FillGrace)).Msg("abandoned blob fills nobody was waiting for; nothing partial was stored")
		}
		return errors.Join(errs...)
	})
	return g.Wait()
}

// awaitRun waits for the mirror's Run (its result on runDone) while serving goes on: until ctx
// ends, then it stops Run and returns its result; or until Run ends first, which only a failed
// --seed does (an error, which ends serving).
func awaitRun(ctx context.Context, stopRun func(), runDone <-chan error) error {
	select {
	case <-ctx.Done():
		stopRun()
		return <-runDone
	case err := <-runDone:
		if err == nil {
			<-ctx.Done()
		}
		return err
	}
}

// ForwardDistributionLogs sends distribution's logrus output to log: its error lines as errors,
// everything else at debug (the access log already has one line per request). distribution logs
// through the process-wide logrus logger, so this changes process state: call it once, from main.
func ForwardDistributionLogs(log zerolog.Logger) {
	logrus.SetOutput(zerologWriter{log})
	logrus.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true, DisableColors: true})
	if log.GetLevel() <= zerolog.DebugLevel {
		logrus.SetLevel(logrus.DebugLevel)
	} else {
		logrus.SetLevel(logrus.WarnLevel)
	}
}

type zerologWriter struct{ log zerolog.Logger }

func (w zerologWriter) Write(p []byte) (int, error) {
	msg := string(p)
	ev := w.log.Debug()
	if strings.Contains(msg, `msg="response completed`) {
		// distribution's per-request lines: the access log already has one line per request.
		ev = w.log.Debug()
	} else if strings.Contains(msg, "level=error") || strings.Contains(msg, "level=fatal") || strings.Contains(msg, "level=panic") {
		ev = w.log.Error()
	} else if strings.Contains(msg, "level=warn") {
		ev = w.log.Warn()
	}
	ev.Str("component", "distribution").Msg(strings.TrimRight(msg, "\r\n"))
	return len(p), nil
}
