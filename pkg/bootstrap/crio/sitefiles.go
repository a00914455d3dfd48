package crio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/nodecache/nodecache/pkg/bootstrap"
)

// siteView is what the site's own registries files (the main registries.conf and the other
// drop-ins of one directory) say about our prefixes.
type siteView struct {
	// Overrides: later drop-ins replace our [[registry]] for a prefix.
	Overrides []Override
	// Replaced: the main file or an earlier drop-in has a [[registry]] for one of our prefixes,
	// which our drop-in replaces as a whole.
	Replaced []Override
	// Broken are files that do not parse as TOML, each as "<file>: <error>". containers/image
	// refuses the whole configuration then, so every CRI-O pull fails.
	Broken []string
}

// readSite reads main (the registries.conf paired with dir) and every *.conf in dir except
// ours, in name order as containers/image reads them, and reports which of them define a
// [[registry]] with one of our prefixes (the prefix, or the location when no prefix is set), and
// which do not parse.
func readSite(fsys fs.FS, main, dir string, upstreams []string) (siteView, error) {
	var v siteView
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
		later := i > 0 && path.Base(p) > DropInName
		for _, r := range conf.Registries {
			prefix := r.Prefix
			if prefix == "" {
				prefix = r.Location
			}
			if !slices.Contains(upstreams, strings.TrimSuffix(prefix, "/")) {
				continue
			}
			o := Override{Prefix: strings.TrimSuffix(prefix, "/"), File: p}
			if later {
				v.Overrides = append(v.Overrides, o)
			} else {
				v.Replaced = append(v.Replaced, o)
			}
		}
	}
	return v, nil
}

// validateTogether loads main, the drop-ins of dir and ours (data) with containers/image's own
// loader (sysregistriesv2, the code CRI-O runs), from a private copy in a temporary directory so
// nothing on the host is written. A main file in the v1 format is left out: this library version
// refuses it, older CRI-O releases convert it (reported separately). The error names host paths.
func validateTogether(fsys fs.FS, main, dir string, data []byte) error {
	tmp, err := os.MkdirTemp("", "nodecache-registries-")
	if err != nil {
		return fmt.Errorf("validate registries configuration: %w", err)
	}
	defer os.RemoveAll(tmp)
	tmpMain, tmpDir := filepath.Join(tmp, "registries.conf"), filepath.Join(tmp, "registries.conf.d")
	if err := os.Mkdir(tmpDir, 0o700); err != nil {
		return fmt.Errorf("validate registries configuration: %w", err)
	}
	mainData, _, err := bootstrap.ReadFile(fsys, main)
	if err != nil {
		return err
	}
	var probe map[string]any
	if toml.Unmarshal(mainData, &probe) == nil {
		if _, v1 := probe["registries"]; v1 {
			mainData = nil
		}
	}
	if err := os.WriteFile(tmpMain, mainData, 0o600); err != nil {
		return fmt.Errorf("validate registries configuration: %w", err)
	}
	copies := map[string][]byte{DropInName: data}
	if ents, err := fs.ReadDir(fsys, bootstrap.FSName(dir)); err == nil {
		for _, e := range ents {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".conf") || e.Name() == DropInName {
				continue
			}
			b, _, err := bootstrap.ReadFile(fsys, path.Join(dir, e.Name()))
			if err != nil {
				return err
			}
			copies[e.Name()] = b
		}
	}
	for name, b := range copies {
		if err := os.WriteFile(filepath.Join(tmpDir, name), b, 0o600); err != nil {
			return fmt.Errorf("validate registries configuration: %w", err)
		}
	}
	sys := &types.SystemContext{SystemRegistriesConfPath: tmpMain, SystemRegistriesConfDirPath: tmpDir}
	if _, err := sysregistriesv2.TryUpdatingCache(sys); err != nil {
		msg := strings.NewReplacer(tmpMain, main, tmpDir, dir).Replace(err.Error())
		return bootstrap.Refusedf("containers/image refuses %s + %s with %s added: %s: CRI-O would reject the whole registries configuration (every pull fails); fix the file named, then run gen again; nothing was changed", main, dir, DropInName, msg)
	}
	return nil
}

// mainFor is the registries.conf containers/image reads together with drop-in directory dir.
func mainFor(dir string) string {
	if dir == rootUserConf+".d" {
		return rootUserConf
	}
	return MainRegistriesConf
}
