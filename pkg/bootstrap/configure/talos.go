package configure

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// TalosOptions configure Talos. HostRoot is not used: the patch is for talosctl, and Out and
// MirrorCA are files on this machine.
type TalosOptions struct {
	Common
	// TalosVersion is the target release vX.Y.Z. Default talos.DefaultVersion().
	TalosVersion string
	// SkipFallback and PathPrefix are passed to talos.Generate.
	SkipFallback, PathPrefix bool
	// MachineConfig is --machine-config, with Remove only: the node's current machine config
	// file (talos.ParseMachineConfig); the removal then deletes exactly the mirrors whose
	// endpoints include Mirror.
	MachineConfig string
	// Out is -o: the file the patch is written to (replaced only when it is nodecache's).
	// Empty: the patch is only returned (and printed by WriteText).
	Out string
}

// TalosReport is the generated patch and, with Out, the file change.
type TalosReport struct {
	*talos.Result
	File    string             `json:"file,omitempty"`
	Changes []bootstrap.Change `json:"changes,omitempty"`
	DryRun  bool               `json:"dry_run,omitempty"`
	diff    string
}

// Talos generates the machine-config patch and, with Out, writes it (or diffs it, DryRun).
// DryRun without Out is refused: the patch is only printed then.
func Talos(ctx context.Context, o TalosOptions) (*TalosReport, error) {
	m, ups, fallbacks, err := o.targets()
	if err != nil {
		return nil, err
	}
	if o.DryRun && o.Out == "" {
		return nil, refusal.Errorf("--dry-run needs -o FILE: without it gen talos only prints")
	}
	opts := talos.Options{Mirror: m, Upstreams: ups, Fallbacks: fallbacks, TalosVersion: o.TalosVersion,
		SkipFallback: o.SkipFallback, PathPrefix: o.PathPrefix, Remove: o.Remove}
	if p := o.MachineConfig; p != "" {
		if !o.Remove {
			return nil, refusal.Errorf("--machine-config is for --remove: the node's config tells which mirrors to delete")
		}
		data, err := inputfile.Read(p, inputfile.MachineConfig)
		if err != nil {
			return nil, refusal.Errorf("--machine-config: %v", err)
		}
		if opts.MachineConfig, err = talos.ParseMachineConfig(p, data); err != nil {
			return nil, err
		}
	}
	if p := o.MirrorCA; p != "" {
		// A file on this machine (the patch carries it), so a relative path is fine.
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, refusal.Errorf("--mirror-ca %q: %v", p, err)
		}
		ca, err := bootstrap.ReadMirrorCA(bootstrap.HostFS("/"), "", abs)
		if err != nil {
			return nil, err
		}
		opts.MirrorCA, opts.MirrorCAName = ca, p
	}
	res, err := talos.Generate(opts)
	if err != nil {
		return nil, err
	}
	res.Warnings = append(res.Warnings, mirrorWarnings(m, o.Remove)...)
	rep := &TalosReport{Result: res, File: o.Out, DryRun: o.DryRun}
	if o.Out == "" || res.NothingToRemove != "" { // nothing to remove: -o FILE is left as it is
		return rep, nil
	}
	local, err := bootstrap.NewHost(bootstrap.HostOptions{Root: "/"})
	if err != nil {
		return nil, err
	}
	fsys := local.FS()
	abs := o.Out
	if !strings.HasPrefix(abs, "/") {
		wd, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		abs = wd + "/" + o.Out
	}
	if err := checkOutFile(fsys, o.Out, abs); err != nil {
		return nil, err
	}
	ch, err := bootstrap.PlanOwned(fsys, abs, 0o644, []byte(res.Patch))
	if err != nil {
		return nil, err
	}
	// A link at -o stays; the file it leads to is written.
	if rep.Changes, err = bootstrap.ResolveChanges(fsys, []bootstrap.Change{ch}); err != nil {
		return nil, err
	}
	if rep.diff, err = applyOrDiff(ctx, local, &o.Common, rep.Changes); err != nil {
		return nil, err
	}
	return rep, nil
}

// checkOutFile refuses an -o path that is a directory or whose directory does not exist: gen
// writes one file and creates no directories for it. It also refuses what is not a regular file
// (a device such as /dev/null or /dev/full, a pipe such as /dev/stdout, a socket) and a file
// larger than inputfile.Patch.Limit: gen reads the file first (ownership, diff) and replaces it
// atomically with a temporary file renamed over it, which works for a regular file only. To
// send the patch to standard output, leave out -o.
func checkOutFile(fsys fs.FS, out, abs string) error {
	if err := inputfile.Check(abs, inputfile.Patch); inputfile.Refused(err) {
		if fi, serr := os.Stat(abs); serr != nil || !fi.IsDir() {
			return refusal.Errorf("-o %s: %v (gen reads it, then replaces it atomically: leave out -o to print the patch to standard output)", out, err)
		}
	}
	real, err := bootstrap.Resolve(fsys, abs)
	if err != nil {
		return err
	}
	dir := path.Dir(real)
	switch fi, err := fs.Stat(fsys, bootstrap.FSName(dir)); {
	case errors.Is(err, fs.ErrNotExist):
		return refusal.Errorf("-o %s: directory %s does not exist: create it first (gen writes the file only)", out, dir)
	case err != nil:
		return refusal.Errorf("-o %s: directory %s: %v", out, dir, err)
	case !fi.IsDir():
		return refusal.Errorf("-o %s: %s is not a directory", out, dir)
	}
	if fi, err := fs.Stat(fsys, bootstrap.FSName(real)); err == nil && fi.IsDir() {
		return refusal.Errorf("-o %s: is a directory; want a file path, e.g. %s", out, path.Join(real, "nodecache-patch.yaml"))
	}
	return nil
}

// WriteWarnings writes one "warning: " line per warning of the generated patch (what a removal
// also takes away); gen writes them to stderr, next to the patch on stdout.
func (r *TalosReport) WriteWarnings(w io.Writer) error {
	t := &textWriter{w: w}
	t.warnings(r.Warnings)
	return t.err
}

// WriteJSON writes the result, with the file and its change when -o was given.
func (r *TalosReport) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

// WriteText writes the patch itself when it is not written to a file; else the diff (dry
// run), the change and one summary line.
func (r *TalosReport) WriteText(w io.Writer) error { return r.WriteTextSplit(w, w) }

// WriteTextSplit is WriteText with a dry run's diff alone on out (a patch), the rest on summary.
func (r *TalosReport) WriteTextSplit(out, summary io.Writer) error {
	t := &textWriter{w: out}
	if r.NothingToRemove != "" {
		t.w = summary
		t.printf("%s: nothing to remove\n", r.NothingToRemove)
		return t.err
	}
	if r.File == "" {
		t.printf("%s", r.Patch)
		return t.err
	}
	t.printf("%s", r.diff)
	t.w = summaryWriter(out, summary, r.DryRun)
	t.changes(r.Changes, r.DryRun)
	t.printf("talos %s patch (%s form) for %s\n", r.TalosVersion, r.Form, strings.Join(r.Upstreams, ", "))
	return t.err
}
