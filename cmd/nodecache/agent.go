package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	bcrio "github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/warm"
)

// agentListen is the agent's default address: loopback only, so a node with a public address
// is not an open proxy. hostNetwork puts it on the node's own loopback, where the runtime is.
const agentListen = "127.0.0.1:5000"

func agentCommand() *cli.Command {
	flags := append(mirrorFlags(agentListen), statusFlags()...)
	flags = append(flags,
		stringFlag("mirror", "", "`URL` the runtime is pointed at (default: http://<--listen>, 127.0.0.1 when --listen has no host)"),
		stringFlag("certs-dir", bcontainerd.DefaultCertsDir, "single `DIR` written into containerd's config_path when one has to be set (host path)"),
		durationFlag("interval", activation.DefaultInterval, "re-evaluate activation this often (read-only)"),
		stringSliceFlag("warm", nil, "`IMAGE` to pre-fill once at start, repeatable"),
		stringFlag("readiness", activation.ReadinessServing, "what /readyz reports: serving (the mirror can serve) or activation (and the runtime configuration is ACTIVE)"),
		stringFlag("ready-file", "", "`FILE` that exists exactly while /readyz would answer 200 (for exec probes)"),
	)
	return withFlagValueErrors(withConfig(&cli.Command{
		Name:  "agent",
		Usage: "DaemonSet mode: serve, configure the node's runtime once, and keep reporting whether it pulls through the mirror",
		Description: `One process for a hostNetwork, hostPID DaemonSet with the host's / mounted (--host-root):

   1. serves the pull-through registry (serve's flags; --listen defaults to 127.0.0.1:5000);
   2. runs one gen pass for the runtime found under --host-root: containerd hosts.toml files
      and config_path, CRI-O drop-in plus one SIGHUP, Talos: prints the machine-config patch;
   3. pre-fills --warm images once;
   4. re-evaluates activation every --interval (read-only), serving /activez (200 only while
      ACTIVE), the gauge nodecache_runtime_config_active{runtime}, and logging only transitions,
      each with its remedy.

It never restarts or signals containerd: when containerd must load a new config_path, the log
and /activez say "restart containerd or cycle the node".`,
		Flags:  flags,
		Action: runAgent,
	}))
}

func runAgent(c *cli.Context) error {
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if err := agentFlags(c); err != nil {
		return err
	}
	sopts, err := statusOptions(c)
	if err != nil {
		return err
	}
	mopts, err := mirrorOptions(c)
	if err != nil {
		return err
	}
	mirrorURL, err := agentMirrorURL(c.String("mirror"), c.String("listen"))
	if err != nil {
		return usagef("%v", err)
	}
	var warmRefs []warm.Reference
	for _, s := range splitList(c.StringSlice("warm")) {
		r, err := warm.ParseReference(s)
		if err != nil {
			return usagef("--warm: %v", err)
		}
		warmRefs = append(warmRefs, r)
	}
	names := upstreamNames(mopts.Upstreams)
	sopts.Upstreams = names
	sopts.Mirror = mirrorURL
	sopts.Logger = log

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mopts.Registerer, mopts.Gatherer, mopts.Logger = reg, reg, log
	mirror.ForwardDistributionLogs(log)
	m, err := mirror.New(c.Context, mopts)
	if err != nil {
		return withCode(exitNegative, err)
	}
	defer m.Close()
	mon, err := activation.NewMonitor(activation.MonitorOptions{
		Evaluate:   sopts,
		Interval:   c.Duration("interval"),
		Readiness:  c.String("readiness"),
		Serving:    m.Ready,
		ReadyFile:  c.String("ready-file"),
		Registerer: reg,
		Logger:     log,
	})
	if err != nil {
		return usagef("%v", err)
	}
	log.Info().Str("version", buildinfo.Version()).Str("mirror", mirrorURL.String()).Strs("upstreams", names).Msg("nodecache agent")

	listening := make(chan struct{})
	g, ctx := errgroup.WithContext(c.Context)
	g.Go(func() error {
		return mirror.Serve(ctx, m, mirror.ServeOptions{
			Listen: c.String("listen"), MetricsListen: c.String("metrics-listen"), Logger: log,
			Handler:   mon.Handler(m),
			Readiness: mon.Readiness,
			OnListen:  func(net.Addr) { close(listening) },
		})
	})
	g.Go(func() error {
		select {
		case <-listening:
		case <-ctx.Done():
			return nil
		}
		genPass(ctx, log, sopts, mirrorURL, names, c.String("certs-dir"))
		if len(warmRefs) > 0 {
			go warmOnce(ctx, log, mirrorURL, warmRefs)
		}
		return mon.Run(ctx)
	})
	return withCode(exitNegative, g.Wait())
}

// agentFlags checks the agent's own flags; refusals exit 2 and name the flag and what it accepts.
func agentFlags(c *cli.Context) error {
	var errs []error
	if d := c.Duration("interval"); d <= 0 {
		errs = append(errs, fmt.Errorf("--interval %s: want a positive duration such as 30s or 1m (default %s)", d, activation.DefaultInterval))
	}
	switch r := c.String("readiness"); r {
	case activation.ReadinessServing, activation.ReadinessActivation:
	default:
		errs = append(errs, fmt.Errorf("--readiness %q: want %s (the mirror can serve) or %s (and the runtime configuration is ACTIVE)",
			r, activation.ReadinessServing, activation.ReadinessActivation))
	}
	if err := errors.Join(errs...); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// agentMirrorURL is the URL runtimes are pointed at: --mirror, else http://<listen> with
// 127.0.0.1 for an unspecified host.
func agentMirrorURL(explicit, listen string) (*url.URL, error) {
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

// genPass configures the runtime found under the host root, once. Failures are logged, not
// fatal: the mirror still serves, and the reconcile loop reports NOT active with the reason.
func genPass(ctx context.Context, log zerolog.Logger, o activation.Options, mirrorURL *url.URL, upstreams []string, certsDir string) {
	bm, err := name.ParseMirror(mirrorURL.String())
	if err != nil {
		log.Error().Err(err).Msg("gen: mirror refused")
		return
	}
	h := o.Host
	if activation.IsTalos(h) && (o.Runtime == activation.RuntimeAuto || o.Runtime == activation.RuntimeTalos) {
		res, err := talos.Generate(talos.Options{Mirror: bm, Upstreams: upstreams})
		if err != nil {
			log.Error().Err(err).Msg("gen talos")
			return
		}
		// Talos files are owned by Talos: the patch is printed for the operator to apply.
		log.Warn().Str("runtime", "talos").Str("remedy", "apply this machine-config patch (talosctl patch mc --patch @file); Talos applies mirror changes live").
			Msg("gen talos: machine-config patch")
		fmt.Fprint(os.Stdout, res.Patch)
		return
	}
	if o.Runtime == activation.RuntimeAuto || o.Runtime == activation.RuntimeContainerd {
		cfg := o.ContainerdConfig
		if cfg == "" {
			cfg = bcontainerd.DefaultConfig
		}
		if h.Exists(cfg) || h.Exists(o.ContainerdSocket) {
			genContainerd(ctx, log, o, bm, upstreams, cfg, certsDir)
		}
	}
	if o.Runtime == activation.RuntimeAuto || o.Runtime == activation.RuntimeCRIO {
		if h.Exists(activation.DefaultCRIOConfig) || h.Exists(activation.DefaultCRIODropInDir) {
			genCRIO(ctx, log, o, bm, upstreams)
		}
	}
}

func genContainerd(ctx context.Context, log zerolog.Logger, o activation.Options, bm name.Mirror, upstreams []string, cfg, certsDir string) {
	var daemon bootstrap.Version
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	dv, err := activation.RuntimeVersion(vctx, o.Host, activation.RuntimeContainerd, o.ContainerdSocket)
	cancel()
	if err == nil {
		daemon = dv.Version
		log.Debug().Str("version", dv.Raw).Str("from", dv.Source).Msg("gen containerd: daemon version")
	} else {
		log.Debug().Err(err).Msg("gen containerd: daemon version unknown")
	}
	plan, err := bcontainerd.Plan(o.Host.FS(), bcontainerd.Options{
		Mirror: bm, Upstreams: upstreams, Config: cfg, CertsDir: certsDir, Daemon: daemon,
	})
	if err != nil {
		log.Error().Err(err).Str("runtime", "containerd").Msg("gen containerd refused; nothing was changed")
		return
	}
	if err := o.Host.Applier(log).Apply(ctx, plan.Changes); err != nil {
		log.Error().Err(err).Str("runtime", "containerd").Msg("gen containerd")
		return
	}
	if !plan.RestartRequired {
		reason, warn := containerdStartedBefore(o.Host, plan.Config, daemon)
		if warn != "" {
			plan.Warnings = append(plan.Warnings, warn)
		}
		if reason != "" {
			plan.RestartRequired = true
			plan.Warnings = append(plan.Warnings, "restart required: "+reason)
		}
	}
	ev := log.Info().Str("runtime", "containerd").Str("config_path", plan.ConfigPath).Str("hosts_dir", plan.HostsDir).
		Bool("restart_required", plan.RestartRequired)
	if plan.RestartRequired {
		ev = ev.Str("remedy", "restart containerd or cycle the node (nodecache never restarts containerd)")
	}
	for _, w := range plan.Warnings {
		log.Warn().Str("runtime", "containerd").Msg(w)
	}
	ev.Msg("gen containerd")
}

// genCRIO writes the registries.conf.d drop-in and, when something changed, sends CRI-O its one
// best-effort SIGHUP (never evidence: the monitor judges activation on its own).
func genCRIO(ctx context.Context, log zerolog.Logger, o activation.Options, bm name.Mirror, upstreams []string) {
	plan, err := bcrio.Plan(o.Host.FS(), bcrio.Options{Mirror: bm, Upstreams: upstreams})
	if err != nil {
		log.Error().Err(err).Str("runtime", "crio").Msg("gen crio refused; nothing was changed")
		return
	}
	if err := o.Host.Applier(log).Apply(ctx, plan.Changes); err != nil {
		log.Error().Err(err).Str("runtime", "crio").Msg("gen crio")
		return
	}
	for _, w := range plan.Warnings {
		log.Warn().Str("runtime", "crio").Msg(w)
	}
	if !plan.Changed() {
		log.Info().Str("runtime", "crio").Msg("gen crio: drop-in already in place")
		return
	}
	res := bcrio.Reload(o.Host, log)
	log.Info().Str("runtime", "crio").Ints("sighup_pids", res.PIDs).Str("skipped", res.Skipped).Str("error", res.Error).
		Msg("gen crio: drop-in written, one SIGHUP sent (not evidence: /activez reports activation)")
}

func warmOnce(ctx context.Context, log zerolog.Logger, mirrorURL *url.URL, refs []warm.Reference) {
	p, err := warm.ParsePlatform("")
	if err != nil {
		log.Error().Err(err).Msg("warm")
		return
	}
	rep, err := warm.Run(ctx, warm.Options{Mirror: mirrorURL, Images: refs, Platform: p, Routing: warm.RoutingNS, Logger: log})
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		log.Error().Err(err).Msg("warm")
	case rep != nil:
		log.Info().Bool("warm", rep.Warm).Msg("warm finished")
	}
}
