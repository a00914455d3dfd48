package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/name"
)

// statusFlags are the evidence flags shared by status and agent.
func statusFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag("runtime", activation.RuntimeAuto, "runtime to examine: auto (Talos first, else containerd and CRI-O as present), containerd, crio or talos"),
		stringFlag("host-root", activation.DefaultHostRoot, "prefix of every host path (a pod with the host's / mounted at /host passes /host); /proc must be the host's (hostPID)"),
		stringFlag("containerd-config", "", "containerd's main config `FILE` (host path; default: the daemon's --config, else /etc/containerd/config.toml)"),
		stringFlag("containerd-socket", "/run/containerd/containerd.sock", "socket of the containerd that serves the kubelet (host path); picks the daemon when several run, as on Talos"),
	}
}

func statusCommand() *cli.Command {
	flags := append(statusFlags(),
		stringFlag("mirror", "", "the mirror's `URL` http(s)://host:port: it must come first, and its client evidence is asked whether this node's runtime pulled through it"),
		boolFlag("canary", "pull a fresh canary image that only the mirror serves through the runtime's CRI socket, then remove it (needs --mirror)"),
		stringFlag("output", "text", "report format: text or json"),
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
   nodecache status --host-root /host --containerd-socket /run/containerd/containerd.sock`,
		Flags: append(flags, logFlags()...),
		Action: func(c *cli.Context) error {
			output, err := outputFormat(c)
			if err != nil {
				return err
			}
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			opts, err := statusOptions(c)
			if err != nil {
				return err
			}
			if m := c.String("mirror"); m != "" {
				mm, err := name.ParseMirror(m)
				if err != nil {
					return withCode(exitUsage, err)
				}
				opts.Mirror = mm.URL
			}
			opts.Canary = c.Bool("canary")
			opts.Logger = log
			rep, err := activation.Evaluate(c.Context, opts)
			if err != nil {
				return usagef("%v", err)
			}
			if output == "json" {
				err = rep.WriteJSON(c.App.Writer)
			} else {
				err = rep.WriteText(c.App.Writer)
			}
			if err != nil {
				return withCode(exitUnknown, err)
			}
			return silentExit(rep.ExitCode())
		},
	})
}

// statusOptions binds the evidence flags shared by status and agent; refusals exit 2.
func statusOptions(c *cli.Context) (activation.Options, error) {
	o := activation.Options{
		Runtime:          c.String("runtime"),
		ContainerdConfig: c.String("containerd-config"),
		ContainerdSocket: c.String("containerd-socket"),
	}
	var errs []error
	switch o.Runtime {
	case activation.RuntimeAuto, activation.RuntimeContainerd, activation.RuntimeCRIO, activation.RuntimeTalos:
	default:
		errs = append(errs, fmt.Errorf("--runtime %q: want auto, containerd, crio or talos", o.Runtime))
	}
	if root := c.String("host-root"); root == "" {
		errs = append(errs, errors.New("--host-root is empty: want the directory the host's / is mounted at, such as / or /host"))
	} else if h, err := bootstrap.NewHost(bootstrap.HostOptions{Root: root}); err != nil {
		errs = append(errs, err)
	} else {
		o.Host = h
	}
	for _, f := range []struct{ flag, value string }{{"--containerd-config", o.ContainerdConfig}, {"--containerd-socket", o.ContainerdSocket}} {
		if f.value != "" && !filepath.IsAbs(f.value) {
			errs = append(errs, fmt.Errorf("%s %q: want an absolute host path (read under --host-root)", f.flag, f.value))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return o, usagef("%v", err)
	}
	return o, nil
}
