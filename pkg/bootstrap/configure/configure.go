// Package configure is the configure workflow `nodecache gen` and the agent share: for one
// runtime it finds the runtime's version (given, else probed), plans the files (package
// containerd, crio or talos), applies them or renders them as a unified diff (--dry-run),
// looks for restart evidence (containerd) or sends the best-effort reload (CRI-O), and returns
// a report that renders itself as text and JSON.
//
// Errors that wrap bootstrap.ErrRefused mean the input was refused and nothing was changed
// (the CLI exits 2); any other error means the work failed (exit 1). Messages name the CLI
// flags (--mirror, --containerd-version, ...), which are the options' names on the command line.
package configure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Common are the options every runtime's pass takes.
type Common struct {
	// Mirror is the nodecache URL the runtime pulls through (--mirror), e.g.
	// http://10.0.0.5:5000. Required unless Remove.
	Mirror string
	// Upstreams are --upstream values, NAME or NAME=URL (only NAME is used). Empty: serve's
	// default set.
	Upstreams []string
	// HostRoot is the directory the host's / is mounted at (--host-root). Default "/".
	// Ignored when Host is set.
	HostRoot string
	// Host is the view of the node every read, write, link and process lookup goes through.
	// Default: bootstrap.NewHost over HostRoot.
	Host *bootstrap.Host
	// MirrorCA is --mirror-ca, the PEM CA file of an https mirror (a host path for containerd
	// and CRI-O; a file on this machine for Talos). Empty: none.
	MirrorCA string
	// DryRun plans and renders the unified diff; nothing is written or signalled.
	DryRun bool
	// Remove plans the undo: nodecache's files removed, edited files restored from backups.
	Remove bool
	// Logger receives one line per file written and the probes' failures. Default: disabled.
	Logger zerolog.Logger
	// Reported means the caller prints the report (gen): each file written, removed or
	// restored, and each SIGHUP sent, is then logged at debug level, not info, so that on a
	// terminal a change shows once (issue 26). The agent, which prints no report, leaves it
	// false.
	Reported bool
}

// targets parses Mirror (required unless Remove, or when given; name.ParseMirror), Upstreams
// and their fallbacks (bootstrap.Fallbacks). Every error wraps bootstrap.ErrRefused.
func (c *Common) targets() (name.Mirror, []string, map[string]string, error) {
	var m name.Mirror
	if !c.Remove || c.Mirror != "" {
		var err error
		if m, err = name.ParseMirror(c.Mirror); err != nil {
			return m, nil, nil, &refusal.Error{Reason: err.Error()}
		}
	}
	ups, err := bootstrap.UpstreamNames(c.Upstreams)
	if err != nil {
		return m, nil, nil, err
	}
	fallbacks, err := bootstrap.Fallbacks(c.Upstreams)
	return m, ups, fallbacks, err
}

// mirrorWarnings are the warnings about the mirror a runtime is pointed at (none for a
// removal): a cluster DNS name (name.Mirror.ClusterDNS), which a node's runtime cannot resolve
// (issue 26: the shared mode's Service name given to gen).
func mirrorWarnings(m name.Mirror, remove bool) []string {
	if remove || !m.ClusterDNS() {
		return nil
	}
	return []string{fmt.Sprintf("--mirror %s names a Kubernetes cluster DNS name, which only pods resolve: the node's runtime "+
		"resolves with the node's resolver, and on some CNIs cannot reach a ClusterIP from the host network either, "+
		"so its pulls would skip the mirror. Give an address the nodes reach: the Service's NodePort "+
		"(http://<node IP>:<nodePort>) or LoadBalancer address, or a host's IP (docs/deploy.md, \"Kubernetes: a shared cache\")", m)}
}

// host returns Host, else the view over HostRoot (a refusal naming --host-root when it is not
// a directory).
func (c *Common) host() (*bootstrap.Host, error) {
	if c.Host != nil {
		return c.Host, nil
	}
	return bootstrap.NewHost(bootstrap.HostOptions{Root: c.HostRoot})
}

// applyOrDiff renders the unified diff of changes (c.DryRun) or applies them on h (c.Logger, c.Reported).
func applyOrDiff(ctx context.Context, h *bootstrap.Host, c *Common, changes []bootstrap.Change) (string, error) {
	if c.DryRun {
		return bootstrap.Diff(changes)
	}
	a := h.Applier(c.Logger)
	a.Reported = c.Reported
	return "", a.Apply(ctx, changes)
}

// release is the runtime's release: the one given on the command line, read by parse (flag
// names it in a refusal), else the one the running runtime reports on socket
// (activation.RuntimeVersion: never runs a host binary); when that fails, probeErr says why and
// the release is zero. R is the runtime's release type, which holds its rules
// (containerd.Release, crio.Release): a bootstrap.Version by another name.
func release[R ~struct{ Major, Minor, Patch int }](ctx context.Context, h *bootstrap.Host, log zerolog.Logger, runtime, flag, given, socket string,
	parse func(string) (R, error)) (r R, probeErr, err error) {
	if given != "" {
		if r, err = parse(given); err != nil {
			return r, nil, refusal.Errorf("%s: %v", flag, err)
		}
		return r, nil, nil
	}
	dv, probeErr := activation.RuntimeVersion(ctx, h, runtime, socket)
	if probeErr != nil {
		return r, probeErr, nil
	}
	log.Debug().Str("version", dv.Raw).Str("from", dv.Source).Msg(runtime + " version")
	return R(dv.Version), nil, nil
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// summaryWriter is where a report's lines after the diff go: summary for a dry run (its stdout
// is the diff alone), else out.
func summaryWriter(out, summary io.Writer, dryRun bool) io.Writer {
	if dryRun {
		return summary
	}
	return out
}

// textWriter collects the first write error so a report renders with plain Fprintf calls.
type textWriter struct {
	w   io.Writer
	err error
}

func (t *textWriter) printf(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, format, args...)
	}
}

// changes writes one line per change ("would " first for a change a dry run did not make; an
// unchanged file is unchanged either way).
func (t *textWriter) changes(changes []bootstrap.Change, dryRun bool) {
	for _, ch := range changes {
		verb := ""
		if dryRun && ch.Changed() {
			verb = "would "
		}
		line := fmt.Sprintf("%s%s %s", verb, ch.Action, ch.Path)
		if ch.Via != "" {
			line += " (via symbolic link " + ch.Via + ")"
		}
		if ch.Action == bootstrap.ActionUpdate && ch.Backup != "" {
			line += " (backup " + ch.Backup + ")"
		}
		if ch.Action == bootstrap.ActionRestore {
			line += " (from " + ch.Backup + ")"
		}
		if ch.Note != "" {
			line += ": " + ch.Note
		}
		t.printf("%s\n", line)
	}
}

func (t *textWriter) warnings(ws []string) {
	for _, s := range ws {
		t.printf("warning: %s\n", s)
	}
}

// warningsTo writes the warning lines to w (a report's summary writer: stderr for gen, dry run
// or not, so that stdout holds the report, the diff or the patch alone; issue 26), then goes on
// writing where it did.
func (t *textWriter) warningsTo(w io.Writer, ws []string) {
	prev := t.w
	t.w = w
	t.warnings(ws)
	t.w = prev
}

// Refused reports whether err means the input was refused and nothing was changed.
func Refused(err error) bool { return errors.Is(err, bootstrap.ErrRefused) }
