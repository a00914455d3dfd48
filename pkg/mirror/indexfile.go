package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/inputfile"
)

// The index file: <root>/nodecache/index.json.
const (
	// indexVersion is the format of the index file; a file of another version is rebuilt.
	indexVersion = 1
	// indexSaveInterval is how often a changed index is written (and once more at Close).
	indexSaveInterval = time.Minute
)

// indexFile is the on-disk form of the index (JSON).
type indexFile struct {
	// Version is indexVersion.
	Version int `json:"version"`
	// Clean is true only when written by Close after everything stored was recorded; a file
	// written while serving (every minute) is false, so after a crash the index is rebuilt
	// from storage, taking its last-pulled times as they were.
	Clean bool `json:"clean"`
	// Written is when the file was written (RFC 3339).
	Written time.Time `json:"written"`
	// Blobs are the blob data files (manifests included) by digest: size in bytes and when stored.
	Blobs map[digest.Digest]*blobEntry `json:"blobs"`
	// Repos are the storage repositories ("<upstream key>/<repository>").
	Repos map[string]*repoFile `json:"repos"`
}

type repoFile struct {
	Manifests map[digest.Digest]*manifestEntry `json:"manifests,omitempty"`
	Tags      map[string]digest.Digest         `json:"tags,omitempty"`
	Layers    []digest.Digest                  `json:"layers,omitempty"`
}

func (m *Mirror) indexPath() string {
	if m.opts.Root == "" {
		return ""
	}
	return filepath.Join(m.opts.Root, "nodecache", "index.json")
}

// saveIndex writes the index atomically when it changed (always when clean). Nothing is written
// before the index reflects storage.
func (m *Mirror) saveIndex(clean bool) error {
	p := m.indexPath()
	x := m.cache.idx
	select {
	case <-x.ready:
	default:
		return nil
	}
	if p == "" {
		return nil
	}
	x.mu.Lock()
	if !x.dirty && !clean {
		x.mu.Unlock()
		return nil
	}
	f := indexFile{Version: indexVersion, Clean: clean, Written: m.opts.Clock().UTC(),
		Blobs: map[digest.Digest]*blobEntry{}, Repos: map[string]*repoFile{}}
	for d, b := range x.blobs {
		c := *b
		f.Blobs[d] = &c
	}
	for name, r := range x.repos {
		rf := &repoFile{Manifests: map[digest.Digest]*manifestEntry{}, Tags: map[string]digest.Digest{}}
		for d, e := range r.manifests {
			c := *e
			rf.Manifests[d] = &c
		}
		for t, d := range r.tags {
			rf.Tags[t] = d
		}
		for d := range r.layers {
			rf.Layers = append(rf.Layers, d)
		}
		f.Repos[name] = rf
	}
	x.dirty = false
	x.mu.Unlock()
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	if err := writeFileAtomic(p, b); err != nil {
		x.mu.Lock()
		x.dirty = true
		x.mu.Unlock()
		return err
	}
	return nil
}

// writeFileAtomic writes b to p through a temporary file in the same directory, fsynced, then
// renamed over p.
func writeFileAtomic(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".index-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// readIndexFile reads the index file; the error says why it cannot be used as it is.
func readIndexFile(p string) (*indexFile, error) {
	b, err := inputfile.Read(p, inputfile.Index)
	if err != nil {
		return nil, err
	}
	var f indexFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("corrupt: %w", err)
	}
	if f.Version != indexVersion {
		return &f, fmt.Errorf("version %d, want %d", f.Version, indexVersion)
	}
	if !f.Clean {
		return &f, errors.New("not written at a clean shutdown")
	}
	return &f, nil
}

// loadIndex fills the index from the index file, or, when that is missing, of another version,
// corrupt or not written at a clean shutdown, from storage (keeping the file's last-pulled
// times where it had them). The index is ready afterwards, even when the rebuild failed (it
// then holds what was found).
func (m *Mirror) loadIndex(ctx context.Context) {
	x := m.cache.idx
	defer x.markReady()
	start := time.Now()
	p := m.indexPath()
	var hints *indexFile
	if p != "" {
		f, err := readIndexFile(p)
		if err == nil {
			x.mu.Lock()
			for d, b := range f.Blobs {
				x.addBlobLocked("", d, b.Size, b.Added)
			}
			x.mu.Unlock()
			for name, r := range f.Repos {
				for d, e := range r.Manifests {
					size := int64(0)
					if b := f.Blobs[d]; b != nil {
						size = b.Size
					}
					x.addManifest(name, d, size, e.Refs, e.LastPulled)
				}
				for t, d := range r.Tags {
					x.setTag(name, t, d)
				}
				for _, d := range r.Layers {
					x.addLink(name, d)
				}
			}
			x.mu.Lock()
			x.dirty = true // rewritten as not clean at once: a crash from now on means a rebuild
			x.mu.Unlock()
			size, blobs := x.totals()
			m.log.Info().Str("file", p).Int64("size_bytes", size).Int("blobs", blobs).
				Str("duration", clitext.Span(time.Since(start))).Msg("cache index loaded")
			return
		}
		hints = f
		if !errors.Is(err, os.ErrNotExist) {
			m.log.Warn().Err(err).Str("file", p).Msg("cache index unusable; rebuilding it from storage")
		}
	}
	if err := m.rebuildIndex(ctx, hints); err != nil {
		m.log.Error().Err(err).Msg("rebuild cache index from storage")
	}
	size, blobs := x.totals()
	m.log.Info().Int64("size_bytes", size).Int("blobs", blobs).Str("duration", clitext.Span(time.Since(start))).
		Msg("cache index rebuilt from storage")
}

// rebuildIndex walks storage through the driver: blob data files (sizes), then every
// repository's manifest revisions (read and parsed for their references), blob links and tags.
// Last-pulled times come from hints when it has them, else from the revision link's time.
func (m *Mirror) rebuildIndex(ctx context.Context, hints *indexFile) error {
	if err := m.indexBlobs(ctx); err != nil {
		return err
	}
	revisions, err := m.indexRepos(ctx)
	if err != nil {
		return err
	}
	x := m.cache.idx
	for _, rv := range revisions {
		raw, err := m.cache.driver.GetContent(ctx, blobDataPath(rv.d))
		if err != nil {
			continue // a revision without data: nothing to serve, nothing to count
		}
		pulled := rv.at
		if hints != nil && hints.Repos[rv.repo] != nil {
			if e := hints.Repos[rv.repo].Manifests[rv.d]; e != nil && !e.LastPulled.IsZero() {
				pulled = e.LastPulled
			}
		}
		// No maxManifestRefs check: what is stored was accepted when it was kept (a manifest
		// over the bound can only come from a nodecache before it), and all its references
		// are recorded so eviction never takes a blob it still uses. No lock is held here.
		refs, _ := manifestRefs(raw, 0)
		x.addManifest(rv.repo, rv.d, int64(len(raw)), refs, pulled)
	}
	return ctx.Err()
}

// indexBlobs indexes the blob data files of storage (their sizes and times).
func (m *Mirror) indexBlobs(ctx context.Context) error {
	x := m.cache.idx
	err := m.cache.driver.Walk(ctx, storageBlobsRoot, func(fi storagedriver.FileInfo) error {
		if fi.IsDir() || path.Base(fi.Path()) != "data" {
			return nil
		}
		parts := strings.Split(strings.TrimPrefix(fi.Path(), storageBlobsRoot+"/"), "/")
		if len(parts) != 4 {
			return nil
		}
		d := digest.NewDigestFromEncoded(digest.Algorithm(parts[0]), parts[2])
		if d.Validate() == nil {
			x.addBlob("", d, fi.Size(), fi.ModTime())
		}
		return ctx.Err()
	})
	if err != nil && !isPathNotFound(err) {
		return fmt.Errorf("walk blobs: %w", err)
	}
	return nil
}

// manifestLink is a manifest revision link of a repository found in storage, and its time.
type manifestLink struct {
	repo string
	d    digest.Digest
	at   time.Time
}

// indexRepos indexes every repository's blob links and tags, and returns its manifest
// revisions, which are read after the walk.
func (m *Mirror) indexRepos(ctx context.Context) ([]manifestLink, error) {
	var revisions []manifestLink
	err := m.cache.driver.Walk(ctx, storageRepoRoot, func(fi storagedriver.FileInfo) error {
		p := fi.Path()
		if fi.IsDir() {
			if base := path.Base(p); base == "_uploads" || (base == "index" && strings.Contains(p, "/_manifests/tags/")) {
				return storagedriver.ErrSkipDir
			}
			return nil
		}
		if path.Base(p) != "link" {
			return nil
		}
		if rv, ok := m.indexLink(ctx, p, fi.ModTime()); ok {
			revisions = append(revisions, rv)
		}
		return ctx.Err()
	})
	if err != nil && !isPathNotFound(err) {
		return nil, fmt.Errorf("walk repositories: %w", err)
	}
	return revisions, nil
}

// indexLink indexes the link file at storage path p (written at): a blob link or a tag goes
// into the index; a manifest revision is returned (ok).
func (m *Mirror) indexLink(ctx context.Context, p string, at time.Time) (manifestLink, bool) {
	x := m.cache.idx
	rel := strings.TrimPrefix(p, storageRepoRoot+"/")
	if repo, rest, ok := strings.Cut(rel, "/_manifests/revisions/"); ok {
		if d, ok := linkDigest(rest); ok {
			return manifestLink{repo, d, at}, true
		}
	} else if repo, rest, ok := strings.Cut(rel, "/_layers/"); ok {
		if d, ok := linkDigest(rest); ok {
			x.addLink(repo, d)
		}
	} else if repo, rest, ok := strings.Cut(rel, "/_manifests/tags/"); ok {
		if tag, ok := strings.CutSuffix(rest, "/current/link"); ok {
			b, err := m.cache.driver.GetContent(ctx, p)
			if err == nil {
				if d, err := digest.Parse(strings.TrimSpace(string(b))); err == nil {
					x.setTag(repo, tag, d)
				}
			}
		}
	}
	return manifestLink{}, false
}

// linkDigest parses "<algorithm>/<hex>/link".
func linkDigest(rest string) (digest.Digest, bool) {
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", false
	}
	d := digest.NewDigestFromEncoded(digest.Algorithm(parts[0]), parts[1])
	return d, d.Validate() == nil
}

func isPathNotFound(err error) bool {
	var nf storagedriver.PathNotFoundError
	return errors.As(err, &nf)
}
