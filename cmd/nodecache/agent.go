package main

import (
	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/pkg/agent"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
)

func agentCommand() *cli.Command {
	var (
		cfg agent.Config
		lc  logConfig
	)
	cc := &cfg.Configure
	flags := append(mirrorFlags(&cfg.Registry, &lc, agent.DefaultListen), statusFlags(&cfg.Status)...)
	flags = append(flags,
		stringFlag(&cfg.Mirror, "mirror", "", "`URL` the runtime is pointed at (default: http://<--listen>, 127.0.0.1 when --listen has no host)"),
		stringFlag(&cc.CertsDir, "certs-dir", containerd.DefaultCertsDir, "single `DIR` written into containerd's config_path when one has to be set (host path)"),
		boolFlag(&cc.Migrate, "migrate", "move containerd's legacy registry.mirrors (and 1.x configs.<host>.tls) into hosts.toml and remove them, instead of refusing"),
		stringFlag(&cc.ContainerdVersion, "containerd-version", "", "containerd `VERSION` whose rules apply (default: asked on --containerd-socket, else read from the build information of the daemon's executable or of the containerd binary under --host-root; nothing is run)"),
		stringFlag(&cc.CrioVersion, "crio-version", "", "CRI-O `VERSION` (default: asked of the running CRI-O on its socket, else read from the build information of its executable or of the crio binary under --host-root; nothing is run); >= 1.30 also gets auto_reload_registries"),
		boolFlag(&cc.NoReload, "no-reload", "do not send CRI-O the best-effort SIGHUP after writing its drop-in"),
		stringFlag(&cc.RegistriesDir, "registries-dir", crio.DefaultRegistriesDir, "containers/image drop-in `DIR` (host path)"),
		stringFlag(&cc.CrioDir, "crio-dir", crio.DefaultCrioDir, "CRI-O drop-in `DIR` (host path)"),
		durationFlag(&cc.DialTimeout, "dial-timeout", containerd.DefaultDialTimeout, "containerd: dial_timeout of every [host] in hosts.toml, the `DURATION` a connection may take before containerd tries the next host (>= 2.1; 1.7 ignores it)"),
		stringFlag(&cc.MirrorCA, "mirror-ca", "", "PEM CA `FILE` of an https mirror (host path, read under --host-root; refused for http)"),
		durationFlag(&cfg.Interval, "interval", activation.DefaultInterval, "re-evaluate activation every `DURATION` (read-only)"),
		stringSliceFlag(&cfg.Warm, "warm", nil, "`IMAGE` to pre-fill once at start and pin (never evicted; nodecache cache unpin lets it go), repeatable"),
		stringFlag(&cfg.Readiness, "readiness", activation.ReadinessServing, "what /readyz reports, a `MODE`: serving (the mirror can serve) or activation (and the runtime configuration is ACTIVE)"),
		stringFlag(&cfg.ReadyFile, "ready-file", "", "`FILE` that exists exactly while /readyz would answer 200 (for exec probes)"),
	)
	return withConfig(&cli.Command{
		Name:  "agent",
		Usage: "DaemonSet mode: serve, configure the node's runtime once, and keep reporting whether it pulls through the mirror",
		Description: `One process for a hostNetwork, hostPID DaemonSet with the host's / mounted (--host-root):

   1. serves the pull-through registry (serve's flags; --listen defaults to 127.0.0.1:5000);
   2. runs one gen pass for the runtime found under --host-root: containerd hosts.toml files
      and config_path, CRI-O drop-in plus one SIGHUP, Talos: prints the machine-config patch;
   3. pre-fills --warm images once, and pins them;
   4. re-evaluates activation every --interval (read-only), serving /activez (200 only while
      ACTIVE), the gauge nodecache_runtime_config_active{runtime}, and logging only transitions,
      each with its remedy.

It never restarts or signals containerd: when containerd must load a new config_path, the log
and /activez say "restart containerd or cycle the node".`,
		Flags: flags,
		Action: func(c *cli.Context) error {
			var err error
			if cfg.Logger, err = lc.logger(); err != nil {
				return err
			}
			cfg.Stdout = c.App.Writer
			return agent.Run(c.Context, cfg) // refused, or --root held: exit 2 (exitCode)
		},
	})
}
