package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/filestamp"
)

// LoadIndex reads the pins file (loadPins), then fills the index from the index file, or, when
// that is missing, of another version, corrupt or not written at a clean shutdown, from storage
// (keeping the file's last-pulled times where it had them). The pins are read first and kept
// apart from the index file, so a rebuild keeps them, and they follow the tags the index records.
// The index is ready afterwards, even when the rebuild failed (it then holds what was found).
func (s *Store) LoadIndex(ctx context.Context) {
	x := s.idx
	defer x.MarkReady()
	s.loadPins()
	start := time.Now()
	p := FilePath(s.opts.Root)
	var hints *File
	if p != "" {
		f, err := ReadFile(p)
		if err == nil {
			x.Fill(f)
			size, blobs := x.Totals()
			s.log.Info().Str("file", p).Int64("size_bytes", size).Int("blobs", blobs).
				Str("duration", clitext.Span(time.Since(start))).Msg("cache index loaded")
			return
		}
		hints = f
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Warn().Err(err).Str("file", p).Msg("cache index unusable; rebuilding it from storage")
		}
	}
	if err := s.rebuildIndex(ctx, hints); err != nil {
		s.log.Error().Err(err).Msg("rebuild cache index from storage")
	}
	size, blobs := x.Totals()
	s.log.Info().Int64("size_bytes", size).Int("blobs", blobs).Str("duration", clitext.Span(time.Since(start))).
		Msg("cache index rebuilt from storage")
}

// rebuildIndex walks storage through the driver: blob data files, then every repository's
// manifest revisions (read and parsed for their references), blob links and tags. Last-pulled
// times come from hints when it has them, else from the revision link's time.
//
// Sizes are never taken from a data file when anything else states them, as the file is what
// damage changes: a manifest's size is that of its bytes when they hash to its digest (it is then
// verified, and scrubbed now); a blob's is the size the descriptors of such manifests give it
// (OCI image spec, "Descriptors": size). A blob no intact manifest references (held for
// --peers, or left by a pull whose manifest was never stored) keeps its file's size, marked
// BlobEntry.SizeUnverified: it is hashed on its first serve, and the scrubber takes it first
// like every rebuilt entry (none has a scrubbed time).
func (s *Store) rebuildIndex(ctx context.Context, hints *File) error {
	if err := s.indexBlobs(ctx); err != nil {
		return err
	}
	revisions, err := s.indexRepos(ctx)
	if err != nil {
		return err
	}
	x := s.idx
	for _, rv := range revisions {
		raw, err := s.driver.GetContent(ctx, BlobDataPath(rv.d))
		if err != nil {
			continue // a revision without data: nothing to serve, nothing to count
		}
		pulled := rv.at
		if t := hints.LastPulled(rv.repo, rv.d); !t.IsZero() {
			pulled = t
		}
		// No MaxManifestRefs check: what is stored was accepted when it was kept (a manifest
		// over the bound can only come from a nodecache before it), and all its references
		// are recorded so eviction never takes a blob it still uses. No lock is held here.
		refs, _ := ManifestRefs(raw, 0)
		x.AddManifest(rv.repo, rv.d, int64(len(raw)), refs, pulled)
		if rv.d.Algorithm().Available() && rv.d.Algorithm().FromBytes(raw) == rv.d {
			x.Verified("", rv.d, int64(len(raw)), s.opts.Clock(), filestamp.Stamp{})
			for d, size := range descriptorSizes(raw) {
				x.SetDescriptorSize(d, size)
			}
		}
	}
	return ctx.Err()
}

// descriptorSizes returns the size each descriptor of a manifest or index states for its
// digest (config, layers, child manifests); content that does not parse states none.
func descriptorSizes(raw []byte) map[digest.Digest]int64 {
	type descriptor struct {
		Digest digest.Digest `json:"digest"`
		Size   int64         `json:"size"`
	}
	var m struct {
		Config    *descriptor  `json:"config"`
		Layers    []descriptor `json:"layers"`
		Manifests []descriptor `json:"manifests"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	out := map[digest.Digest]int64{}
	add := func(d descriptor) {
		if _, dup := out[d.Digest]; !dup && d.Digest.Validate() == nil && d.Size >= 0 {
			out[d.Digest] = d.Size
		}
	}
	if m.Config != nil {
		add(*m.Config)
	}
	for _, l := range m.Layers {
		add(l)
	}
	for _, c := range m.Manifests {
		add(c)
	}
	return out
}

// indexBlobs indexes the blob data files of storage (their times, and their sizes as the files
// say until a manifest states them: AddFound).
func (s *Store) indexBlobs(ctx context.Context) error {
	x := s.idx
	err := s.driver.Walk(ctx, BlobsRoot, func(fi storagedriver.FileInfo) error {
		if fi.IsDir() || path.Base(fi.Path()) != "data" {
			return nil
		}
		parts := strings.Split(strings.TrimPrefix(fi.Path(), BlobsRoot+"/"), "/")
		if len(parts) != 4 {
			return nil
		}
		d := digest.NewDigestFromEncoded(digest.Algorithm(parts[0]), parts[2])
		if d.Validate() == nil {
			x.AddFound(d, fi.Size(), fi.ModTime())
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
func (s *Store) indexRepos(ctx context.Context) ([]manifestLink, error) {
	var revisions []manifestLink
	err := s.driver.Walk(ctx, RepoRoot, func(fi storagedriver.FileInfo) error {
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
		if rv, ok := s.indexLink(ctx, p, fi.ModTime()); ok {
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
func (s *Store) indexLink(ctx context.Context, p string, at time.Time) (manifestLink, bool) {
	x := s.idx
	rel := strings.TrimPrefix(p, RepoRoot+"/")
	if repo, rest, ok := strings.Cut(rel, "/_manifests/revisions/"); ok {
		if d, ok := LinkDigest(rest); ok {
			return manifestLink{repo, d, at}, true
		}
	} else if repo, rest, ok := strings.Cut(rel, "/_layers/"); ok {
		if d, ok := LinkDigest(rest); ok {
			x.AddLink(repo, d)
		}
	} else if repo, rest, ok := strings.Cut(rel, "/_manifests/tags/"); ok {
		if tag, ok := strings.CutSuffix(rest, "/current/link"); ok {
			b, err := s.driver.GetContent(ctx, p)
			if err == nil {
				if d, err := digest.Parse(strings.TrimSpace(string(b))); err == nil {
					x.SetTag(repo, tag, d)
				}
			}
		}
	}
	return manifestLink{}, false
}
