package bundle

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// The directories of Talos's flat image cache (siderolabs/talos pkg/imager/cache/cache.go:
// blobsDir, manifestsDir; the reference and digest directories of processImage).
const (
	flatBlobDir      = "blob"
	flatManifestsDir = "manifests"
	flatReferenceDir = "reference"
	flatDigestDir    = "digest"
)

// talosFlatWriter writes Talos's flat image cache, as `talosctl images cache-create --layout
// flat` does (siderolabs/talos pkg/imager/cache/cache.go):
//
//   - every config and layer as blob/sha256-<hex> (processLayer, cacheImage);
//   - every manifest — the index a tag names and the image manifests walked — as
//     manifests/<registry>/<repository>/digest/sha256-<hex> (processImage, cacheImage);
//   - every tag as manifests/<registry>/<repository>/reference/<tag>, the same bytes as the
//     digest file of what it names (processImage; Talos's registryd checks that they hash
//     alike, resolveCanonicalRef in
//     internal/app/machined/pkg/system/services/registry/registry.go).
//
// <registry> is TalosRegistryDir's (":port" as "_port_", Docker Hub as docker.io); no media
// types are stored (registryd sniffs them from the manifest bytes, getManifestData). Manifests
// are staged in the work directory and moved under manifests/ by Commit: a new tree gets its
// manifests/ in one rename, so a tree without it is one still being written.
type talosFlatWriter struct {
	dir string
}

// openTalosFlatWriter checks what DIR holds (entries) for a Talos flat tree writer: nothing, or only
// blob/ and manifests/ directories. existing is whether manifests/ is there.
func openTalosFlatWriter(dir string, entries []fs.DirEntry) (*talosFlatWriter, bool, error) {
	l := &talosFlatWriter{dir: dir}
	if len(entries) == 0 {
		return l, false, nil
	}
	if isTalosTree(entries) {
		return l, slices.ContainsFunc(entries, func(e fs.DirEntry) bool { return e.Name() == flatManifestsDir }), nil
	}
	if slices.ContainsFunc(entries, func(e fs.DirEntry) bool { return e.Name() == OCILayoutFile }) {
		return nil, false, refusal.Errorf("--to %s holds an OCI image layout (%s), not a Talos flat image cache: add to it with --format oci, or give another directory", dir, OCILayoutFile)
	}
	return nil, false, refusal.Errorf("--to %s is not empty and is not a Talos flat image cache (only %s/ and %s/; it holds %s): want a new or empty directory, or a Talos flat image cache to add to", dir, flatBlobDir, flatManifestsDir, describeEntries(entries))
}

func (l *talosFlatWriter) start(*Writer) error { return nil }

func (l *talosFlatWriter) blobPath(d digest.Digest) (string, error) {
	name, err := TalosDigestName(d)
	if err != nil {
		return "", err
	}
	return filepath.Join(l.dir, flatBlobDir, name), nil
}

// repoDir is registry/repository's directory under manifests/.
func repoDir(registry, repository string) string {
	return filepath.Join(TalosRegistryDir(registry), filepath.FromSlash(repository))
}

// putManifest stages the manifest as <work>/manifests/<registry>/<repository>/digest/sha256-<hex>.
func (l *talosFlatWriter) putManifest(w *Writer, registry, repository string, d digest.Digest, body []byte) error {
	name, err := TalosDigestName(d)
	if err != nil {
		return err
	}
	p := filepath.Join(w.work, flatManifestsDir, repoDir(registry, repository), flatDigestDir, name)
	if err := w.writeFileAtomic(p, body); err != nil {
		return fmt.Errorf("stage manifest %s: %w", d, err)
	}
	return nil
}

// commit stages each tagged image's reference file (a copy of its manifest's digest file), then
// moves the staged manifests under DIR/manifests: the whole tree in one rename when DIR has no
// manifests/ yet, else file by file, digest files before reference files, each rename atomic
// (a reference file never names a manifest not there yet).
func (l *talosFlatWriter) commit(w *Writer, images []Image) error {
	staged := filepath.Join(w.work, flatManifestsDir)
	for _, im := range images {
		if im.Tag == "" {
			continue // named by digest only: no reference file (cache.go writes none either)
		}
		d, err := parseDigest(im.Manifest.Digest)
		if err != nil {
			return err
		}
		name, err := TalosDigestName(d)
		if err != nil {
			return err
		}
		dir := filepath.Join(staged, repoDir(im.Registry, im.Repository))
		body, err := os.ReadFile(filepath.Join(dir, flatDigestDir, name))
		if err != nil {
			return fmt.Errorf("image %s: its manifest %s was not stored: %w", im.Name(), d, err)
		}
		if err := w.writeFileAtomic(filepath.Join(dir, flatReferenceDir, im.Tag), body); err != nil {
			return fmt.Errorf("image %s: %w", im.Name(), err)
		}
	}
	if _, err := os.Stat(staged); errors.Is(err, fs.ErrNotExist) {
		return nil // nothing added (no image)
	}
	final := filepath.Join(l.dir, flatManifestsDir)
	switch _, err := os.Stat(final); {
	case errors.Is(err, fs.ErrNotExist):
		if err := syncTree(staged); err != nil {
			return err
		}
		if err := os.Rename(staged, final); err != nil {
			return fmt.Errorf("move manifests into place: %w", err)
		}
		return syncDir(l.dir)
	case err != nil:
		return fmt.Errorf("manifests: %w", err)
	}
	return mergeTree(staged, final)
}

// syncTree fsyncs every directory under (and including) root.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return syncDir(p)
		}
		return nil
	})
}

// mergeTree renames every file under staged to the same place under final (directories
// created), digest files first, and fsyncs the directories that got entries.
func mergeTree(staged, final string) error {
	var digests, refs []string
	err := filepath.WalkDir(staged, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(staged, p)
		if err != nil {
			return err
		}
		if filepath.Base(filepath.Dir(rel)) == flatReferenceDir {
			refs = append(refs, rel)
		} else {
			digests = append(digests, rel)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read staged manifests: %w", err)
	}
	for _, batch := range [][]string{digests, refs} {
		dirs := map[string]bool{}
		for _, rel := range batch {
			dst := filepath.Join(final, rel)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return fmt.Errorf("add manifest file: %w", err)
			}
			if err := os.Rename(filepath.Join(staged, rel), dst); err != nil {
				return fmt.Errorf("add manifest file: %w", err)
			}
			// The new file's directory and those MkdirAll may have created above it.
			for d := filepath.Dir(dst); d != final && strings.HasPrefix(d, final); d = filepath.Dir(d) {
				dirs[d] = true
			}
			dirs[final] = true
		}
		for _, d := range slices.Sorted(maps.Keys(dirs)) {
			if err := syncDir(d); err != nil {
				return err
			}
		}
	}
	return nil
}
