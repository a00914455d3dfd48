package configure

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// CrioOptions configure Crio.
type CrioOptions struct {
	Common
	// RegistriesDir is containers/image's drop-in directory (host path). Default
	// crio.DefaultRegistriesDir.
	RegistriesDir string
	// CrioDir is CRI-O's drop-in directory (host path). Default crio.DefaultCrioDir.
	CrioDir string
	// Version is --crio-version; empty: asked of the daemon (activation.RuntimeVersion).
	Version string
	// NoReload skips the best-effort SIGHUP after a change.
	NoReload bool
}

// CrioReport is the outcome of Crio: the plan's report (with the reload result) and, for a dry
// run, the diff.
type CrioReport struct {
	*crio.Report
	DryRun bool `json:"dry_run,omitempty"`
	// Diff is the unified diff of the changes (dry run only).
	Diff   string `json:"diff,omitempty"`
	mirror string
	remove bool
}

// Crio runs the CRI-O pass: version (given or asked of the running CRI-O; unknown writes no
// auto_reload drop-in; a removal asks nothing, since what is nodecache's is found on disk),
// plan or plan-remove, apply or diff, then one best-effort SIGHUP to crio when something
// changed (never evidence that CRI-O uses the mirror).
func Crio(ctx context.Context, o CrioOptions) (*CrioReport, error) {
	m, ups, fallbacks, err := o.targets()
	if err != nil {
		return nil, err
	}
	h, err := o.host()
	if err != nil {
		return nil, err
	}
	// A removal finds what is nodecache's on disk: the version decides nothing there, so an
	// unknown one is no warning (a given one is still checked).
	var v crio.Release
	var probeErr error
	if !o.Remove || o.Version != "" {
		if v, probeErr, err = release(ctx, h, o.Logger, activation.RuntimeCRIO, "--crio-version", o.Version, activation.DefaultCRIOSocket, crio.ParseRelease); err != nil {
			return nil, err
		}
	}
	opts := crio.Options{Mirror: m, Upstreams: ups, Fallbacks: fallbacks, RegistriesDir: o.RegistriesDir, CrioDir: o.CrioDir, Version: v}
	fsys := h.FS()
	if o.MirrorCA != "" && !o.Remove {
		if m.HTTP() {
			return nil, refusal.Errorf("--mirror-ca is for an https mirror; %s is http", m)
		}
		if opts.MirrorCA, err = bootstrap.ReadMirrorCA(fsys, h.Root(), o.MirrorCA); err != nil {
			return nil, err
		}
	}
	plan := crio.Plan
	if o.Remove {
		plan = crio.PlanRemove
	}
	rep, err := plan(fsys, opts)
	if err != nil {
		return nil, err
	}
	if probeErr != nil {
		rep.Warnings = append([]string{fmt.Sprintf("CRI-O version unknown (%v)", probeErr)}, rep.Warnings...)
	}
	rep.Warnings = append(rep.Warnings, mirrorWarnings(m, o.Remove)...)
	out := &CrioReport{Report: rep, DryRun: o.DryRun, mirror: m.String(), remove: o.Remove}
	if out.Diff, err = applyOrDiff(ctx, h, &o.Common, rep.Changes); err != nil {
		return nil, err
	}
	var reload crio.ReloadResult
	switch {
	case o.DryRun:
		reload.Skipped = "--dry-run"
	case o.NoReload:
		reload.Skipped = "--no-reload"
	case !rep.Changed():
		reload.Skipped = "nothing changed"
	default:
		reload = crio.Reload(h, o.Logger)
	}
	rep.Reload = &reload
	return out, nil
}

// WriteJSON writes the report as one indented JSON object.
func (r *CrioReport) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

// WriteText writes the diff (dry run), what is configured, one line per change, the warnings,
// what happened to the reload and restart_required.
func (r *CrioReport) WriteText(w io.Writer) error { return r.WriteTextSplit(w, w) }

// WriteTextSplit is WriteText with a dry run's diff alone on out (a patch), the rest on summary;
// the warnings go to summary in a real run too (out is then the report).
func (r *CrioReport) WriteTextSplit(out, summary io.Writer) error {
	t := &textWriter{w: out}
	t.printf("%s", r.Diff)
	t.w = summaryWriter(out, summary, r.DryRun)
	release := "crio " + r.Version
	if r.Version == "" || r.Version == "unknown" {
		release = "crio (version unknown)"
	}
	if r.remove {
		t.printf("crio: removing nodecache's drop-ins, CA copies and the directories gen created\n")
	} else {
		t.printf("%s: mirror %s for %s\n", release, r.mirror, strings.Join(r.Upstreams, ", "))
	}
	t.changes(r.Changes, r.DryRun)
	t.warningsTo(summary, r.Warnings)
	switch reload := r.Reload; {
	case reload == nil:
	case len(reload.PIDs) > 0:
		t.printf("sent SIGHUP to crio (pid %v) to reload registries; this is not proof that CRI-O uses the mirror\n", reload.PIDs)
	case reload.Error != "":
		t.printf("reload: %s\n", reload.Error)
	default:
		t.printf("no SIGHUP sent: %s\n", reload.Skipped)
	}
	t.printf("restart_required: %v\n", r.RestartRequired)
	return t.err
}
