package main

import (
	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bootstrap/configure"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
)

func genCommand() *cli.Command {
	return &cli.Command{
		Name:  "gen",
		Usage: "point a node's runtime at the mirror: Talos patch, containerd hosts.toml, CRI-O drop-in",
		Description: `Exit codes: 0 generated (or nothing to change); 1 writing failed; 2 a flag or a runtime
config file refused, nothing was changed. restart_required is reported, never acted on:
nodecache never restarts or signals containerd.`,
		Subcommands: []*cli.Command{genTalosCommand(), genContainerdCommand(), genCrioCommand()},
	}
}

// genFlags are the flags every gen subcommand has, bound into c, output and lc.
func genFlags(c *configure.Common, output *string, lc *logConfig, more ...cli.Flag) []cli.Flag {
	flags := []cli.Flag{
		stringFlag(&c.Mirror, "mirror", "", "nodecache `URL` the runtime pulls through, e.g. http://10.0.0.5:5000 (http://127.0.0.1:5000 for a hostNetwork agent); required"),
		stringSliceFlag(&c.Upstreams, "upstream", nil, "registry `NAME[=URL]` to pull through the mirror, repeatable (default: serve's set: docker.io, ghcr.io, registry.k8s.io, quay.io, gcr.io). The fallback after the mirror is the registry itself: https://NAME (docker.io: https://registry-1.docker.io), or URL when its host is NAME, e.g. registry.local:5000=http://registry.local:5000 for an http-only registry; a URL naming another host is refused"),
		stringFlag(&c.MirrorCA, "mirror-ca", "", "PEM CA `FILE` of an https mirror (refused for http); gen containerd and crio: a host path, read under --host-root; gen talos: a file on this machine"),
		stringFlag(output, "output", "text", "report `FORMAT`: text or json"),
		boolFlag(&c.DryRun, "dry-run", "print what would change as a unified diff; write nothing (gen talos: with --out FILE, the patch file it would replace)"),
		boolFlag(&c.Remove, "remove", "undo: remove nodecache's files and restore edited ones from their backups"),
	}
	return append(append(flags, more...), logFlags(lc, true)...)
}

func hostRootFlag(dst *string) cli.Flag {
	return stringFlag(dst, "host-root", "/", "`DIR` prefixed to every host path (a pod with the host's / mounted there)")
}

// genAction checks --output and the log flags, runs one configure pass and renders its report.
// A refusal exits 2, any other failure 1 (exitCode).
func genAction[R clitext.Renderer](common *configure.Common, output *string, lc *logConfig, run func(*cli.Context) (R, error)) cli.ActionFunc {
	return func(c *cli.Context) error {
		if err := outputFormat(*output); err != nil {
			return err
		}
		log, err := lc.logger()
		if err != nil {
			return err
		}
		common.Logger, common.Reported = log, true
		rep, err := run(c)
		if err != nil {
			return err
		}
		return withCode(exitNegative, clitext.RenderSplit(c.App.Writer, c.App.ErrWriter, *output, rep))
	}
}

func genTalosCommand() *cli.Command {
	var (
		o      configure.TalosOptions
		output string
		lc     logConfig
	)
	return withConfig(&cli.Command{
		Name:  "talos",
		Usage: "print (or -o write) the Talos machine-config patch",
		Description: `Use the patch with 'talosctl gen config --config-patch @patch.yaml' or
'talosctl patch machineconfig --patch @patch.yaml'; --remove prints the $patch: delete patch that
takes it out again: with --machine-config FILE (and --mirror) exactly the mirrors of that config
whose endpoints include the mirror; without it the --upstream list, which must be the list the
patch was made with (a name the node does not have makes the patch fail). Talos applies mirror
changes without a reboot.`,
		Flags: genFlags(&o.Common, &output, &lc,
			stringFlag(&o.TalosVersion, "talos-version", talos.DefaultVersion(), "target Talos `vX.Y.Z`: >= v1.12 gets RegistryMirrorConfig documents, <= v1.11 the machine.registries patch"),
			boolFlag(&o.SkipFallback, "skip-fallback", "never fall back to the real registry (Talos >= v1.9; refused with a loopback mirror)"),
			boolFlag(&o.PathPrefix, "path-prefix", "endpoint <mirror>/v2/<NAME> with overridePath instead of ?ns= routing"),
			stringFlag(&o.MachineConfig, "machine-config", "", "with --remove: the node's current machine config `FILE` (`talosctl read /system/state/config.yaml` or `talosctl get machineconfig -o yaml` output); the removal then deletes exactly the mirrors whose endpoints include --mirror"),
			stringFlag(&o.Out, "out", "", "write the patch to `FILE` (replaced only when it is nodecache's) instead of printing it", "o"),
		),
		Action: genAction(&o.Common, &output, &lc, func(c *cli.Context) (*configure.TalosReport, error) {
			rep, err := configure.Talos(c.Context, o)
			if err == nil {
				err = rep.WriteWarnings(c.App.ErrWriter)
			}
			return rep, err
		}),
	})
}

func genContainerdCommand() *cli.Command {
	var (
		o      configure.ContainerdOptions
		output string
		lc     logConfig
	)
	return withConfig(&cli.Command{
		Name:  "containerd",
		Usage: "write hosts.toml per upstream and, when needed, registry config_path in config.toml",
		Description: `Reads config.toml merged with its imports the way containerd does, adopts an existing
single-directory config_path (no restart), else sets one directory (--certs-dir) and reports
restart_required. Refuses (exit 2, nothing changed): schema 1, legacy mirrors next to config_path
(unless --migrate), k3s/RKE2 and Talos. config.toml is edited in place by byte range, backed up
once to <file>.nodecache.bak. A per-host directory the site already has (host:port or
host_port_) is never shadowed: its hosts.toml gets the mirror as its first [host] if containerd's
parser accepts the result (refused, exit 2, naming the file otherwise), the rest kept byte for
byte; --remove gives the file back.`,
		Flags: genFlags(&o.Common, &output, &lc, hostRootFlag(&o.HostRoot),
			stringFlag(&o.Config, "containerd-config", containerd.DefaultConfig, "containerd's main config `PATH` (host path)"),
			stringFlag(&o.CertsDir, "certs-dir", containerd.DefaultCertsDir, "the single `DIR` written into config_path when it has to be set"),
			stringFlag(&o.Version, "containerd-version", "", "containerd `VERSION` whose rules apply (default: asked of the running containerd on its socket, else read from the build information of its executable or of the containerd binary under --host-root; nothing is run)"),
			boolFlag(&o.Migrate, "migrate", "move legacy registry.mirrors (and 1.x configs.<host>.tls) into hosts.toml and remove them, instead of refusing"),
			durationFlag(&o.DialTimeout, "dial-timeout", containerd.DefaultDialTimeout, "dial_timeout of every [host] in hosts.toml: containerd tries the next host (at last the registry) when a connection takes this `DURATION`, instead of 30 s per request when the mirror drops SYNs (down, firewalled, a full accept queue); read by containerd >= 2.1, ignored by 1.7"),
		),
		Action: genAction(&o.Common, &output, &lc, func(c *cli.Context) (*configure.ContainerdReport, error) { return configure.Containerd(c.Context, o) }),
	})
}

func genCrioCommand() *cli.Command {
	var (
		o      configure.CrioOptions
		output string
		lc     logConfig
	)
	return withConfig(&cli.Command{
		Name:  "crio",
		Usage: "write the registries.conf.d drop-in (and crio.conf.d auto_reload for CRI-O >= 1.30)",
		Description: `Writes 90-nodecache.conf with one [[registry]] per upstream whose mirror is
<mirror host:port>/<NAME>. The main registries.conf is never edited. After a change, one
best-effort SIGHUP goes to the process named exactly crio (--no-reload to skip); it is logged,
never taken as proof that CRI-O uses the mirror.`,
		Flags: genFlags(&o.Common, &output, &lc, hostRootFlag(&o.HostRoot),
			stringFlag(&o.RegistriesDir, "registries-dir", crio.DefaultRegistriesDir, "containers/image drop-in `DIR` (host path)"),
			stringFlag(&o.CrioDir, "crio-dir", crio.DefaultCrioDir, "CRI-O drop-in `DIR` (host path)"),
			stringFlag(&o.Version, "crio-version", "", "CRI-O `VERSION` (default: asked of the running CRI-O on its socket, else read from the build information of its executable or of the crio binary under --host-root; nothing is run); >= 1.30 also gets auto_reload_registries"),
			boolFlag(&o.NoReload, "no-reload", "do not send CRI-O the best-effort SIGHUP after writing"),
		),
		Action: genAction(&o.Common, &output, &lc, func(c *cli.Context) (*configure.CrioReport, error) { return configure.Crio(c.Context, o) }),
	})
}
