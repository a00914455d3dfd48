// Package containerd points a node's containerd at a nodecache mirror: one hosts.toml per
// upstream, and config.toml's registry config_path when it must change. It also exports the
// reader of a node's effective containerd configuration (LoadEffective) that status uses.
//
// Plan only reads (through an fs.FS rooted at the host root) and returns the changes as data;
// bootstrap.Applier writes them. The rules come from containerd itself — its docs/hosts.md
// (hosts.toml, the per-host directory lookup, changes there need no restart), its
// docs/cri/registry.md (config_path in config.toml, which needs a restart when it changes), and
// the containerd code or issue each rule's comment names; what they mean for gen is in this
// repository's docs/gen.md.
package containerd

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Options configure Plan and PlanRemove.
type Options struct {
	// Mirror is the nodecache endpoint (required for Plan).
	Mirror name.Mirror
	// Upstreams are the registry names pulled through the mirror (required for Plan).
	Upstreams []string
	// Fallbacks maps an upstream NAME to the registry URL written as hosts.toml's server when it
	// is not name.RegistryURL(NAME), e.g. "http://registry.local:5000" for an http-only
	// registry (bootstrap.Fallbacks reads them from --upstream NAME=URL).
	Fallbacks map[string]string
	// Config is the main config file (host path). Default DefaultConfig.
	Config string
	// CertsDir is the single directory gen writes into config_path when it has to set one.
	// Default DefaultCertsDir.
	CertsDir string
	// Daemon is the containerd release (--containerd-version, or found by activation.RuntimeVersion). Zero:
	// unknown; the newest 2.x rules are assumed, with the 1.x refusals added, and creating a
	// config.toml from nothing is refused.
	Daemon Release
	// MirrorCA is the host path of a PEM CA file for an https mirror; written as the mirror
	// host's `ca`. Refused for an http mirror.
	MirrorCA string
	// Migrate moves legacy registry.mirrors (and, for 1.x, configs.<host>.tls) into hosts.toml
	// files and removes those tables, instead of refusing them.
	Migrate bool
	// DialTimeout is written as dial_timeout in every [host] table of the hosts.toml files gen
	// writes (the mirror's, and the legacy mirrors --migrate moves): how long containerd waits
	// for a connection before it tries the next host (hostEntry.DialTimeout). 0:
	// DefaultDialTimeout; negative is refused. Unused by PlanRemove.
	DialTimeout time.Duration
}

// checkPaths refuses host paths that are not one absolute path (a relative one would be taken
// from / silently; a ':' list cannot be written into config_path as one directory).
func (o *Options) checkPaths() error {
	if err := bootstrap.CheckHostDir("--certs-dir", o.CertsDir, DefaultCertsDir); err != nil {
		return err
	}
	if o.Config != "" && !path.IsAbs(o.Config) {
		return refusal.Errorf("--containerd-config: want an absolute file path, e.g. %s; got %q", DefaultConfig, o.Config)
	}
	if o.DialTimeout < 0 {
		return refusal.Errorf("--dial-timeout %s: %s", o.DialTimeout, DialTimeoutWant)
	}
	return nil
}

// DialTimeoutWant is what --dial-timeout accepts (DefaultDialTimeout is its default), for the
// refusals of a value that is not positive.
const DialTimeoutWant = "want a positive duration such as 2s, 500ms or 1m (default 2s): how long containerd waits for a connection to a [host] before it tries the next"

func (o *Options) setDefaults() {
	if o.Config == "" {
		o.Config = DefaultConfig
	}
	if o.CertsDir == "" {
		o.CertsDir = DefaultCertsDir
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	o.Config = path.Clean("/" + o.Config)
	o.CertsDir = path.Clean("/" + o.CertsDir)
}

// ConfigPathAction says what gen did about config_path.
type ConfigPathAction string

// ConfigPathAction values.
const (
	// ConfigPathAdopted: an existing single-directory config_path is used as it is.
	ConfigPathAdopted ConfigPathAction = "adopted"
	// ConfigPathFirstOfList: a ':'-list that this containerd splits; hosts.toml go into its
	// first directory, config.toml untouched.
	ConfigPathFirstOfList ConfigPathAction = "first-of-list"
	// ConfigPathSet: config_path was empty, missing or a list the transfer service reads as one
	// directory; it is set to CertsDir.
	ConfigPathSet ConfigPathAction = "set"
	// ConfigPathCreated: there was no config.toml; a minimal one is created.
	ConfigPathCreated ConfigPathAction = "created"
)

// Report is the outcome of Plan and PlanRemove: what will change and why, for text and JSON
// output.
type Report struct {
	Runtime   string   `json:"runtime"`
	Mirror    string   `json:"mirror,omitempty"`
	Upstreams []string `json:"upstreams,omitempty"`
	// Config is the main config file.
	Config string `json:"config"`
	// Schema is the main file's version; for a config.toml gen creates (or finds without any
	// setting), the version it is written with: the daemon's own (2 for containerd 1.x, 3 for
	// 2.0-2.2, 4 from 2.3). 0: no file (PlanRemove after it went).
	Schema int `json:"schema"`
	// Daemon is the containerd release whose rules were applied; DaemonAssumed when guessed.
	Daemon        string `json:"containerd_version"`
	DaemonAssumed bool   `json:"containerd_version_assumed,omitempty"`
	// RegistryTable is the table that holds config_path, in the file that is (or would be) edited.
	RegistryTable string `json:"registry_table"`
	// EditedFile is the config file nodecache changes (an import when that file's registry table
	// wins); empty when config files stay untouched.
	EditedFile string `json:"edited_file,omitempty"`
	// ConfigPath is config_path as the CRI plugin will use it after a restart, and
	// ConfigPathAction how gen arrived at it.
	ConfigPath       string           `json:"config_path"`
	ConfigPathAction ConfigPathAction `json:"config_path_action,omitempty"`
	// HostsDir is the directory holding the hosts.toml files.
	HostsDir string `json:"hosts_dir"`
	// TransferService tells whether CRI pulls will use the transfer service.
	TransferService bool `json:"transfer_service"`
	// Migrated lists hosts whose legacy mirrors/configs entries moved into hosts.toml.
	Migrated []string `json:"migrated,omitempty"`
	// Adopted lists the site's own hosts.toml files (a per-host directory nodecache did not
	// write, "host:port" or "host_port_") that get the mirror as their first host; the rest of
	// each stays byte for byte, the original in <file>.nodecache.bak.
	Adopted []string `json:"adopted,omitempty"`
	// ShadowedDefault is the site's _default/hosts.toml (or _default directory of certificates)
	// that containerd no longer reads for the hosts nodecache writes a directory for.
	ShadowedDefault string `json:"shadowed_default,omitempty"`
	// Changes are the file operations, in the order Apply performs them.
	Changes []bootstrap.Change `json:"changes"`
	// RestartRequired is true when a config file changes: containerd reads config_path only at
	// start. hosts.toml files are re-read on every pull.
	RestartRequired bool     `json:"restart_required"`
	Warnings        []string `json:"warnings,omitempty"`
}

// hostsMode is the permission of hosts.toml files.
const hostsMode fs.FileMode = 0o644

// Plan computes what `gen containerd` changes on the host seen through fsys (rooted at the host
// root): it reads the effective configuration, refuses what must not be touched (an error
// wrapping bootstrap.ErrRefused, naming the file and table), and returns the hosts.toml files and
// any config edit as Changes. It writes nothing. Symbolic links are followed as the host
// follows them (bootstrap.Resolving: absolute targets under the host root): a change to a linked
// file names the file the link leads to (Change.Path, backup beside it) and the link (Change.Via),
// so the link stays; a link that cannot be followed safely is refused, naming it and its target.
func Plan(fsys fs.FS, opts Options) (*Report, error) {
	if err := opts.checkPaths(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	fsys = bootstrap.Resolving(fsys)
	if err := bootstrap.CheckTargets(opts.Mirror, opts.Upstreams); err != nil {
		return nil, err
	}
	if err := checkMirrorCA(fsys, opts); err != nil {
		return nil, err
	}
	if err := refuseForeign(fsys, opts.Config); err != nil {
		return nil, err
	}
	eff, err := Load(fsys, opts.Config, LoadOptions{Daemon: opts.Daemon})
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Runtime: "containerd", Mirror: opts.Mirror.String(), Upstreams: opts.Upstreams,
		Config: opts.Config, Schema: eff.Schema, Daemon: eff.Daemon.String(), DaemonAssumed: eff.DaemonAssumed,
	}
	cp, err := planConfig(fsys, eff, opts)
	if err != nil {
		return nil, err
	}
	rep.Warnings = append(rep.Warnings, cp.warnings...)
	rep.RegistryTable = dotted(cp.table)
	rep.EditedFile = cp.edited
	rep.ConfigPath = cp.after.ConfigPath
	rep.ConfigPathAction = cp.action
	if cp.action == ConfigPathCreated || eff.Schema != cp.after.Schema {
		rep.Schema = cp.after.Schema // the schema the file is written with (created, or empty before)
	}
	rep.HostsDir = cp.hostsDir
	rep.TransferService = cp.after.TransferService

	// hosts.toml per upstream, then per migrated legacy host.
	hs, err := hostsToWrite(eff, opts, rep)
	if err != nil {
		return nil, err
	}
	marker, err := planDirMarker(fsys, cp.hostsDir)
	if err != nil {
		return nil, err
	}
	rep.Changes = append(rep.Changes, marker...)
	if err := planHostsFiles(fsys, cp.hostsDir, hs, opts, rep); err != nil {
		return nil, err
	}
	// Config edits last: hosts.toml are in place before a restart can read the new config_path.
	for _, f := range cp.changes {
		rep.Changes = append(rep.Changes, f)
		if f.Changed() {
			rep.RestartRequired = true
		}
	}
	// Edit what symbolic links lead to, never the links.
	if rep.Changes, err = bootstrap.ResolveChanges(fsys, rep.Changes); err != nil {
		return nil, err
	}
	return rep, nil
}

// hostsSpec is what one host's hosts.toml holds: its server settings and its hosts, the mirror
// first.
type hostsSpec struct {
	file  hostsFile
	hosts []hostEntry
}

// hostsSet is the hosts.toml files to write, by host, in the order first added.
type hostsSet struct {
	byHost map[string]*hostsSpec
	order  []string
}

// add returns host's spec, a new one (the default server) the first time.
func (s *hostsSet) add(host string) *hostsSpec {
	if h, ok := s.byHost[host]; ok {
		return h
	}
	h := &hostsSpec{file: hostsFile{Server: defaultServer(host)}}
	s.byHost[host] = h
	s.order = append(s.order, host)
	return h
}

// hostsToWrite is the hosts step: one hosts.toml per upstream (the mirror, then the upstream
// or its fallback as server), then, with Migrate, the legacy mirrors and TLS settings of eff by
// host; rep.Migrated names the migrated hosts.
func hostsToWrite(eff *Effective, opts Options, rep *Report) (*hostsSet, error) {
	hs := &hostsSet{byHost: map[string]*hostsSpec{}}
	for _, n := range opts.Upstreams {
		h := hs.add(n)
		h.file.Server = name.RegistryURL(n)
		if fb, ok := opts.Fallbacks[n]; ok {
			h.file.Server = fb
		}
		h.hosts = append(h.hosts, mirrorEntry(opts.Mirror, opts.MirrorCA, opts.DialTimeout))
	}
	if !opts.Migrate {
		return hs, nil
	}
	for _, host := range slices.Sorted(maps.Keys(eff.Registry.Mirrors)) {
		h := hs.add(host)
		entries, err := legacyEndpointEntries(h.file.Server, eff.Registry.Mirrors[host], eff.Registry.ConfigsTLS, opts.DialTimeout)
		if err != nil {
			return nil, refusal.Errorf("--migrate: registry.mirrors.%q: %v", host, err)
		}
		h.hosts = append(h.hosts, entries...)
		rep.Migrated = append(rep.Migrated, host)
	}
	if daemonIs2xOnly(eff) {
		return hs, nil
	}
	for _, host := range slices.Sorted(maps.Keys(eff.Registry.ConfigsTLS)) {
		h := hs.add(host)
		t := eff.Registry.ConfigsTLS[host]
		var ca string
		applyTLS(&ca, &h.file.ServerClient, &h.file.ServerSkipVerify, t)
		if ca != "" {
			h.file.ServerCA = ca
		}
		if !slices.Contains(rep.Migrated, host) {
			rep.Migrated = append(rep.Migrated, host)
		}
	}
	return hs, nil
}

// planHostsFiles is the hosts.toml step: each file of hs planned in hostsDir (a site's own file
// adopted), the site's shadowed default named, and the stale files of earlier runs removed.
func planHostsFiles(fsys fs.FS, hostsDir string, hs *hostsSet, opts Options, rep *Report) error {
	var keep, own []string
	for _, host := range hs.order {
		// A host that holds only migrated settings is marked so that later runs keep it.
		migratedOnly := slices.Contains(rep.Migrated, host) && !slices.Contains(opts.Upstreams, host)
		dir, ours, err := planHostsFor(fsys, hostsDir, host, hs.byHost[host], migratedOnly, rep)
		if err != nil {
			return err
		}
		keep = append(keep, dir)
		if ours {
			own = append(own, host)
		}
	}
	if len(own) > 0 {
		def, err := defaultShadowed(fsys, hostsDir)
		if err != nil {
			return err
		}
		if def != "" {
			rep.ShadowedDefault = def
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s is the site's default for registries without their own directory; containerd reads the directories nodecache writes for %s instead, so it no longer applies to them: copy what they need from it into those hosts.toml files", def, strings.Join(own, ", ")))
		}
	}
	stale, err := staleHosts(fsys, hostsDir, keep)
	if err != nil {
		return err
	}
	rep.Changes = append(rep.Changes, stale...)
	return nil
}

// planHostsFor plans host's hosts.toml (h) in hostsDir and returns the directory it is in, and
// whether that directory is nodecache's own (a site default no longer applies to host).
func planHostsFor(fsys fs.FS, hostsDir, host string, h *hostsSpec, migratedOnly bool, rep *Report) (dir string, own bool, err error) {
	render := func(cas []string, pairs [][]string) ([]byte, error) {
		f := h.file
		if len(cas) > 0 && f.ServerCA == nil {
			f.ServerCA = cas
		}
		if len(pairs) > 0 && len(f.ServerClient) == 0 {
			f.ServerClient = pairs
		}
		return hostsTOML(f, h.hosts, migratedOnly)
	}
	if migratedOnly {
		data, err := render(nil, nil)
		if err != nil {
			return "", false, err
		}
		c, err := bootstrap.PlanOwned(fsys, hostsPath(hostsDir, host), hostsMode, data)
		if err != nil {
			return "", false, err
		}
		rep.Changes = append(rep.Changes, c)
		return name.HostDir(host), false, nil
	}
	hp, err := planHostsFile(fsys, hostsDir, host, render, h.hosts[0])
	if err != nil {
		return "", false, err
	}
	if hp.adopted && len(h.hosts) > 1 {
		return "", false, refusal.Errorf("--migrate: %s has the site's own hosts.toml for %s: move registry.mirrors.%q into it by hand; nothing was changed", path.Join(hostsDir, hp.dir), host, host)
	}
	rep.Changes = append(rep.Changes, hp.changes...)
	if hp.adopted {
		rep.Adopted = append(rep.Adopted, path.Join(hostsDir, hp.dir, "hosts.toml"))
	}
	return hp.dir, hp.own, nil
}

// DirMarker is the file gen writes into the hosts.toml directory it creates (--certs-dir on a
// host without one): the record that the directory is nodecache's, so that --remove deletes it
// once it is empty, and never a directory the site made. containerd reads only the per-host
// subdirectories there.
const DirMarker = bootstrap.DirMarker

// planDirMarker plans DirMarker in dir when dir does not exist yet (gen creates it), or keeps
// the one an earlier run wrote; nothing for a directory that exists without it.
func planDirMarker(fsys fs.FS, dir string) ([]bootstrap.Change, error) {
	p := path.Join(dir, DirMarker)
	_, dirErr := fs.Stat(fsys, bootstrap.FSName(dir))
	_, markErr := fs.Stat(fsys, bootstrap.FSName(p))
	if !errors.Is(dirErr, fs.ErrNotExist) && markErr != nil {
		return nil, nil
	}
	c, err := bootstrap.PlanOwned(fsys, p, hostsMode, []byte(mirrorapi.ManagedMarker+"\n# `nodecache gen containerd` created this directory; `gen containerd --remove` deletes it when it is empty.\n"))
	if err != nil {
		return nil, err
	}
	return []bootstrap.Change{c}, nil
}

// staleHosts plans the removal of our own hosts.toml files in dir for directories not in keep
// (an earlier run's upstreams) and takes the mirror out of a site's hosts.toml adopted then: a file without mirrorapi.ManagedMarker, or holding more than an upstream's
// mirror entry (settings moved there by --migrate), is never touched, and a directory goes only
// when it is then empty (Applier's PruneDir). Talos' applier does the same with the
// files it owns (docs/contracts.md, "Files nodecache owns and edits").
func staleHosts(fsys fs.FS, dir string, keep []string) ([]bootstrap.Change, error) {
	entries, err := fs.ReadDir(fsys, bootstrap.FSName(dir))
	if err != nil {
		return nil, nil // no directory: nothing of ours in it
	}
	want := map[string]bool{}
	for _, d := range keep {
		want[d] = true
	}
	var out []bootstrap.Change
	for _, ent := range entries {
		if want[ent.Name()] {
			continue
		}
		if fi, err := fs.Stat(fsys, bootstrap.FSName(path.Join(dir, ent.Name()))); err != nil || !fi.IsDir() {
			continue
		}
		file := path.Join(dir, ent.Name(), "hosts.toml")
		if data, ok, err := bootstrap.ReadFile(fsys, file); err == nil && ok && !mirrorapi.Managed(data) {
			c, ok, err := planUnadopt(fsys, file, data)
			if err != nil {
				return nil, err
			}
			if ok {
				c.Note = fmt.Sprintf("stale: %s is not an upstream of this run; %s", ent.Name(), c.Note)
				out = append(out, c)
			}
			continue
		}
		c, ok, _, err := bootstrap.PlanRemoveOwned(fsys, file, true)
		if err != nil {
			return nil, err
		}
		if ok && upstreamOnly(ent.Name(), c.Old) {
			c.Note = fmt.Sprintf("stale: %s is not an upstream of this run (left by an earlier gen); containerd would keep pulling it through that run's mirror", ent.Name())
			out = append(out, c)
		}
	}
	return out, nil
}

// configPlan is planConfig's result.
type configPlan struct {
	table    []string
	edited   string
	action   ConfigPathAction
	hostsDir string
	after    *Effective
	changes  []bootstrap.Change
	warnings []string
}

// planConfig decides config_path and the config edits (legacy tables removed with Migrate), and
// checks the result by re-reading the configuration as it will be.
func planConfig(fsys fs.FS, eff *Effective, opts Options) (*configPlan, error) {
	d := eff.Daemon
	if !eff.Exists {
		return planCreatedConfig(fsys, eff, opts)
	}
	switch {
	case eff.Schema == 1 && len(eff.Files) == 1 && len(eff.Files[0].tree) == 0:
		return planEmptyConfig(fsys, eff, opts)
	case eff.Schema == 1:
		return nil, refuseVersion1(eff, opts.Config)
	case eff.Schema > 4:
		return nil, refusal.Errorf("%s: version = %d is not a containerd config schema this gen knows (2, 3, 4)", opts.Config, eff.Schema)
	case eff.Schema > d.ConfigVersion() && !eff.DaemonAssumed:
		return nil, refusal.Errorf("%s: version = %d, but containerd %s loads at most version %d: this containerd would not start with it", opts.Config, eff.Schema, eff.Daemon, d.ConfigVersion())
	}

	cp := &configPlan{}
	ed := &configEdits{eff: eff, files: map[string][]byte{}, docs: map[string]*tomlDoc{}}
	if err := ed.removeLegacy(cp, opts); err != nil {
		return nil, err
	}
	cur := eff
	if len(ed.files) > 0 {
		var err error
		cur, err = Load(bootstrap.Overlay{Base: fsys, Files: ed.files}, opts.Config, LoadOptions{Daemon: eff.Daemon})
		if err != nil {
			return nil, fmt.Errorf("re-read %s after removing legacy tables: %w", opts.Config, err)
		}
	}
	if err := ed.setConfigPath(cp, cur, opts); err != nil {
		return nil, err
	}
	after := cur
	if len(ed.files) > 0 {
		var err error
		after, err = Load(bootstrap.Overlay{Base: fsys, Files: ed.files}, opts.Config, LoadOptions{Daemon: eff.Daemon})
		if err != nil {
			return nil, fmt.Errorf("re-read %s after editing: %w", opts.Config, err)
		}
	}
	cp.after = after
	if err := checkAfter(after, cp.hostsDir); err != nil {
		return nil, err
	}
	for _, f := range eff.Files {
		if b, ok := ed.files[f.Path]; ok {
			cp.changes = append(cp.changes, bootstrap.PlanEdit(f.Path, f.data, b))
			if cp.edited == "" {
				cp.edited = f.Path
			}
		}
	}
	return cp, nil
}

// planCreatedConfig plans a minimal config.toml where none exists, for a known containerd
// release.
func planCreatedConfig(fsys fs.FS, eff *Effective, opts Options) (*configPlan, error) {
	if eff.DaemonAssumed {
		return nil, refusal.Errorf("%s does not exist and the containerd version is unknown: pass --containerd-version (a minimal config.toml is created for it)", opts.Config)
	}
	data, table, err := minimalConfig(eff.Daemon, opts.CertsDir)
	if err != nil {
		return nil, err
	}
	c, err := bootstrap.PlanOwned(fsys, opts.Config, 0o644, data)
	if err != nil {
		return nil, err
	}
	after, err := Load(bootstrap.Overlay{Base: fsys, Files: map[string][]byte{opts.Config: data}}, opts.Config, LoadOptions{Daemon: eff.Daemon})
	if err != nil {
		return nil, fmt.Errorf("re-read created %s: %w", opts.Config, err)
	}
	cp := &configPlan{}
	cp.table, cp.edited, cp.action, cp.hostsDir, cp.after = table, opts.Config, ConfigPathCreated, opts.CertsDir, after
	cp.changes = []bootstrap.Change{c}
	return cp, checkAfter(after, cp.hostsDir)
}

// configEdits are the edited contents of the configuration's files, by path, and their parsed
// documents (each file of eff parsed once).
type configEdits struct {
	eff   *Effective
	files map[string][]byte
	docs  map[string]*tomlDoc
}

// doc is the parsed document of the file at p.
func (ed *configEdits) doc(p string) (*tomlDoc, error) {
	if td, ok := ed.docs[p]; ok {
		return td, nil
	}
	f, _ := ed.eff.FileByPath(p)
	td, err := parseTOMLDoc(f.data)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", p, err)
	}
	ed.docs[p] = td
	return td, nil
}

// removeLegacy is the legacy-tables step: the mirrors and (for 1.x) configs.<host>.tls tables of
// every contributing file are removed with Migrate, or refused without it; a 2.x daemon's ignored
// TLS tables are a warning.
func (ed *configEdits) removeLegacy(cp *configPlan, opts Options) error {
	eff := ed.eff
	strict1x := !eff.Daemon.V2() || eff.DaemonAssumed
	for _, f := range eff.Files {
		if !contributes(eff, f) {
			continue
		}
		var legacy [][]string
		if len(f.Mirrors) > 0 {
			legacy = append(legacy, append(slices.Clone(f.RegistryTable), "mirrors"))
		}
		if len(f.ConfigsTLS) > 0 {
			if strict1x {
				for _, h := range f.ConfigsTLS {
					legacy = append(legacy, append(slices.Clone(f.RegistryTable), "configs", h, "tls"))
				}
			} else {
				cp.warnings = append(cp.warnings, fmt.Sprintf("%s: %s.configs.<host>.tls is ignored by containerd 2.x (hosts: %s); move it into hosts.toml", f.Path, dotted(f.RegistryTable), strings.Join(f.ConfigsTLS, ", ")))
			}
		}
		if len(legacy) == 0 {
			continue
		}
		if err := ed.deleteLegacy(f.Path, legacy, opts.Migrate); err != nil {
			return err
		}
	}
	return nil
}

// deleteLegacy removes the legacy tables from the file at p (refused without migrate).
func (ed *configEdits) deleteLegacy(p string, legacy [][]string, migrate bool) error {
	if !migrate {
		var names []string
		for _, l := range legacy {
			names = append(names, dotted(l))
		}
		return refusal.Errorf("%s: %s: legacy registry settings cannot stand next to config_path (containerd refuses to load the CRI plugin): nothing was changed; run again with --migrate to move them into hosts.toml files and remove them", p, strings.Join(names, ", "))
	}
	td, err := ed.doc(p)
	if err != nil {
		return err
	}
	for _, l := range legacy {
		if err := td.deleteTree(l); err != nil {
			return refusal.Errorf("%s: %v", p, err)
		}
	}
	b, err := td.bytes()
	if err != nil {
		return refusal.Errorf("%s: removing legacy tables: %v", p, err)
	}
	ed.files[p] = b
	return nil
}

// setConfigPath is the config_path step over cur (the configuration with the legacy tables
// gone): an existing directory is adopted (the first of a list), else config_path is set to the
// certs directory in the file that should hold it.
func (ed *configEdits) setConfigPath(cp *configPlan, cur *Effective, opts Options) error {
	raw := cur.Registry.ConfigPath
	transfer := transferAfterSet(cur)
	switch {
	case raw != "" && !strings.Contains(raw, ":"):
		cp.action, cp.hostsDir = ConfigPathAdopted, path.Clean("/"+raw)
	case raw != "" && !transfer:
		cp.action, cp.hostsDir = ConfigPathFirstOfList, path.Clean("/"+strings.Split(raw, ":")[0])
		cp.warnings = append(cp.warnings, fmt.Sprintf("config_path %q is a list that containerd %s splits: hosts.toml files go into its first directory", raw, cur.Daemon))
	default:
		cp.action, cp.hostsDir = ConfigPathSet, opts.CertsDir
	}
	target := cur.ConfigPathFrom
	if target == "" {
		target = editTarget(cur)
	}
	tf, _ := cur.FileByPath(target)
	cp.table = tf.RegistryTable
	if cp.action != ConfigPathSet {
		return nil
	}
	td, err := ed.doc(target)
	if err != nil {
		return err
	}
	if err := td.setString(tf.RegistryTable, "config_path", opts.CertsDir, tf.RegistryTable[:2]); err != nil {
		return refusal.Errorf("%s: %v", target, err)
	}
	b, err := td.bytes()
	if err != nil {
		return refusal.Errorf("%s: setting config_path: %v", target, err)
	}
	ed.files[target] = b
	cp.edited = target
	return nil
}

// transferAfterSet reports whether CRI pulls of this containerd go through the transfer service
// (so a ':'-list config_path is read as one directory). An unknown release counts as one that
// does.
func transferAfterSet(e *Effective) bool {
	return e.TransferService || (e.DaemonAssumed && len(e.LocalPull) == 0)
}

// contributes reports whether a file's registry table reaches the effective configuration: on
// 1.x only the last file with the plugin table counts.
func contributes(e *Effective, f ConfigFile) bool {
	if daemonIs2xOnly(e) || e.DaemonAssumed {
		return true
	}
	return e.PluginFrom == f.Path
}

func daemonIs2xOnly(e *Effective) bool { return e.Daemon.V2() && !e.DaemonAssumed }

// editTarget picks the file that gets config_path when no file sets it: for 1.x the file whose
// plugin table wins; for 2.x the main file (nothing overrides a key no file sets).
func editTarget(e *Effective) string {
	if e.PluginFrom != "" {
		return e.PluginFrom
	}
	return e.Files[0].Path
}

// checkAfter verifies the configuration as it will be: the CRI plugin loads, and its pull reads
// hostsDir first. A failure here means an import or a rule beat the edit: nothing is written.
func checkAfter(after *Effective, hostsDir string) error {
	if len(after.Problems) > 0 {
		return refusal.Errorf("after the edit the CRI plugin would refuse its configuration: %s", strings.Join(after.Problems, "; "))
	}
	if len(after.HostDirs) == 0 || path.Clean("/"+after.HostDirs[0]) != hostsDir {
		return refusal.Errorf("after the edit containerd would read hosts.toml from %q, not %q (an import overrides the edited file?): nothing was changed", after.ConfigPath, hostsDir)
	}
	return nil
}

// minimalConfig is the config.toml created when there is none: the Marker, then minimalDoc.
func minimalConfig(d Release, certsDir string) ([]byte, []string, error) {
	b, table, err := minimalDoc(d, certsDir)
	out := []byte(mirrorapi.ManagedMarker + "\n# Created by `nodecache gen containerd` because there was no config.toml; `gen --remove` deletes it.\n")
	return append(out, b...), table, err
}

// minimalDoc is the schema the daemon loads without migrating (its version.ConfigVersion: 2 for
// 1.x, 3 for 2.0-2.2, 4 from 2.3, so containerd logs no "Configuration migrated" at start) and
// the registry config_path in that schema's table, encoded from typed values.
func minimalDoc(d Release, certsDir string) ([]byte, []string, error) {
	doc := map[string]any{
		"version": d.ConfigVersion(),
		"plugins": map[string]any{d.PluginID(): map[string]any{"registry": map[string]any{"config_path": certsDir}}},
	}
	b, err := toml.Marshal(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("encode minimal config.toml: %w", err)
	}
	return b, []string{"plugins", d.PluginID(), "registry"}, nil
}

// planEmptyConfig plans the edit of a config.toml without keys (empty, or comments only), which
// every containerd runs on its defaults: minimalDoc is appended (its comments stay), so the file
// gets the schema the daemon loads natively and config_path; the original is backed up.
func planEmptyConfig(fsys fs.FS, eff *Effective, opts Options) (*configPlan, error) {
	if eff.DaemonAssumed {
		return nil, refusal.Errorf("%s has no settings and the containerd version is unknown: pass --containerd-version (the file then gets that release's `version` and config_path)", opts.Config)
	}
	f := eff.Files[0]
	body, table, err := minimalDoc(eff.Daemon, opts.CertsDir)
	if err != nil {
		return nil, err
	}
	old := append([]byte{}, f.data...)
	data := append([]byte{}, old...)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	data = append(data, body...)
	after, err := Load(bootstrap.Overlay{Base: fsys, Files: map[string][]byte{f.Path: data}}, opts.Config, LoadOptions{Daemon: eff.Daemon})
	if err != nil {
		return nil, fmt.Errorf("re-read %s after editing: %w", opts.Config, err)
	}
	cp := &configPlan{table: table, edited: f.Path, action: ConfigPathSet, hostsDir: opts.CertsDir, after: after,
		changes: []bootstrap.Change{bootstrap.PlanEdit(f.Path, old, data)}}
	return cp, checkAfter(after, cp.hostsDir)
}

// refuseVersion1 refuses a config.toml with settings but no `version` key, which containerd reads
// as the deprecated version 1 (1.7 warns at every start, 2.x migrates it at every start), with
// the way out for the release at hand: 1.x has no `containerd config migrate`.
func refuseVersion1(eff *Effective, file string) error {
	const v2 = "add `version = 2` as its first line and name its plugin tables by their full IDs (plugins.cri -> plugins.\"io.containerd.grpc.v1.cri\")"
	// Said after "on containerd 2.x" or "containerd v2.…": the release is named once.
	migrate := fmt.Sprintf("convert it with `containerd config migrate > %s.new`, review it, move it in place", file)
	switch {
	case eff.DaemonAssumed:
		return refusal.Errorf("%s has no `version` key, so containerd reads it as the deprecated version 1: on containerd 2.x %s; on 1.x %s; then run gen again", file, migrate, v2)
	case !eff.Daemon.V2():
		return refusal.Errorf("%s has no `version` key, so containerd %s reads it as the deprecated version 1: %s, then run gen again", file, eff.Daemon, v2)
	}
	return refusal.Errorf("%s has no `version` key, so containerd %s reads it as version 1 and migrates it at every start: %s, then run gen again", file, eff.Daemon, migrate)
}

// refuseForeign refuses configurations another tool renders: k3s and RKE2 (config.toml.tmpl
// beside it, a rancher path, or a k3s/RKE2 config when the default path is absent) and Talos.
func refuseForeign(fsys fs.FS, cfg string) error {
	const k3sMsg = "%s: k3s/RKE2 renders containerd's config itself and overwrites edits: configure mirrors in /etc/rancher/k3s/registries.yaml (RKE2: /etc/rancher/rke2/registries.yaml) with endpoint %s instead"
	if strings.Contains(cfg, "/rancher/") {
		return refusal.Errorf(k3sMsg, cfg, "<mirror>")
	}
	if _, err := fs.Stat(fsys, bootstrap.FSName(cfg+".tmpl")); err == nil {
		return refusal.Errorf(k3sMsg, cfg+".tmpl", "<mirror>")
	}
	if _, err := fs.Stat(fsys, bootstrap.FSName(cfg)); errors.Is(err, fs.ErrNotExist) && cfg == DefaultConfig {
		for _, p := range []string{"/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"} {
			if _, err := fs.Stat(fsys, bootstrap.FSName(p)); err == nil {
				return refusal.Errorf(k3sMsg, p, "<mirror>")
			}
		}
	}
	if osr, _, _ := bootstrap.ReadFile(fsys, "/etc/os-release"); osr != nil {
		for _, line := range strings.Split(string(osr), "\n") {
			if strings.TrimSpace(line) == "ID=talos" {
				return refusal.Errorf("this host runs Talos, which generates containerd's configuration from the machine config: use `nodecache gen talos` and apply the patch")
			}
		}
	}
	return nil
}

// checkMirrorCA validates --mirror-ca: only for https, a readable PEM certificate
// (bootstrap.ReadMirrorCA).
func checkMirrorCA(fsys fs.FS, opts Options) error {
	if opts.MirrorCA == "" {
		return nil
	}
	if opts.Mirror.HTTP() {
		return refusal.Errorf("--mirror-ca is for an https mirror; %s is http (a CA would make containerd try HTTPS first)", opts.Mirror)
	}
	_, err := bootstrap.ReadMirrorCA(fsys, "", opts.MirrorCA)
	return err
}
