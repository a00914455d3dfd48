// Package crio points CRI-O (containers/image) at a nodecache mirror with a registries.conf.d
// drop-in, and turns on auto_reload_registries for CRI-O >= 1.30 with a crio.conf.d drop-in.
// The main registries.conf is never edited.
//
// containers/image sends no ?ns= to a mirror, so each upstream NAME gets the mirror location
// <mirror host:port>/<NAME>: requests arrive as /v2/<NAME>/<repository>/..., the mirror's path
// prefix routing (docs/serve.md, "Routing"). A NAME with a port cannot be a path component, so it
// gets its port-free path alias instead (name.PathAlias: "reg.local:5005" → <mirror>/reg.local_5005),
// which serve accepts as the same prefix.
package crio

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Defaults and names.
const (
	// DefaultRegistriesDir is containers/image's system drop-in directory.
	DefaultRegistriesDir = "/etc/containers/registries.conf.d"
	// DefaultCrioDir is CRI-O's drop-in directory.
	DefaultCrioDir = "/etc/crio/crio.conf.d"
	// DefaultCertsDir is where containers/image looks for <host:port>/*.crt CA files.
	DefaultCertsDir = "/etc/containers/certs.d"
	// DropInName names both drop-ins. Files are read in name order and a later [[registry]]
	// with the same prefix replaces an earlier one, so 90 lets site files at 99 still win
	// (reported as an override).
	DropInName = "90-nodecache.conf"
	// MainRegistriesConf is the system registries.conf.
	MainRegistriesConf = "/etc/containers/registries.conf"
	// rootUserConf is root's own registries.conf: when it exists containers/image running as
	// root uses it and ~/.config/containers/registries.conf.d instead of the system files.
	rootUserConf = "/root/.config/containers/registries.conf"
	// caFileName is the CA copy for an https mirror under <certs dir>/<host:port>/.
	caFileName = "nodecache-mirror-ca.crt"
)

// registriesConf is a registries.conf v2 drop-in as containers/image reads it
// (pkg/sysregistriesv2 V2RegistriesConf).
type registriesConf struct {
	Registries []registry `toml:"registry"`
}

// registry is one [[registry]] table.
type registry struct {
	// Prefix selects the images this table applies to: the upstream NAME.
	Prefix string `toml:"prefix"`
	// Location is where the images really live: the upstream NAME itself.
	Location string `toml:"location"`
	// Insecure allows plain HTTP (and unverified TLS) for Location: set for an upstream given as
	// --upstream NAME=http://NAME, or carried over from the site's entry for the prefix.
	Insecure bool `toml:"insecure,omitempty"`
	// Blocked refuses every pull of the prefix: carried over from the site's entry.
	Blocked bool `toml:"blocked,omitempty"`
	// MirrorByDigestOnly is read from a site's entry; it is carried as each of the site's
	// mirrors' pull-from-mirror = "digest-only" (containers/image refuses both in one table).
	MirrorByDigestOnly bool `toml:"mirror-by-digest-only,omitempty"`
	// Mirrors are tried in order before Location.
	Mirrors []mirrorEndpoint `toml:"mirror"`
}

// mirrorEndpoint is one [[registry.mirror]] table.
type mirrorEndpoint struct {
	// Location is host[:port]/path of the mirror: "<mirror host:port>/<NAME>", or
	// "<mirror host:port>/<host>_<port>" for a NAME with a port (mirrorPrefix).
	Location string `toml:"location"`
	// Insecure allows plain HTTP (and unverified TLS): true exactly for an http:// mirror.
	Insecure bool `toml:"insecure,omitempty"`
	// PullFromMirror: "all" uses the mirror for tag and digest pulls alike (ours); a site's
	// mirror keeps its own ("digest-only", "tag-only" or none).
	PullFromMirror string `toml:"pull-from-mirror,omitempty"`
}

// crioConf is the crio.conf.d drop-in.
type crioConf struct {
	Crio struct {
		Image struct {
			// AutoReloadRegistries makes CRI-O watch registries.conf.d and reload on change
			// (CRI-O >= 1.30; read at start).
			AutoReloadRegistries bool `toml:"auto_reload_registries"`
		} `toml:"image"`
	} `toml:"crio"`
}

// Options configure Plan and PlanRemove.
type Options struct {
	// Mirror is the nodecache endpoint (required for Plan).
	Mirror name.Mirror
	// Upstreams are the registry names to mirror (required for Plan).
	Upstreams []string
	// Fallbacks maps an upstream NAME to its own registry URL when that is not https://NAME
	// (bootstrap.Fallbacks): an http:// one sets insecure = true for the prefix.
	Fallbacks map[string]string
	// RegistriesDir is the system drop-in directory (default DefaultRegistriesDir).
	RegistriesDir string
	// CrioDir is CRI-O's drop-in directory (default DefaultCrioDir).
	CrioDir string
	// CertsDir is containers/image's certificate directory (default DefaultCertsDir).
	CertsDir string
	// Version is the CRI-O release (--crio-version, or found by activation.RuntimeVersion); zero when unknown, in
	// which case no auto_reload drop-in is written.
	Version Release
	// MirrorCA is a PEM CA certificate for an https mirror, copied to
	// <CertsDir>/<mirror host:port>/nodecache-mirror-ca.crt. Refused for http.
	MirrorCA []byte
}

// checkPaths refuses directories that are not one absolute path.
func (o *Options) checkPaths() error {
	return errors.Join(
		bootstrap.CheckHostDir("--registries-dir", o.RegistriesDir, DefaultRegistriesDir),
		bootstrap.CheckHostDir("--crio-dir", o.CrioDir, DefaultCrioDir),
		bootstrap.CheckHostDir("certs dir", o.CertsDir, DefaultCertsDir))
}

func (o *Options) setDefaults() {
	if o.RegistriesDir == "" {
		o.RegistriesDir = DefaultRegistriesDir
	}
	if o.CrioDir == "" {
		o.CrioDir = DefaultCrioDir
	}
	if o.CertsDir == "" {
		o.CertsDir = DefaultCertsDir
	}
	o.RegistriesDir = path.Clean("/" + o.RegistriesDir)
	o.CrioDir = path.Clean("/" + o.CrioDir)
	o.CertsDir = path.Clean("/" + o.CertsDir)
}

// Override names a site [[registry]] table that bears on one of our prefixes: its prefix and
// file, and for a longer prefix the prefix of ours it lies inside (Of).
type Override struct {
	Prefix string `json:"prefix"`
	File   string `json:"file"`
	Of     string `json:"of,omitempty"`
}

// Report is the outcome of Plan and PlanRemove.
type Report struct {
	Runtime   string   `json:"runtime"`
	Mirror    string   `json:"mirror,omitempty"`
	Upstreams []string `json:"upstreams,omitempty"`
	// Version is the CRI-O release the plan was made for ("unknown" when not known).
	Version string `json:"crio_version"`
	// AutoReload is true when the crio.conf.d drop-in turning on auto_reload_registries is
	// written (it takes effect when CRI-O next starts).
	AutoReload bool `json:"auto_reload"`
	// Changes are the file operations.
	Changes []bootstrap.Change `json:"changes"`
	// Overrides are later drop-ins that replace our table for a prefix: pulls of that prefix
	// do not use the mirror.
	Overrides []Override `json:"overrides,omitempty"`
	// Merged are the site's own [[registry]] tables for one of our prefixes (in the main
	// registries.conf or an earlier drop-in, the one containers/image would use) whose settings
	// and mirrors our drop-in carries, since it replaces them.
	Merged []Override `json:"merged,omitempty"`
	// Longer are the site's [[registry]] tables with a longer prefix inside one of ours (Of):
	// containers/image picks the longest matching prefix, so pulls under them skip the mirror.
	Longer []Override `json:"longer,omitempty"`
	// V1Main lists main registries.conf files in the deprecated v1 format (CRI-O >= 1.36
	// refuses them).
	V1Main []string `json:"v1_main,omitempty"`
	// RestartRequired is always false: registries are reloaded by SIGHUP (or auto_reload).
	RestartRequired bool `json:"restart_required"`
	// Reload is filled by the caller after applying (Reload).
	Reload   *ReloadResult `json:"reload,omitempty"`
	Warnings []string      `json:"warnings,omitempty"`
}

// mirrorPrefix is the path under the mirror that serves upstream n for containers/image: n
// itself, or for a name with a port its port-free path alias ("reg.local:5005" →
// "reg.local_5005"), since a path component cannot hold ':'. "" for an IPv6 address, which has
// neither form: such an upstream cannot be mirrored for CRI-O.
func mirrorPrefix(n string) string {
	if a, ok := name.PathAlias(n); ok {
		return a
	}
	if strings.ContainsAny(n, ":[") {
		return ""
	}
	return n
}

// dropIn renders the registries.conf.d drop-in from its [[registry]] tables (planEntries).
func dropIn(regs []registry) ([]byte, error) {
	body, err := toml.Marshal(registriesConf{Registries: regs})
	if err != nil {
		return nil, fmt.Errorf("encode registries drop-in: %w", err)
	}
	head := mirrorapi.ManagedMarker + "\n# Pulls of each prefix try the nodecache mirror first (path prefix: no ?ns= from containers/image).\n"
	return append([]byte(head), body...), nil
}

func autoReloadDropIn() ([]byte, error) {
	var c crioConf
	c.Crio.Image.AutoReloadRegistries = true
	body, err := toml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode crio drop-in: %w", err)
	}
	return append([]byte(mirrorapi.ManagedMarker+"\n# Reload registries.conf.d on change (CRI-O >= 1.30, read at start).\n"), body...), nil
}

// Plan computes the drop-ins for the host seen through fsys, and a bootstrap.DirMarker in each
// directory they create. It writes nothing.
func Plan(fsys fs.FS, opts Options) (*Report, error) {
	if err := opts.checkPaths(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	fsys = bootstrap.Resolving(fsys)
	if err := bootstrap.CheckTargets(opts.Mirror, opts.Upstreams); err != nil {
		return nil, err
	}
	rep := &Report{Runtime: "crio", Mirror: opts.Mirror.String(), Version: opts.Version.String()}
	for _, n := range opts.Upstreams {
		// A mirror location is <host:port>/<path>, and a path component cannot hold ':' (the
		// reference grammar): a NAME with a port is addressed by its path alias, and one without
		// an alias (an IPv6 address) cannot be addressed at all.
		if mirrorPrefix(n) == "" {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("upstream %q is an IPv6 address: it has no port-free path alias, so containers/image cannot address it as a mirror path prefix, so CRI-O pulls of it are not mirrored", n))
			continue
		}
		rep.Upstreams = append(rep.Upstreams, n)
	}
	if len(rep.Upstreams) == 0 {
		return nil, refusal.Errorf("no upstream can be mirrored for CRI-O: %s", strings.Join(rep.Warnings, "; "))
	}
	for _, dir := range registriesDirs(fsys, opts) {
		if err := planDropIn(fsys, opts, dir, rep); err != nil {
			return nil, err
		}
	}
	for _, o := range rep.Merged {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s defines [[registry]] prefix %q, which %s (read after it) replaces: its settings (blocked, insecure, mirror-by-digest-only) and its mirrors (after nodecache's) are carried into %s", o.File, o.Prefix, DropInName, DropInName))
	}
	for _, o := range rep.Longer {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s defines [[registry]] prefix %q, longer than nodecache's %q: containers/image uses the longest matching prefix whatever the file order, so pulls under %s do not use the mirror", o.File, o.Prefix, o.Of, o.Prefix))
	}
	for _, o := range rep.Overrides {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s defines [[registry]] prefix %q after %s: it replaces ours, so %s pulls skip the mirror", o.File, o.Prefix, DropInName, o.Prefix))
	}
	if err := planCRIOFiles(fsys, opts, rep); err != nil {
		return nil, err
	}
	v1, err := v1Mains(fsys)
	if err != nil {
		return nil, err
	}
	rep.V1Main = v1
	for _, p := range v1 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s is in the deprecated v1 format ([registries.search] ...): CRI-O >= 1.36 refuses it; convert it to v2 (unqualified-search-registries, [[registry]])", p))
	}
	// The directories the files land in that gen creates get a marker, so --remove takes them
	// out again.
	var dirs []string
	for _, c := range rep.Changes {
		dirs = append(dirs, path.Dir(c.Path))
	}
	markers, err := bootstrap.PlanDirMarkers(fsys, dirMarker, dirs...)
	if err != nil {
		return nil, err
	}
	rep.Changes = append(markers, rep.Changes...)
	// Write what symbolic links (a linked drop-in directory) lead to, never the links.
	if rep.Changes, err = bootstrap.ResolveChanges(fsys, rep.Changes); err != nil {
		return nil, err
	}
	return rep, nil
}

// planDropIn is the drop-in step for one registries.conf.d directory: our drop-in, merged with
// the site's tables for our prefixes and validated together with the site's files.
func planDropIn(fsys fs.FS, opts Options, dir string, rep *Report) error {
	main := mainFor(dir)
	site, err := readSite(fsys, main, dir, rep.Upstreams)
	if err != nil {
		return err
	}
	if len(site.Broken) > 0 {
		return refusal.Errorf("%s: not TOML, so containers/image refuses the whole registries configuration (every CRI-O pull fails) and %s cannot be validated together with it: fix or remove it, then run gen again; nothing was changed", strings.Join(site.Broken, "; "), DropInName)
	}
	regs, merged, err := planEntries(opts, rep.Upstreams, site)
	if err != nil {
		return err
	}
	data, err := dropIn(regs)
	if err != nil {
		return err
	}
	c, err := bootstrap.PlanOwned(fsys, path.Join(dir, DropInName), 0o644, data)
	if err != nil {
		return err
	}
	rep.Changes = append(rep.Changes, c)
	if err := validateTogether(fsys, main, dir, data); err != nil {
		return err
	}
	rep.Overrides = append(rep.Overrides, site.Overrides...)
	rep.Merged = append(rep.Merged, merged...)
	rep.Longer = append(rep.Longer, site.Longer...)
	return nil
}

// planCRIOFiles is the step of CRI-O's own files: the auto_reload_registries drop-in (for a
// CRI-O that has it) and the mirror's CA copy.
func planCRIOFiles(fsys fs.FS, opts Options, rep *Report) error {
	switch {
	case opts.Version.IsZero():
		rep.Warnings = append(rep.Warnings, "CRI-O version unknown (pass --crio-version): no auto_reload_registries drop-in written; a SIGHUP reloads registries")
	case opts.Version.AutoReloadRegistries():
		ar, err := autoReloadDropIn()
		if err != nil {
			return err
		}
		c, err := bootstrap.PlanOwned(fsys, path.Join(opts.CrioDir, DropInName), 0o644, ar)
		if err != nil {
			return err
		}
		rep.Changes = append(rep.Changes, c)
		rep.AutoReload = true
	}
	if len(opts.MirrorCA) == 0 {
		return nil
	}
	if opts.Mirror.HTTP() {
		return refusal.Errorf("--mirror-ca is for an https mirror; %s is http", opts.Mirror)
	}
	ca := append([]byte(mirrorapi.ManagedMarker+"\n"), opts.MirrorCA...)
	c, err := bootstrap.PlanOwned(fsys, path.Join(opts.CertsDir, opts.Mirror.Host(), caFileName), 0o644, ca)
	if err != nil {
		return err
	}
	rep.Changes = append(rep.Changes, c)
	return nil
}

// dirMarker is the bootstrap.DirMarker gen crio writes into each directory it creates.
var dirMarker = []byte(mirrorapi.ManagedMarker + "\n# `nodecache gen crio` created this directory; `gen crio --remove` deletes it when it is empty.\n")

// PlanRemove removes our drop-ins and every CA copy we wrote
// (<CertsDir>/<host:port>/nodecache-mirror-ca.crt, its directory too when then empty), then
// every directory gen created (bootstrap.DirMarker) once it is empty; only files starting with
// mirrorapi.ManagedMarker. It needs no Mirror and no Version: what is ours is found on disk.
func PlanRemove(fsys fs.FS, opts Options) (*Report, error) {
	if err := opts.checkPaths(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	fsys = bootstrap.Resolving(fsys)
	rep := &Report{Runtime: "crio", Mirror: opts.Mirror.String(), Version: opts.Version.String()}
	type target struct {
		path  string
		prune bool
	}
	var targets []target
	for _, dir := range registriesDirs(fsys, opts) {
		targets = append(targets, target{path: path.Join(dir, DropInName)})
	}
	targets = append(targets, target{path: path.Join(opts.CrioDir, DropInName)})
	if ents, err := fs.ReadDir(fsys, bootstrap.FSName(opts.CertsDir)); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				targets = append(targets, target{path: path.Join(opts.CertsDir, e.Name(), caFileName), prune: true})
			}
		}
	}
	for _, dir := range registriesDirs(fsys, opts) {
		// Removing ours does not mend a broken site file: say so, but remove anyway.
		site, err := readSite(fsys, mainFor(dir), dir, nil)
		if err != nil {
			return nil, err
		}
		for _, b := range site.Broken {
			rep.Warnings = append(rep.Warnings, b+": not TOML: containers/image refuses the whole registries configuration, so every CRI-O pull fails until it is fixed or removed")
		}
	}
	var dirs []string
	for _, tg := range targets {
		dirs = append(dirs, path.Dir(tg.path))
		c, ok, note, err := bootstrap.PlanRemoveOwned(fsys, tg.path, tg.prune)
		if err != nil {
			return nil, err
		}
		if note != "" {
			rep.Warnings = append(rep.Warnings, note)
		}
		if ok {
			rep.Changes = append(rep.Changes, c)
		}
	}
	// Last: the directories gen created, once what is in them is gone.
	markers, err := bootstrap.PlanRemoveDirMarkers(fsys, append(dirs, opts.CertsDir)...)
	if err != nil {
		return nil, err
	}
	rep.Changes = append(rep.Changes, markers...)
	if rep.Changes, err = bootstrap.ResolveChanges(fsys, rep.Changes); err != nil {
		return nil, err
	}
	return rep, nil
}

// registriesDirs are the drop-in directories to write: the system one, plus root's own when root
// has ~/.config/containers/registries.conf (containers/image then reads root's files instead).
func registriesDirs(fsys fs.FS, opts Options) []string {
	dirs := []string{opts.RegistriesDir}
	if _, err := fs.Stat(fsys, bootstrap.FSName(rootUserConf)); err == nil {
		dirs = append(dirs, rootUserConf+".d")
	}
	return dirs
}

// v1Mains returns main registries.conf files (system and root's) in the v1 format: a top-level
// [registries] table with search/insecure/block lists.
func v1Mains(fsys fs.FS) ([]string, error) {
	var out []string
	for _, p := range []string{MainRegistriesConf, rootUserConf} {
		data, ok, err := bootstrap.ReadFile(fsys, p)
		if err != nil || !ok {
			continue
		}
		var m map[string]any
		if err := toml.Unmarshal(data, &m); err != nil {
			return nil, refusal.Errorf("%s does not parse as TOML: %v", p, err)
		}
		if _, v1 := m["registries"]; v1 {
			out = append(out, p)
		}
	}
	return out, nil
}

// Changed reports whether the report writes or removes anything (the reload is sent then).
func (r *Report) Changed() bool { return bootstrap.AnyChanged(r.Changes) }
