package main

import (
	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/name"
)

// statusFlags are the evidence flags shared by status and agent, bound into o.
func statusFlags(o *activation.Flags) []cli.Flag {
	return []cli.Flag{
		stringFlag(&o.Runtime, "runtime", activation.RuntimeAuto, "`RUNTIME` to examine: auto (Talos first, else containerd and CRI-O as present), containerd, crio or talos"),
		stringFlag(&o.HostRoot, "host-root", activation.DefaultHostRoot, "`DIR` prefixed to every host path (a pod with the host's / mounted at /host passes /host); /proc must be the host's (hostPID)"),
		stringFlag(&o.ContainerdConfig, "containerd-config", "", "containerd's main config `FILE` (host path; default: the daemon's --config, else /etc/containerd/config.toml)"),
		stringFlag(&o.ContainerdSocket, "containerd-socket", "/run/containerd/containerd.sock", "socket `PATH` of the containerd that serves the kubelet (a host path); picks the daemon when several run, as on Talos"),
	}
}

func statusCommand() *cli.Command {
	var (
		f              activation.Flags
		canary         bool
		mirror, output string
		lc             logConfig
	)
	flags := append(statusFlags(&f),
		stringFlag(&mirror, "mirror", "", "the mirror's `URL` http(s)://host:port: it must come first, and its client evidence is asked whether this node's runtime pulled through it"),
		stringSliceFlag(&f.Upstreams, "upstream", nil, "registry `NAME` (or NAME=URL as gen takes it) that must pull through the mirror, repeatable (default: containerd and Talos: every registry whose hosts.toml nodecache wrote or adopted or names the mirror; CRI-O: the prefixes of nodecache's drop-in)"),
		boolFlag(&canary, "canary", "pull a fresh canary image that only the mirror serves through the runtime's CRI socket, then remove it (needs --mirror)"),
		stringFlag(&output, "output", "text", "report `FORMAT`: text or json"),
	)
	return withConfig(&cli.Command{
		Name:  "status",
		Usage: "tell from runtime evidence whether the node's runtime really pulls through the mirror",
		Description: `Examines the running runtime, not only the files: which process serves the runtime socket
and when it started, what configuration it loaded (containerd >= 2.4 introspection, 1.x CRI
status, 2.0-2.3 start time against config mtimes, strictly), how containerd's hosts.toml parser
and containers/image's registries parser read the files on disk, and, with --mirror, whether
the mirror saw this node's runtime pull. One row per check, each with its reason.

Exit codes: 0 ACTIVE; 1 NOT active (or not yet: the remedy says what to do); 2 a flag refused
(--host-root must be an existing directory); 3 cannot tell (evidence unreadable, or no runtime
and no runtime configuration, or the --runtime asked for is not on this node: not applicable).

Examples:
   nodecache status
   nodecache status --mirror http://127.0.0.1:5000 --canary --output json
   nodecache status --mirror http://127.0.0.1:5000 --upstream docker.io --upstream registry.local:5000
   nodecache status --host-root /host --containerd-socket /run/containerd/containerd.sock`,
		Flags: append(flags, logFlags(&lc, true)...),
		Action: func(c *cli.Context) error {
			if err := outputFormat(output); err != nil {
				return err
			}
			log, err := lc.logger()
			if err != nil {
				return err
			}
			o, err := f.Options()
			if err != nil {
				return err // refused: exit 2
			}
			if mirror != "" {
				m, err := name.ParseMirror(mirror)
				if err != nil {
					return withCode(exitUsage, err)
				}
				o.Mirror = m.URL
			}
			o.Canary, o.Logger = canary, log
			rep, err := activation.Evaluate(c.Context, o)
			if err != nil {
				return err // options refused: exit 2
			}
			if err := clitext.Render(c.App.Writer, output, rep); err != nil {
				return withCode(exitUnknown, err)
			}
			return silentExit(rep.ExitCode())
		},
	})
}
