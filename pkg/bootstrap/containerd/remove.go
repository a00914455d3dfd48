package containerd

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// PlanRemove computes what `gen containerd --remove` undoes: every hosts.toml that starts with
// mirrorapi.ManagedMarker under the directories containerd reads (and CertsDir) is removed (its
// directory too when then empty), and a directory gen created (DirMarker) when then empty; a site's hosts.toml gen added the mirror to gets its backup
// back (byte for byte) or, when it changed since, loses only the mirror's table; a config file nodecache edited is restored from its
// <file>.nodecache.bak when the file still holds exactly what gen would have written from that
// backup; a config.toml nodecache created is removed. Anything else is left and reported.
// restart_required is set when a config file changes. A backup that is a symbolic link (its
// target would be moved over the config) is refused (ErrRefused) naming the link and its
// target, and nothing is planned (bootstrap.ReadBackup).
func PlanRemove(fsys fs.FS, opts Options) (*Report, error) {
	if err := opts.checkPaths(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	fsys = bootstrap.Resolving(fsys)
	rep := &Report{Runtime: "containerd", Config: opts.Config}
	eff, err := Load(fsys, opts.Config, LoadOptions{Daemon: opts.Daemon})
	if err != nil {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("config not readable (%v): only hosts.toml files under %s are removed", err, opts.CertsDir))
		eff = nil
	}
	if eff != nil {
		rep.Schema, rep.Daemon, rep.DaemonAssumed = eff.Schema, eff.Daemon.String(), eff.DaemonAssumed
		rep.ConfigPath = eff.ConfigPath
	}
	for _, dir := range removeDirs(eff, opts) {
		if err := planRemoveHosts(fsys, dir, rep); err != nil {
			return nil, err
		}
	}
	if eff == nil {
		return resolved(fsys, rep)
	}
	backedUp, err := planRestoreConfigs(fsys, eff, opts, rep)
	if err != nil {
		return nil, err
	}
	if from := eff.ConfigPathFrom; from != "" && !backedUp[from] {
		if w := unbackedConfigPath(eff, from, rep.Changes); w != "" {
			rep.Warnings = append(rep.Warnings, w)
		}
	}
	return resolved(fsys, rep)
}

// removeDirs are the hosts.toml directories --remove looks in: CertsDir, then those containerd
// reads (eff nil: the configuration is unreadable).
func removeDirs(eff *Effective, opts Options) []string {
	dirs := []string{opts.CertsDir}
	if eff == nil {
		return dirs
	}
	for _, d := range append(slices.Clone(eff.HostDirs), strings.Split(eff.Registry.ConfigPath, ":")...) {
		if d == "" {
			continue
		}
		d = path.Clean("/" + d)
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// planRemoveHosts is the hosts.toml step for one directory: our hosts.toml files removed, the
// mirror taken out of a site's own, then DirMarker (and the directory when nothing else is left).
func planRemoveHosts(fsys fs.FS, dir string, rep *Report) error {
	entries, err := fs.ReadDir(fsys, bootstrap.FSName(dir))
	if err != nil {
		return nil // a directory that does not exist holds nothing of ours
	}
	for _, ent := range entries {
		if !ent.IsDir() {
			// A per-host directory may be a link to a directory elsewhere.
			fi, err := fs.Stat(fsys, bootstrap.FSName(path.Join(dir, ent.Name())))
			if ent.Type()&fs.ModeSymlink == 0 || err != nil || !fi.IsDir() {
				continue
			}
		}
		if err := planRemoveHostsFile(fsys, path.Join(dir, ent.Name(), "hosts.toml"), rep); err != nil {
			return err
		}
	}
	// Last in the directory: the directory goes with it when nothing else is left.
	c, ok, _, err := bootstrap.PlanRemoveOwned(fsys, path.Join(dir, DirMarker), true)
	if err != nil {
		return err
	}
	if ok {
		rep.Changes = append(rep.Changes, c)
	}
	return nil
}

// planRemoveHostsFile removes file when it is ours, or takes the mirror gen added out of the
// site's own.
func planRemoveHostsFile(fsys fs.FS, file string, rep *Report) error {
	if data, ok, err := bootstrap.ReadFile(fsys, file); err == nil && ok && !mirrorapi.Managed(data) {
		// The site's own hosts.toml: take out the mirror gen added, if any.
		c, ok, err := planUnadopt(fsys, file, data)
		if err != nil {
			return err
		}
		if ok {
			rep.Changes = append(rep.Changes, c)
		}
		return nil
	}
	c, ok, note, err := bootstrap.PlanRemoveOwned(fsys, file, true)
	if err != nil {
		return err
	}
	if note != "" {
		rep.Warnings = append(rep.Warnings, note)
	}
	if ok {
		rep.Changes = append(rep.Changes, c)
	}
	return nil
}

// planRestoreConfigs is the config step: a config.toml nodecache created is removed, an edited
// config file is restored from its backup when it still holds what gen wrote from it. It returns
// the config files with a backup, or removed as nodecache's own.
func planRestoreConfigs(fsys fs.FS, eff *Effective, opts Options, rep *Report) (map[string]bool, error) {
	backedUp := map[string]bool{}
	for _, f := range eff.Files {
		if mirrorapi.Managed(f.data) && f.Path == opts.Config {
			backedUp[f.Path] = true
			rep.Changes = append(rep.Changes, bootstrap.Change{Path: f.Path, Action: bootstrap.ActionRemove, Old: f.data,
				Note: "config.toml created by nodecache"})
			rep.RestartRequired = true
			continue
		}
		// The backup lies beside the file a symbolic link leads to (ResolveChanges put it there).
		real, err := bootstrap.Resolve(fsys, f.Path)
		if err != nil {
			return nil, err
		}
		bak := real + bootstrap.BackupSuffix
		orig, ok, err := bootstrap.ReadBackup(fsys, bak)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		backedUp[f.Path] = true
		if !wroteFromBackup(fsys, eff, f, orig, opts) {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s changed since nodecache edited it: left as it is; the original is in %s", f.Path, bak))
			continue
		}
		rep.Changes = append(rep.Changes, bootstrap.Change{Path: f.Path, Action: bootstrap.ActionRestore, Old: f.data, New: orig, Backup: bak})
		rep.EditedFile = f.Path
		rep.RestartRequired = true
	}
	return backedUp, nil
}

// unbackedConfigPath is the warning for a config_path that --remove leaves in a file without a
// backup (`gen --dry-run | patch` makes none) while it removes the directory that config_path
// names (gen created it: DirMarker): without a backup nothing tells whether gen or the site wrote
// the line, so it stays, and the user is told which line it is and what to do. "" when no such
// directory goes.
func unbackedConfigPath(eff *Effective, file string, changes []bootstrap.Change) string {
	f, _ := eff.FileByPath(file)
	for _, dir := range strings.Split(eff.Registry.ConfigPath, ":") {
		if dir == "" {
			continue
		}
		dir = path.Clean("/" + dir)
		if !slices.ContainsFunc(changes, func(c bootstrap.Change) bool {
			return c.Action == bootstrap.ActionRemove && c.Path == path.Join(dir, DirMarker)
		}) {
			continue
		}
		return fmt.Sprintf("%s keeps config_path = %q in [%s], but %s, which nodecache created, is removed with its hosts.toml files: "+
			"there is no %s (`gen --dry-run | patch` makes none), so --remove cannot tell whether gen added that line or the site did, and leaves it; "+
			"if gen added it, delete that line (or put back the config.toml you had) and restart containerd",
			file, f.ConfigPath, dotted(f.RegistryTable), dir, file+bootstrap.BackupSuffix)
	}
	return ""
}

// resolved points rep's changes at the files symbolic links lead to (bootstrap.ResolveChanges).
func resolved(fsys fs.FS, rep *Report) (*Report, error) {
	var err error
	if rep.Changes, err = bootstrap.ResolveChanges(fsys, rep.Changes); err != nil {
		return nil, err
	}
	return rep, nil
}

// wroteFromBackup reports whether f's current bytes are what Plan produces from its backup: the
// backup's view planned again with config_path = the value now in effect (the one gen set), with
// and without --migrate, for the containerd release given at removal and then for each release
// line whose rules change what gen writes (genLines: 1.x schema 2 and its plugin ID, 2.0
// schema 3, 2.1 the transfer service, 2.3 schema 4), since gen may have run for another release than the one given
// now (an empty config.toml gets the `version` of the release gen ran for). Only an exact match
// counts, so a file changed since gen is never restored over. No record beyond the backup is needed.
func wroteFromBackup(fsys fs.FS, eff *Effective, f ConfigFile, orig []byte, opts Options) bool {
	if bytes.Equal(orig, f.data) {
		return true
	}
	over := bootstrap.Overlay{Base: fsys, Files: map[string][]byte{f.Path: orig}}
	releases := append([]Release{opts.Daemon}, genLines()...)
	for i, v := range releases {
		if i > 0 && v == opts.Daemon {
			continue
		}
		// The config_path gen set, as the release gen ran for reads it.
		now := eff
		if i > 0 {
			var err error
			if now, err = Load(fsys, opts.Config, LoadOptions{Daemon: v}); err != nil {
				continue
			}
		}
		dir, single := now.SingleDirectory()
		if !single {
			continue
		}
		before, err := Load(over, opts.Config, LoadOptions{Daemon: v})
		if err != nil {
			continue
		}
		for _, migrate := range []bool{false, true} {
			o := opts
			o.CertsDir, o.Migrate, o.Daemon = dir, migrate, v
			cp, err := planConfig(over, before, o)
			if err != nil {
				continue
			}
			for _, c := range cp.changes {
				if c.Path == f.Path && bytes.Equal(c.New, f.data) {
					return true
				}
			}
		}
	}
	return false
}
