package activation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// CRI-O evidence (crio.conf(5): a SIGHUP reloads containers-registries.conf, and
// auto_reload_registries in [crio.image] reloads it when registries.conf.d changes;
// containers-registries.conf.d(5): drop-ins are read in name order): our drop-in in registries.conf.d must be present,
// valid, and not overridden by a later drop-in for the same prefix — judged on containers/image's
// own merged view (sysregistriesv2) — and the running crio must have read it: it started after
// the drop-in's last change, or auto_reload_registries was on at its start (then CRI-O watches
// the directory). A SIGHUP is never evidence: the reload runs later and may reject the file.

const remedyCRIO = "restart CRI-O, or enable auto_reload_registries in a crio.conf.d drop-in and restart it once"

// dropIn is one registries.conf.d file.
type dropIn struct {
	path    string // host path
	modTime time.Time
	managed bool
	// prefixes maps each [[registry]] prefix (location when no prefix) to its first mirror.
	prefixes map[string]string
}

func (e *evaluator) readDropIns() ([]dropIn, error) {
	entries, err := e.h.ReadDir(e.opts.RegistriesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", e.opts.RegistriesDir, err)
	}
	var out []dropIn
	for _, en := range entries {
		if en.IsDir() || !strings.HasSuffix(en.Name(), ".conf") {
			continue
		}
		p := filepath.Join(e.opts.RegistriesDir, en.Name())
		st, err := e.h.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("stat %s: %w", p, err)
		}
		b, err := e.h.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		d := dropIn{path: p, modTime: st.ModTime(), managed: mirrorapi.Managed(b), prefixes: map[string]string{}}
		var doc struct {
			Registry []struct {
				Prefix   string `toml:"prefix"`
				Location string `toml:"location"`
				Mirror   []struct {
					Location string `toml:"location"`
				} `toml:"mirror"`
			} `toml:"registry"`
		}
		if err := toml.Unmarshal(b, &doc); err == nil {
			for _, r := range doc.Registry {
				key := r.Prefix
				if key == "" {
					key = r.Location
				}
				first := ""
				if len(r.Mirror) > 0 {
					first = r.Mirror[0].Location
				}
				d.prefixes[key] = first
			}
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out, nil
}

// crio examines CRI-O: its process, its API, our drop-ins in containers/image's merged view, and
// whether the running crio has read them.
func (e *evaluator) crio(ctx context.Context) RuntimeReport {
	const rt = RuntimeCRIO
	rep := RuntimeReport{Runtime: rt}
	procs, err := e.h.Processes("crio")
	if err != nil {
		e.add(rt, "process", Unread, "%v", err)
		rep.State, rep.Reason = Unknown, "cannot read the crio process: "+err.Error()
		return rep
	}
	drops, err := e.readDropIns()
	if err != nil {
		e.add(rt, "drop-in", Unread, "%v", err)
		rep.State, rep.Reason = Unknown, err.Error()
		return rep
	}
	var ours []dropIn
	for _, d := range drops {
		if d.managed {
			ours = append(ours, d)
		}
	}
	p, ok := e.crioProcess(&rep, procs, len(ours) > 0)
	if !ok || !e.crioAPI(ctx, &rep) || !e.crioRegistries(&rep, drops, ours) {
		return rep
	}
	e.crioLoaded(&rep, p, ours)
	return rep
}

// crioProcess is the process step: exactly one crio process, or the report says why not (no
// CRI-O at all, configuration without a visible process, several processes).
func (e *evaluator) crioProcess(rep *RuntimeReport, procs []bootstrap.Process, haveOurs bool) (bootstrap.Process, bool) {
	const rt = RuntimeCRIO
	crioInstalled := e.h.Exists(e.opts.CRIOConfig) || e.h.Exists(e.opts.CRIODropInDir)
	if len(procs) == 0 {
		if !haveOurs && !crioInstalled {
			rep.State, rep.Reason = NotApplicable, "no crio process and no CRI-O configuration"
			if r := e.explicitNone(rt, "CRI-O", fmt.Sprintf("no process named crio under %s, no %s, no %s and no nodecache drop-in", e.h.ProcRoot(), e.opts.CRIOConfig, e.opts.CRIODropInDir)); r != "" {
				rep.Reason = r
			}
			e.add(rt, "process", Skipped, "no process named crio; no %s, no %s and no nodecache drop-in", e.opts.CRIOConfig, e.opts.CRIODropInDir)
			return bootstrap.Process{}, false
		}
		e.add(rt, "process", Unread, "no process named crio under %s (a pod needs hostPID), but CRI-O configuration exists", e.h.ProcRoot())
		rep.State, rep.Reason = Unknown, "CRI-O configuration present but no crio process is visible"
		return bootstrap.Process{}, false
	}
	if len(procs) > 1 {
		e.add(rt, "process", Unread, "%d processes named crio", len(procs))
		rep.State, rep.Reason = Unknown, fmt.Sprintf("%d crio processes: cannot tell which serves the kubelet", len(procs))
		return bootstrap.Process{}, false
	}
	p := procs[0]
	start := p.Start
	rep.PID, rep.ProcessStart = p.PID, &start
	e.add(rt, "process", Pass, "pid %d; started %s", p.PID, fmtPrecise(start))
	return p, true
}

// crioAPI is the version step: CRI-O must answer on its CRI socket, since without its API there
// is no runtime evidence.
func (e *evaluator) crioAPI(ctx context.Context, rep *RuntimeReport) bool {
	const rt = RuntimeCRIO
	ver, err := e.crioVersion(ctx)
	if err != nil {
		e.add(rt, "version", Unread, "%s: %v", e.opts.CRIOSocket, err)
		rep.State, rep.Reason = Unknown, fmt.Sprintf("CRI-O's API at %s does not answer (unreachable or permission denied: a pod needs the host's socket and root): %v", e.opts.CRIOSocket, err)
		return false
	}
	rep.Version = ver
	e.add(rt, "version", Info, "CRI-O %s on %s (CRI version)", ver, e.opts.CRIOSocket)
	return true
}

// crioRegistries is the drop-in step: our drop-ins exist, the registries configuration loads,
// and every upstream goes to the mirror first in containers/image's merged view.
func (e *evaluator) crioRegistries(rep *RuntimeReport, drops, ours []dropIn) bool {
	const rt = RuntimeCRIO
	if len(ours) == 0 {
		e.add(rt, "drop-in", Fail, "no drop-in written by nodecache in %s", e.opts.RegistriesDir)
		rep.State, rep.Reason, rep.Remedy = NotActive, "no nodecache drop-in in "+e.opts.RegistriesDir, "run nodecache gen crio (the agent does this at start)"
		return false
	}
	// Valid, merged: containers/image's own reading of registries.conf + registries.conf.d, from
	// a private copy of the files read through the host view (links resolve under the host root
	// as on the host, for the directory and for each file in it).
	sys, done, err := crio.MergedView(e.h.FS(), e.opts.RegistriesConf, e.opts.RegistriesDir, nil)
	var le *crio.LoadError
	switch {
	case errors.As(err, &le):
		e.add(rt, "drop-in", Fail, "containers/image refuses the registries configuration: %s", le.Msg)
		rep.State, rep.Reason = NotActive, "the registries configuration does not load: "+le.Msg
		rep.Remedy = "fix or remove the file named in the error (CRI-O rejects the whole configuration on reload)"
		return false
	case err != nil:
		e.add(rt, "drop-in", Fail, "%v", err)
		rep.State, rep.Reason = NotActive, "the registries configuration does not load: "+err.Error()
		rep.Remedy = "fix or remove the symbolic link named"
		return false
	}
	defer done()
	want := map[string]bool{}
	for _, u := range e.opts.Upstreams {
		want[u] = true
	}
	checked, bad := e.crioPrefixes(rep, sys, drops, ours, want)
	bad = append(bad, e.crioLongerPrefixes(sys, ours, checked)...)
	for u := range want {
		found := false
		for _, c := range checked {
			found = found || c == u
		}
		if !found {
			e.add(rt, "registry "+u, Fail, "no nodecache drop-in configures %s", u)
			bad = append(bad, u)
		}
	}
	rep.upstreams = checked
	if len(bad) > 0 {
		sort.Strings(bad)
		rep.State = NotActive
		rep.Reason = fmt.Sprintf("registries that do not go through the mirror: %s", strings.Join(bad, ", "))
		rep.Remedy = "run nodecache gen crio and remove or rename the overriding drop-ins"
		return false
	}
	return true
}

// crioPrefixes checks each prefix our drop-ins configure (those of want, when want is not empty)
// in the merged view: the mirror first, and not blocked. It returns the prefixes checked and the
// ones that do not go through the mirror; rep.Mirror becomes the first good mirror.
func (e *evaluator) crioPrefixes(rep *RuntimeReport, sys *types.SystemContext, drops, ours []dropIn, want map[string]bool) (checked, bad []string) {
	const rt = RuntimeCRIO
	for _, d := range ours {
		for prefix, ourMirror := range d.prefixes {
			if len(want) > 0 && !want[prefix] {
				continue
			}
			checked = append(checked, prefix)
			reg, err := sysregistriesv2.FindRegistry(sys, prefix+"/"+mirrorapi.CanaryRepository)
			if err != nil || reg == nil {
				e.add(rt, "registry "+prefix, Fail, "containers/image finds no [[registry]] for %s", prefix)
				bad = append(bad, prefix)
				continue
			}
			first := ""
			if len(reg.Mirrors) > 0 {
				first = reg.Mirrors[0].Location
			}
			switch {
			case first != ourMirror || reg.Prefix != prefix:
				by := e.overrider(drops, d, prefix)
				e.add(rt, "registry "+prefix, Fail, "%s is overridden%s: the merged view tries %q first, not %q", d.path, by, first, ourMirror)
				bad = append(bad, prefix)
			case e.opts.Mirror != nil && !strings.EqualFold(strings.SplitN(first, "/", 2)[0], e.opts.Mirror.Host):
				e.add(rt, "registry "+prefix, Fail, "%s: first mirror %q is not %s", d.path, first, e.opts.Mirror.Host)
				bad = append(bad, prefix)
			case reg.Blocked:
				e.add(rt, "registry "+prefix, Fail, "%s is blocked in the merged view", prefix)
				bad = append(bad, prefix+" (blocked)")
			default:
				note := ""
				if reg.MirrorByDigestOnly || reg.Mirrors[0].PullFromMirror == "digest-only" {
					note = " (digest pulls only: tags go upstream)"
				}
				e.add(rt, "registry "+prefix, Pass, "%s: containers/image tries %s first%s", d.path, first, note)
				if rep.Mirror == "" {
					rep.Mirror = first
				}
			}
		}
	}
	return checked, bad
}

// crioLongerPrefixes returns the [[registry]] prefixes longer than a checked one that do not try
// the mirror first. A longer prefix inside one of ours wins in containers/image whatever the file
// order (docker.io/library over docker.io): pulls under it must reach the mirror too.
func (e *evaluator) crioLongerPrefixes(sys *types.SystemContext, ours []dropIn, checked []string) []string {
	const rt = RuntimeCRIO
	regs, err := sysregistriesv2.GetRegistries(sys)
	if err != nil {
		return nil
	}
	var bad []string
	for _, r := range regs {
		for _, prefix := range checked {
			if len(r.Prefix) <= len(prefix) || !strings.HasPrefix(r.Prefix, prefix) || !strings.ContainsRune("/:@", rune(r.Prefix[len(prefix)])) {
				continue
			}
			first := ""
			if len(r.Mirrors) > 0 {
				first = r.Mirrors[0].Location
			}
			host := strings.SplitN(first, "/", 2)[0]
			if e.opts.Mirror != nil && strings.EqualFold(host, e.opts.Mirror.Host) {
				continue
			}
			if e.opts.Mirror == nil && host != "" && host == strings.SplitN(ourFirst(ours, prefix), "/", 2)[0] {
				continue
			}
			e.add(rt, "registry "+r.Prefix, Fail, "[[registry]] prefix %q is longer than %q, so containers/image uses it for %s/... whatever the file order, and it tries %q first, not the mirror", r.Prefix, prefix, r.Prefix, first)
			bad = append(bad, fmt.Sprintf("%s (a longer prefix than %s, without the mirror)", r.Prefix, prefix))
		}
	}
	return bad
}

// crioLoaded is the loaded step: the restart-evidence rule over our drop-ins, then
// auto_reload_registries as it was at crio's start. A SIGHUP is not evidence.
func (e *evaluator) crioLoaded(rep *RuntimeReport, p bootstrap.Process, ours []dropIn) {
	const rt = RuntimeCRIO
	files := map[string]time.Time{}
	for _, d := range ours {
		files[d.path] = d.modTime
	}
	restart := Judge(p, files)
	if restart.Order == Loaded {
		rep.State, rep.Evidence = Active, "start-time"
		e.add(rt, "loaded", Pass, "%s", restart.Reason("crio"))
		rep.Reason = "crio started after the nodecache drop-in was written, and containers/image's merged view puts the mirror first"
		return
	}
	on, from, err := e.autoReloadAtStart(p.Start)
	if err != nil {
		e.add(rt, "loaded", Unread, "%v", err)
		rep.State, rep.Reason = Unknown, err.Error()
		return
	}
	if on {
		rep.State, rep.Evidence = Active, "live"
		e.add(rt, "loaded", Pass, "%s changed after crio started, but auto_reload_registries was on at its start (%s): CRI-O re-reads registries.conf.d", restart.File, from)
		rep.Reason = "auto_reload_registries was on when crio started, and containers/image's merged view puts the mirror first"
		return
	}
	why := restart.Reason("crio") + ", and auto_reload_registries was off at its start"
	e.add(rt, "loaded", Fail, "%s (a SIGHUP is not evidence: the reload may have rejected the file)", why)
	rep.State, rep.Reason, rep.Remedy = NotActive, why, remedyCRIO
	if restart.Order == Ambiguous {
		mirror := "http://HOST:PORT"
		if e.opts.Mirror != nil {
			mirror = e.opts.Mirror.String()
		} else if host, _, _ := strings.Cut(rep.Mirror, "/"); host != "" {
			mirror = "http://" + host // the location of the first mirror, as nodecache writes it (insecure: http)
		}
		rep.Reason, rep.Remedy = ambiguousStart(restart, "crio", "restart CRI-O", remedyCRIO, "auto_reload_registries was off at its start", mirror)
	}
	rep.Pending, rep.startTimeOnly = true, true
}

// ourFirst is the first mirror our drop-ins give prefix.
func ourFirst(ours []dropIn, prefix string) string {
	for _, d := range ours {
		if m, ok := d.prefixes[prefix]; ok {
			return m
		}
	}
	return ""
}

// overrider names the later drop-in that redefines prefix, if one does.
func (e *evaluator) overrider(drops []dropIn, ours dropIn, prefix string) string {
	by := ""
	for _, d := range drops {
		if d.path > ours.path {
			if _, ok := d.prefixes[prefix]; ok {
				by = " by " + d.path
			}
		}
	}
	return by
}

// autoReloadAtStart reads crio.conf and crio.conf.d/*.conf as present when crio started (files
// changed after its start, or within StartTolerance of it, do not count) and returns the effective
// [crio.image] auto_reload_registries and the file that set it.
func (e *evaluator) autoReloadAtStart(start time.Time) (bool, string, error) {
	files := []string{e.opts.CRIOConfig}
	entries, err := e.h.ReadDir(e.opts.CRIODropInDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, "", fmt.Errorf("list %s: %w", e.opts.CRIODropInDir, err)
	}
	var names []string
	for _, en := range entries {
		if !en.IsDir() && strings.HasSuffix(en.Name(), ".conf") {
			names = append(names, en.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		files = append(files, filepath.Join(e.opts.CRIODropInDir, n))
	}
	on, from := false, ""
	for _, f := range files {
		st, err := e.h.Stat(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, "", fmt.Errorf("stat %s: %w", f, err)
		}
		if StartOrder(start, st.ModTime()) != Loaded {
			continue // not (certainly) there when crio started
		}
		b, err := e.h.ReadFile(f)
		if err != nil {
			return false, "", fmt.Errorf("read %s: %w", f, err)
		}
		var doc struct {
			Crio struct {
				Image struct {
					AutoReload *bool `toml:"auto_reload_registries"`
				} `toml:"image"`
			} `toml:"crio"`
		}
		if err := toml.Unmarshal(b, &doc); err != nil {
			return false, "", fmt.Errorf("parse %s: %w", f, err)
		}
		if v := doc.Crio.Image.AutoReload; v != nil {
			on, from = *v, f
		}
	}
	return on, from, nil
}

// crioVersion asks CRI-O's CRI Version on its socket (through the host view).
func (e *evaluator) crioVersion(ctx context.Context) (string, error) {
	local, err := e.h.Local(e.opts.CRIOSocket)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.APITimeout)
	defer cancel()
	return apiVersion(ctx, local, RuntimeCRIO)
}
