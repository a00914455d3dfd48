package crio

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// siteView is what the site's own registries files (the main registries.conf and the other
// drop-ins of one directory) say about our prefixes.
type siteView struct {
	// Overrides: later drop-ins replace our [[registry]] for a prefix.
	Overrides []Override
	// Before maps each of our prefixes to the site's table containers/image would use for it
	// without our drop-in (the last one in the main file and the drop-ins read before ours).
	Before map[string]siteEntry
	// Longer: tables in any of the files whose prefix lies inside one of ours
	// ("docker.io/library" inside "docker.io").
	Longer []Override
	// Broken are files that do not parse as TOML, each as "<file>: <error>". containers/image
	// refuses the whole configuration then, so every CRI-O pull fails.
	Broken []string
}

// siteEntry is a site [[registry]] table and its file.
type siteEntry struct {
	file string
	reg  registry
}

// readSite reads main (the registries.conf paired with dir) and every *.conf in dir except
// ours, in name order as containers/image reads them, and reports the tables that bear on our
// prefixes (the prefix, or the location when no prefix is set), and the files that do not parse.
func readSite(fsys fs.FS, main, dir string, upstreams []string) (siteView, error) {
	v := siteView{Before: map[string]siteEntry{}}
	files := []string{main}
	if ents, err := fs.ReadDir(fsys, bootstrap.FSName(dir)); err == nil {
		for _, e := range ents {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".conf") || e.Name() == DropInName {
				continue
			}
			files = append(files, path.Join(dir, e.Name()))
		}
	}
	for i, p := range files {
		data, ok, err := bootstrap.ReadFile(fsys, p)
		if err != nil {
			return v, err
		}
		if !ok {
			continue
		}
		var conf registriesConf
		if err := toml.Unmarshal(data, &conf); err != nil {
			var de *toml.DecodeError
			if errors.As(err, &de) {
				row, col := de.Position()
				err = fmt.Errorf("row %d column %d: %w", row, col, de)
			}
			v.Broken = append(v.Broken, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		v.add(p, i > 0 && path.Base(p) > DropInName, conf.Registries, upstreams)
	}
	return v, nil
}

// add records the tables of file p that bear on upstreams: a longer prefix inside one, a table
// for one before our drop-in, or one that overrides it (later: p is read after our drop-in).
func (v *siteView) add(p string, later bool, regs []registry, upstreams []string) {
	for _, r := range regs {
		prefix := r.Prefix
		if prefix == "" {
			prefix = r.Location
		}
		prefix = strings.TrimSuffix(prefix, "/")
		for _, up := range upstreams {
			if len(prefix) > len(up) && strings.HasPrefix(prefix, up) && strings.ContainsRune("/:@", rune(prefix[len(up)])) {
				v.Longer = append(v.Longer, Override{Prefix: prefix, File: p, Of: up})
			}
		}
		if !slices.Contains(upstreams, prefix) {
			continue
		}
		if later {
			v.Overrides = append(v.Overrides, Override{Prefix: prefix, File: p})
		} else {
			v.Before[prefix] = siteEntry{file: p, reg: r}
		}
	}
}

// planEntries builds our [[registry]] table for each upstream: the mirror first, then the
// registry itself (insecure for an --upstream NAME=http://NAME fallback). Where the site already
// has a table for the prefix (site.Before), our drop-in replaces it, so it is merged: when its
// location is empty or the prefix itself, its blocked and insecure are kept, its
// mirror-by-digest-only becomes pull-from-mirror = "digest-only" on each of its mirrors, and its
// mirrors follow ours; a table whose location is another registry is refused (ErrRefused),
// naming its file: its images come from elsewhere, the mirror would serve other content.
func planEntries(opts Options, upstreams []string, site siteView) ([]registry, []Override, error) {
	var (
		out    []registry
		merged []Override
	)
	for _, n := range upstreams {
		ours := mirrorEndpoint{Location: opts.Mirror.Host() + "/" + mirrorPrefix(n), Insecure: opts.Mirror.HTTP(), PullFromMirror: "all"}
		r := registry{Prefix: n, Location: n, Insecure: strings.HasPrefix(opts.Fallbacks[n], "http://"), Mirrors: []mirrorEndpoint{ours}}
		if s, ok := site.Before[n]; ok {
			if loc := strings.TrimSuffix(s.reg.Location, "/"); loc != "" && loc != n {
				return nil, nil, refusal.Errorf("%s: [[registry]] prefix %q has location %q: images of %s come from another registry there, so the mirror (which fetches them from %s itself) cannot be merged into it; leave %s out of --upstream or change that entry; nothing was changed", s.file, n, s.reg.Location, n, n, n)
			}
			r.Insecure = r.Insecure || s.reg.Insecure
			r.Blocked = s.reg.Blocked
			for _, sm := range s.reg.Mirrors {
				if sm.Location == ours.Location {
					continue
				}
				if s.reg.MirrorByDigestOnly && sm.PullFromMirror == "" {
					sm.PullFromMirror = "digest-only"
				}
				r.Mirrors = append(r.Mirrors, sm)
			}
			merged = append(merged, Override{Prefix: n, File: s.file})
		}
		out = append(out, r)
	}
	return out, merged, nil
}

// validateTogether loads main, the drop-ins of dir and ours (data) with containers/image's own
// loader (sysregistriesv2, the code CRI-O runs), from a private copy (MergedView), so nothing on
// the host is written. The error names host paths.
func validateTogether(fsys fs.FS, main, dir string, data []byte) error {
	_, done, err := MergedView(fsys, main, dir, map[string][]byte{DropInName: data})
	if err != nil {
		var le *LoadError
		if errors.As(err, &le) {
			return refusal.Errorf("containers/image refuses %s + %s with %s added: %s: CRI-O would reject the whole registries configuration (every pull fails); fix the file named, then run gen again; nothing was changed", main, dir, DropInName, le.Msg)
		}
		return err
	}
	done()
	return nil
}

// LoadError is containers/image refusing a registries configuration; Msg names host paths.
type LoadError struct{ Msg string }

func (e *LoadError) Error() string {
	return "containers/image refuses the registries configuration: " + e.Msg
}

// MergedView loads the registries configuration CRI-O reads — main (a registries.conf) and the
// *.conf drop-ins of dir, host paths read through fsys, so symbolic links resolve as on the host
// even under a host root (bootstrap.HostFS) — with containers/image's own loader
// (sysregistriesv2), from a private copy in a temporary directory. over replaces or adds
// drop-ins by file name (a planned drop-in). A main file in the v1 format is left out: this
// library version refuses it, older CRI-O releases convert it. The returned SystemContext
// answers sysregistriesv2 queries (FindRegistry, GetRegistries) until done is called, which
// removes the copy. A configuration containers/image refuses is a *LoadError naming host paths.
func MergedView(fsys fs.FS, main, dir string, over map[string][]byte) (sys *types.SystemContext, done func(), err error) {
	tmp, err := os.MkdirTemp("", "nodecache-registries-")
	if err != nil {
		return nil, nil, fmt.Errorf("copy registries configuration: %w", err)
	}
	cleanup := func() {
		_ = os.RemoveAll(tmp)
		sysregistriesv2.InvalidateCache() // keyed by path: the copy's entry would stay forever
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	tmpMain, tmpDir := filepath.Join(tmp, "registries.conf"), filepath.Join(tmp, "registries.conf.d")
	if err := os.Mkdir(tmpDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("copy registries configuration: %w", err)
	}
	mainData, _, err := bootstrap.ReadFile(fsys, main)
	if err != nil {
		return nil, nil, err
	}
	var probe map[string]any
	if toml.Unmarshal(mainData, &probe) == nil {
		if _, v1 := probe["registries"]; v1 {
			mainData = nil
		}
	}
	if err := os.WriteFile(tmpMain, mainData, 0o600); err != nil {
		return nil, nil, fmt.Errorf("copy registries configuration: %w", err)
	}
	copies := map[string][]byte{}
	if ents, err := fs.ReadDir(fsys, bootstrap.FSName(dir)); err == nil {
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".conf") {
				continue
			}
			p := path.Join(dir, e.Name())
			if fi, err := fs.Stat(fsys, bootstrap.FSName(p)); err != nil || fi.IsDir() {
				continue // a directory, or a link to nothing: containers/image skips it too
			}
			b, _, err := bootstrap.ReadFile(fsys, p)
			if err != nil {
				return nil, nil, err
			}
			copies[e.Name()] = b
		}
	}
	maps.Copy(copies, over)
	for n, b := range copies {
		if err := os.WriteFile(filepath.Join(tmpDir, n), b, 0o600); err != nil {
			return nil, nil, fmt.Errorf("copy registries configuration: %w", err)
		}
	}
	sys = &types.SystemContext{SystemRegistriesConfPath: tmpMain, SystemRegistriesConfDirPath: tmpDir}
	if _, err := sysregistriesv2.TryUpdatingCache(sys); err != nil {
		return nil, nil, &LoadError{Msg: strings.NewReplacer(tmpMain, main, tmpDir, dir).Replace(err.Error())}
	}
	return sys, cleanup, nil
}

// mainFor is the registries.conf containers/image reads together with drop-in directory dir.
func mainFor(dir string) string {
	if dir == rootUserConf+".d" {
		return rootUserConf
	}
	return MainRegistriesConf
}
