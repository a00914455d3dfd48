// Package agent is `nodecache agent`, the DaemonSet mode: one process that serves the
// pull-through registry, configures the node's runtime once (the configure workflow of
// `nodecache gen`), pre-fills images once, and keeps re-evaluating whether the runtime really
// pulls through the mirror. Run composes the four in one errgroup.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
	"github.com/nodecache/nodecache/pkg/warm"
)

// DefaultListen is the agent's registry address: loopback only, so a node with a public address
// is not an open proxy. hostNetwork puts it on the node's own loopback, where the runtime is.
const DefaultListen = "127.0.0.1:5000"

// Config is the agent's settings, one field per flag of `nodecache agent`.
type Config struct {
	// Registry are the embedded registry's settings (serve's flags).
	Registry mirror.Config
	// Status says where the runtime's evidence is (--runtime, --host-root,
	// --containerd-config, --containerd-socket).
	Status activation.Flags
	// Mirror is the URL the runtime is pointed at (--mirror). Default http://<Registry.Listen>,
	// 127.0.0.1 when that has no host or an unspecified one.
	Mirror string
	// Interval is how often activation is re-evaluated (positive).
	Interval time.Duration
	// Readiness is what /readyz reports: activation.ReadinessServing or ReadinessActivation.
	Readiness string
	// ReadyFile exists exactly while /readyz would answer 200. Empty: none.
	ReadyFile string
	// Warm are the images pre-filled once after the configure pass (repeated or
	// comma-separated), each pinned once warm (warm.Options.Pin): eviction never removes them.
	Warm []string
	// Configure are the configure pass's own settings.
	Configure Configure
	// Logger receives every log line. Default: disabled.
	Logger zerolog.Logger
	// Stdout receives the Talos machine-config patch. Default os.Stdout.
	Stdout io.Writer
}

// Configure are the settings of the agent's configure pass (the flags it shares with gen).
type Configure struct {
	// CertsDir is containerd's config_path directory when one has to be set (--certs-dir).
	CertsDir string
	// Migrate moves containerd's legacy registry.mirrors into hosts.toml (--migrate).
	Migrate bool
	// ContainerdVersion and CrioVersion override the probed versions.
	ContainerdVersion, CrioVersion string
	// NoReload skips CRI-O's best-effort SIGHUP.
	NoReload bool
	// RegistriesDir and CrioDir are the CRI-O drop-in directories (host paths).
	RegistriesDir, CrioDir string
	// MirrorCA is the host path of an https mirror's PEM CA (--mirror-ca).
	MirrorCA string
	// DialTimeout is --dial-timeout, containerd's dial_timeout in every [host] of the
	// hosts.toml files (configure.ContainerdOptions.DialTimeout). Positive.
	DialTimeout time.Duration
}

// plan is a checked Config.
type plan struct {
	cfg       Config
	status    activation.Options
	registry  mirror.Options
	mirrorURL *url.URL
	upstreams []string
	warm      []warm.Reference
}

// refused marks a configuration error as a refusal (refusal.ErrRefused), with its message: the
// CLI exits 2 for it.
func refused(err error) error { return &refusal.Error{Reason: err.Error()} }

// check validates c; every error is a refusal (refusal.ErrRefused) naming the flag.
func check(c Config) (*plan, error) {
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("--interval %s: want a positive duration such as 30s or 1m (default %s)", c.Interval, activation.DefaultInterval))
	}
	if c.Configure.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--dial-timeout %s: %s", c.Configure.DialTimeout, containerd.DialTimeoutWant))
	}
	switch c.Readiness {
	case activation.ReadinessServing, activation.ReadinessActivation:
	default:
		errs = append(errs, fmt.Errorf("--readiness %q: want %s (the mirror can serve) or %s (and the runtime configuration is ACTIVE)",
			c.Readiness, activation.ReadinessServing, activation.ReadinessActivation))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, refused(err)
	}
	p := &plan{cfg: c}
	var err error
	if p.status, err = c.Status.Options(); err != nil {
		return nil, err // a refusal naming the flags
	}
	if p.registry, err = c.Registry.Options(c.Logger); err != nil {
		return nil, refused(err)
	}
	if p.mirrorURL, err = mirrorURL(c.Mirror, c.Registry.Listen); err != nil {
		return nil, refused(err)
	}
	for _, s := range clitext.SplitList(c.Warm) {
		r, err := warm.ParseReference(s)
		if err != nil {
			return nil, refused(fmt.Errorf("--warm: %w", err))
		}
		p.warm = append(p.warm, r)
	}
	for _, u := range p.registry.Upstreams {
		p.upstreams = append(p.upstreams, u.Name)
	}
	if p.cfg.Stdout == nil {
		p.cfg.Stdout = os.Stdout
	}
	p.status.Upstreams, p.status.Mirror, p.status.Logger = p.upstreams, p.mirrorURL, c.Logger
	return p, nil
}

// mirrorURL is the URL runtimes are pointed at: explicit, else http://<listen> with 127.0.0.1
// for an unspecified host.
func mirrorURL(explicit, listen string) (*url.URL, error) {
	if explicit != "" {
		m, err := name.ParseMirror(explicit)
		if err != nil {
			return nil, err
		}
		return m.URL, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: want HOST:PORT or :PORT: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return &url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}, nil
}

// Run checks c (a refusal, refusal.ErrRefused, when it is refused; nothing started),
// then serves until ctx ends. One errgroup holds the registry server, the configure pass (once
// the registry listens), the warm pass (after configure) and the activation monitor (after
// configure). Configure and warm failures are logged, not returned: the mirror still serves and
// the monitor reports NOT active with the reason. Run returns the server's error, nil after a
// clean shutdown.
func Run(ctx context.Context, c Config) error {
	p, err := check(c)
	if err != nil {
		return err
	}
	log := c.Logger
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mopts := p.registry
	mopts.Registerer, mopts.Gatherer, mopts.Logger = reg, reg, log
	mirror.ForwardDistributionLogs(log)
	m, err := mirror.New(ctx, mopts)
	if err != nil {
		return err
	}
	defer m.Close()
	mon, err := activation.NewMonitor(activation.MonitorOptions{
		Evaluate:   p.status,
		Interval:   c.Interval,
		Readiness:  c.Readiness,
		Serving:    m.Ready,
		ReadyFile:  c.ReadyFile,
		Registerer: reg,
		Logger:     log,
	})
	if err != nil {
		return refused(err)
	}
	log.Info().Str("version", buildinfo.Version()).Str("mirror", p.mirrorURL.String()).Strs("upstreams", p.upstreams).Msg("nodecache agent")

	listening, configured := make(chan struct{}), make(chan struct{})
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return mirror.Serve(ctx, m, mirror.ServeOptions{
			Listen: c.Registry.Listen, MetricsListen: c.Registry.MetricsListen, PeerListen: c.Registry.PeerListen, Logger: log,
			IdleTimeout: c.Registry.IdleTimeout, ClientMaxConns: c.Registry.ClientMaxConns,
			Handler:   mon.Handler(m),
			Readiness: mon.Readiness,
			OnListen:  func(net.Addr) { close(listening) },
		})
	})
	g.Go(func() error {
		defer close(configured)
		if wait(ctx, listening) {
			p.configure(ctx)
		}
		return nil
	})
	g.Go(func() error {
		if wait(ctx, configured) && len(p.warm) > 0 {
			p.warmOnce(ctx)
		}
		return nil
	})
	g.Go(func() error {
		if !wait(ctx, configured) {
			return nil
		}
		return mon.Run(ctx)
	})
	return g.Wait()
}

// wait reports whether ch closed before ctx ended.
func wait(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// warmOnce pre-fills the --warm images through the agent's own mirror, for this machine's
// platform, and pins them there (the images a node needs before it can run anything must not be
// evicted before it asks: issue 24); the outcome is logged.
func (p *plan) warmOnce(ctx context.Context) {
	log := p.cfg.Logger
	platform, err := warm.ParsePlatform("")
	if err != nil {
		log.Error().Err(err).Msg("warm")
		return
	}
	rep, err := warm.Run(ctx, warm.Options{Mirror: p.mirrorURL, Images: p.warm, Platform: platform, Routing: warm.RoutingNS, Logger: log, Pin: true})
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		log.Error().Err(err).Msg("warm")
	case rep != nil:
		for _, im := range rep.Images {
			if im.Error != "" {
				log.Warn().Str("image", im.Reference).Str("error", im.Error).Msg("warm: image not warm, or not pinned")
			}
		}
		log.Info().Bool("warm", rep.Warm).Int("pinned", rep.PinnedImages).Int("images", len(rep.Images)).Msg("warm finished")
	}
}
