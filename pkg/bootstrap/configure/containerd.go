package configure

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// ContainerdOptions configure Containerd.
type ContainerdOptions struct {
	Common
	// Config is containerd's main config file (host path). Default containerd.DefaultConfig.
	Config string
	// CertsDir is the single directory written into config_path when one has to be set.
	// Default containerd.DefaultCertsDir.
	CertsDir string
	// Version is --containerd-version; empty: asked of the daemon (activation.RuntimeVersion).
	Version string
	// Migrate moves legacy registry.mirrors into hosts.toml instead of refusing them.
	Migrate bool
	// Socket is the socket the running containerd is asked for its version on. Default: the
	// grpc address of Config (activation.ContainerdSocket).
	Socket string
	// DialTimeout is --dial-timeout, written as dial_timeout in every [host] of the hosts.toml
	// files (containerd.Options.DialTimeout). Required positive unless Remove: the flag defaults
	// to containerd.DefaultDialTimeout; 0 or less is refused (containerd would take "0s" as no
	// bound at all: the kernel's SYN retries, about 2 minutes).
	DialTimeout time.Duration
}

// ContainerdReport is the outcome of Containerd: the plan's report plus the restart evidence
// and, for a dry run, the diff.
type ContainerdReport struct {
	*containerd.Report
	// RestartReason says why a restart is required although nodecache changed no config file
	// this run (containerd started before the file that sets config_path last changed).
	RestartReason string `json:"restart_reason,omitempty"`
	DryRun        bool   `json:"dry_run,omitempty"`
	// Diff is the unified diff of the changes (dry run only).
	Diff   string `json:"diff,omitempty"`
	remove bool
}

// Containerd runs the containerd pass: version (given or probed; an unknown one is a warning),
// plan or plan-remove, apply or diff, and, when no config file changes, the restart evidence.
// It never restarts or signals containerd.
func Containerd(ctx context.Context, o ContainerdOptions) (*ContainerdReport, error) {
	m, ups, fallbacks, err := o.targets()
	if err != nil {
		return nil, err
	}
	if o.DialTimeout <= 0 && !o.Remove {
		return nil, refusal.Errorf("--dial-timeout %s: %s", o.DialTimeout, containerd.DialTimeoutWant)
	}
	h, err := o.host()
	if err != nil {
		return nil, err
	}
	socket := o.Socket
	if socket == "" {
		socket = activation.ContainerdSocket(h, o.Config)
	}
	daemon, probeErr, err := release(ctx, h, o.Logger, activation.RuntimeContainerd, "--containerd-version", o.Version, socket, containerd.ParseRelease)
	if err != nil {
		return nil, err
	}
	opts := containerd.Options{Mirror: m, Upstreams: ups, Fallbacks: fallbacks, Config: o.Config, CertsDir: o.CertsDir,
		MirrorCA: o.MirrorCA, Migrate: o.Migrate, Daemon: daemon, DialTimeout: o.DialTimeout}
	fsys := h.FS()
	if opts.MirrorCA != "" && !o.Remove && !m.HTTP() {
		// Read here for a message that names the file under --host-root; Plan checks it again.
		if _, err := bootstrap.ReadMirrorCA(fsys, h.Root(), opts.MirrorCA); err != nil {
			return nil, err
		}
	}
	plan := containerd.Plan
	if o.Remove {
		plan = containerd.PlanRemove
	}
	rep, err := plan(fsys, opts)
	if err != nil {
		if probeErr != nil && !o.Remove {
			// The refusal (a missing config.toml, say) does not tell why the version is unknown.
			o.Logger.Warn().Err(probeErr).Msg("containerd version unknown")
		}
		return nil, err
	}
	// A removal needs the version only to recognise a config file it restores from its backup;
	// deleting its own files (or finding nothing) does not depend on it. The warning is the
	// report's, not a log line too.
	if probeErr != nil && (!o.Remove || slices.ContainsFunc(rep.Changes, func(c bootstrap.Change) bool { return c.Action == bootstrap.ActionRestore })) {
		rep.Warnings = append([]string{fmt.Sprintf("containerd version unknown (%v); pass --containerd-version", probeErr)}, rep.Warnings...)
	}
	rep.Warnings = append(rep.Warnings, mirrorWarnings(m, o.Remove)...)
	out := &ContainerdReport{Report: rep, DryRun: o.DryRun, remove: o.Remove}
	if out.Diff, err = applyOrDiff(ctx, h, &o.Common, rep.Changes); err != nil {
		return nil, err
	}
	if !o.Remove && !rep.RestartRequired {
		var warn string
		out.RestartReason, warn = startedBefore(h, rep.Config, daemon)
		if warn != "" {
			rep.Warnings = append(rep.Warnings, warn)
		}
		rep.RestartRequired = out.RestartReason != ""
	}
	return out, nil
}

// startedBefore checks a config nodecache did not change this run: containerd reads its
// configuration only at start, so when it changed after the running containerd started (the
// restart-evidence rule status uses too: activation.ContainerdRestart, the daemon serving the
// config's grpc address, the newest of config.toml and its imports, ±10 ms), that daemon does
// not use it yet. reason is "" when the daemon loaded it, or when no containerd is visible; warn
// says why the check could not be made.
func startedBefore(h *bootstrap.Host, config string, daemon containerd.Release) (reason, warn string) {
	eff, err := containerd.Load(h.FS(), config, containerd.LoadOptions{Daemon: daemon})
	if err != nil || !eff.Exists {
		return "", ""
	}
	ev, err := activation.ContainerdRestart(h, eff, eff.GRPCAddress)
	switch {
	case err != nil:
		return "", fmt.Sprintf("cannot tell whether the running containerd read %s: %v", eff.Path, err)
	case ev.RestartRequired():
		return ev.Reason("containerd"), ""
	}
	return "", ""
}

// WriteJSON writes the report as one indented JSON object.
func (r *ContainerdReport) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

// WriteText writes the diff (dry run), the config facts, one line per change, the warnings and
// restart_required with what to do about it.
func (r *ContainerdReport) WriteText(w io.Writer) error { return r.WriteTextSplit(w, w) }

// WriteTextSplit is WriteText with a dry run's diff alone on out, so that out is a unified diff
// `patch -p1` applies under the host root, and everything else on summary; the warnings go to
// summary in a real run too (out is then the report).
func (r *ContainerdReport) WriteTextSplit(out, summary io.Writer) error {
	t := &textWriter{w: out}
	t.printf("%s", r.Diff)
	t.w = summaryWriter(out, summary, r.DryRun)
	if r.remove && len(r.Changes) == 0 {
		t.printf("containerd: nothing to remove (no file of nodecache's, no config edit of its)\n")
		t.warningsTo(summary, r.Warnings)
		return t.err
	}
	assumed := ""
	if r.DaemonAssumed {
		assumed = ", assumed"
	}
	t.printf("containerd config: %s (schema %d, containerd %s%s)\n", r.Config, r.Schema, r.Daemon, assumed)
	if !r.remove {
		where := r.EditedFile
		if where == "" {
			where = "unchanged"
		}
		t.printf("registry table: %s (edited file: %s)\n", r.RegistryTable, where)
		t.printf("config_path: %s (%s); hosts.toml in %s; transfer service: %v\n", r.ConfigPath, r.ConfigPathAction, r.HostsDir, r.TransferService)
		for _, h := range r.Migrated {
			t.printf("migrated legacy settings of %s into hosts.toml\n", h)
		}
	}
	t.changes(r.Changes, r.DryRun)
	t.warningsTo(summary, r.Warnings)
	if r.RestartReason != "" {
		t.printf("restart_required: true (%s)\n", r.RestartReason)
	} else {
		t.printf("restart_required: %v\n", r.RestartRequired)
	}
	if r.RestartRequired && !r.DryRun {
		t.printf("containerd reads config_path only at start: restart containerd (or cycle the node); nodecache never restarts it\n")
	}
	return t.err
}
