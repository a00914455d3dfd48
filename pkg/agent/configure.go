package agent

import (
	"context"
	"fmt"

	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/configure"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
)

// configure runs the configure pass (package configure, as `nodecache gen`) once for each
// runtime found under the host root: Talos gets its machine-config patch printed (Talos owns its
// files), containerd its hosts.toml files and config_path, CRI-O its drop-in and one SIGHUP.
// Failures are logged with what to do, never returned.
func (p *plan) configure(ctx context.Context) {
	o := p.status
	h := o.Host
	log := p.cfg.Logger
	cc := p.cfg.Configure
	common := configure.Common{Mirror: p.mirrorURL.String(), Upstreams: p.upstreams, Host: h, MirrorCA: cc.MirrorCA, Logger: log}
	is := func(rt string) bool { return o.Runtime == activation.RuntimeAuto || o.Runtime == rt }
	exists := func(p string) bool { return p != "" && h.Exists(p) }
	if is(activation.RuntimeTalos) && activation.IsTalos(h) {
		tc := configure.TalosOptions{Common: common}
		if cc.MirrorCA != "" {
			// A host path; the patch carries the certificate itself.
			local, err := h.Local(cc.MirrorCA)
			if err != nil {
				log.Error().Err(err).Msg("gen talos")
				return
			}
			tc.MirrorCA = local
		}
		rep, err := configure.Talos(ctx, tc)
		if err != nil {
			log.Error().Err(err).Msg("gen talos")
			return
		}
		log.Warn().Str("runtime", "talos").Str("remedy", "apply this machine-config patch (talosctl patch mc --patch @file); Talos applies mirror changes live").
			Msg("gen talos: machine-config patch")
		fmt.Fprint(p.cfg.Stdout, rep.Patch)
		return
	}
	cfg := o.ContainerdConfig
	if cfg == "" {
		cfg = containerd.DefaultConfig
	}
	var absent []string // what was looked for and not found, for the line when nothing is configured
	if o.Runtime == activation.RuntimeTalos {
		absent = append(absent, "Talos (the host is not a Talos node)")
	}
	if is(activation.RuntimeContainerd) {
		if exists(cfg) || exists(o.ContainerdSocket) {
			p.containerd(ctx, configure.ContainerdOptions{Common: common, Config: cfg, CertsDir: cc.CertsDir,
				Version: cc.ContainerdVersion, Migrate: cc.Migrate, Socket: o.ContainerdSocket, DialTimeout: cc.DialTimeout})
		} else {
			absent = append(absent, fmt.Sprintf("containerd (neither its config %s nor its socket %s exists)", cfg, o.ContainerdSocket))
		}
	}
	dropIns := cc.CrioDir
	if dropIns == "" {
		dropIns = crio.DefaultCrioDir
	}
	if is(activation.RuntimeCRIO) {
		if exists(activation.DefaultCRIOConfig) || exists(dropIns) {
			p.crio(ctx, configure.CrioOptions{Common: common, RegistriesDir: cc.RegistriesDir, CrioDir: cc.CrioDir,
				Version: cc.CrioVersion, NoReload: cc.NoReload})
		} else {
			absent = append(absent, fmt.Sprintf("CRI-O (neither %s nor %s exists)", activation.DefaultCRIOConfig, dropIns))
		}
	}
	if len(absent) > 0 && (o.Runtime != activation.RuntimeAuto || len(absent) == 2) {
		log.Warn().Str("host_root", h.Root()).Strs("not_found", absent).
			Str("remedy", "check --host-root (the host's / mounted there), --runtime, --containerd-config and --containerd-socket (host paths)").
			Msg("configure: no runtime configuration found to configure; nothing was written")
	}
}

func (p *plan) containerd(ctx context.Context, o configure.ContainerdOptions) {
	log := p.cfg.Logger.With().Str("runtime", "containerd").Logger()
	rep, err := configure.Containerd(ctx, o)
	switch {
	case configure.Refused(err):
		log.Error().Err(err).Msg("gen containerd refused; nothing was changed")
		return
	case err != nil:
		log.Error().Err(err).Msg("gen containerd")
		return
	}
	for _, w := range rep.Warnings {
		log.Warn().Msg(w)
	}
	ev := log.Info().Str("config_path", rep.ConfigPath).Str("hosts_dir", rep.HostsDir).Bool("restart_required", rep.RestartRequired)
	if rep.RestartReason != "" {
		ev = ev.Str("restart_reason", rep.RestartReason)
	}
	if rep.RestartRequired {
		ev = ev.Str("remedy", "restart containerd or cycle the node (nodecache never restarts containerd)")
	}
	ev.Msg("gen containerd")
}

// crio writes the registries.conf.d drop-in and, when something changed, sends CRI-O its one
// best-effort SIGHUP (never evidence: the monitor judges activation on its own).
func (p *plan) crio(ctx context.Context, o configure.CrioOptions) {
	log := p.cfg.Logger.With().Str("runtime", "crio").Logger()
	rep, err := configure.Crio(ctx, o)
	switch {
	case configure.Refused(err):
		log.Error().Err(err).Msg("gen crio refused; nothing was changed")
		return
	case err != nil:
		log.Error().Err(err).Msg("gen crio")
		return
	}
	for _, w := range rep.Warnings {
		log.Warn().Msg(w)
	}
	if !rep.Changed() {
		log.Info().Msg("gen crio: drop-in already in place")
		return
	}
	res := rep.Reload
	log.Info().Ints("sighup_pids", res.PIDs).Str("skipped", res.Skipped).Str("error", res.Error).
		Msg("gen crio: drop-in written, one SIGHUP sent (not evidence: /activez reports activation)")
}
