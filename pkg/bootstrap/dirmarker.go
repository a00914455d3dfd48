package bootstrap

import (
	"errors"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// DirMarker is the file gen writes into a directory it creates (Applier creates the missing
// directories of a file it writes): the record that the directory is nodecache's, so that
// --remove deletes it once it is empty, and never a directory the site made. Its content is
// mirrorapi.ManagedMarker and comment lines only, so a runtime that reads every file of its
// drop-in directory (CRI-O's crio.conf.d) reads it as an empty TOML document.
const DirMarker = ".nodecache-created-this-directory"

// PlanDirMarkers plans DirMarker, holding content (which must start with
// mirrorapi.ManagedMarker), in each of dirs (host paths) and each of their parents that does not
// exist yet, and keeps (unchanged) the markers an earlier run wrote there. Walking up from a
// directory stops at the first one that exists without a marker (the site made it) and below
// the top level: every host has its /etc, and gen never claims one. Each directory is planned
// once, parents first.
func PlanDirMarkers(fsys fs.FS, content []byte, dirs ...string) ([]Change, error) {
	var mark []string
	for _, dir := range dirs {
		for d := path.Clean("/" + dir); path.Dir(d) != "/"; d = path.Dir(d) {
			if !createdByUs(fsys, d) {
				break
			}
			if !slices.Contains(mark, d) {
				mark = append(mark, d)
			}
		}
	}
	slices.SortFunc(mark, byDepth)
	out := make([]Change, 0, len(mark))
	for _, d := range mark {
		c, err := PlanOwned(fsys, path.Join(d, DirMarker), 0o644, content)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// createdByUs reports whether gen creates dir (it does not exist) or created it earlier (it
// holds DirMarker).
func createdByUs(fsys fs.FS, dir string) bool {
	if _, err := fs.Stat(fsys, FSName(dir)); errors.Is(err, fs.ErrNotExist) {
		return true
	}
	data, ok, err := ReadFile(fsys, path.Join(dir, DirMarker))
	return err == nil && ok && mirrorapi.Managed(data)
}

// PlanRemoveDirMarkers plans the removal of the DirMarker files in dirs (host paths) and in
// their parents, each with PruneDir, deepest first, so that every directory gen created goes
// once nothing else is left in it. Walking up from a directory stops at the first one without
// a marker of nodecache's. Plan them after the removals of the files in those directories.
func PlanRemoveDirMarkers(fsys fs.FS, dirs ...string) ([]Change, error) {
	var marked []string
	for _, dir := range dirs {
		for d := path.Clean("/" + dir); path.Dir(d) != "/"; d = path.Dir(d) {
			data, ok, err := ReadFile(fsys, path.Join(d, DirMarker))
			if err != nil {
				return nil, err
			}
			if !ok || !mirrorapi.Managed(data) {
				break
			}
			if !slices.Contains(marked, d) {
				marked = append(marked, d)
			}
		}
	}
	slices.SortFunc(marked, func(a, b string) int { return byDepth(b, a) })
	out := make([]Change, 0, len(marked))
	for _, d := range marked {
		c, ok, _, err := PlanRemoveOwned(fsys, path.Join(d, DirMarker), true)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, c)
		}
	}
	return out, nil
}

// byDepth orders host paths parents first, then by name.
func byDepth(a, b string) int {
	if da, db := strings.Count(a, "/"), strings.Count(b, "/"); da != db {
		return da - db
	}
	return strings.Compare(a, b)
}
