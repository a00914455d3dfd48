package cache

import (
	"context"
	"fmt"
	"path"

	"github.com/opencontainers/go-digest"
)

// What an import of a bundle (the mirror's cache import and serve --seed) needs of the store
// beyond a fill's commit path.

// IndexLoaded is closed once the index reflects storage (loaded from its file or rebuilt, Run's
// first step): what an import asks of the index (HasBlob) is only then the whole answer.
func (s *Store) IndexLoaded() <-chan struct{} { return s.idx.Ready() }

// HasBlob reports whether storage holds blob d's data as the index knows it, size bytes: of that
// verified size, or of a size not verified yet (an index rebuild found the data file, and no
// manifest stated its size). A blob the index holds at another verified size is not d's data as
// a manifest describes it: false.
func (s *Store) HasBlob(d digest.Digest, size int64) bool { return s.idx.hasBlob(d, size) }

func (x *Index) hasBlob(d digest.Digest, size int64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.blobs[d]
	return b != nil && (b.SizeUnverified || b.Size == size)
}

// LinkStored links blob d, whose data storage already holds (HasBlob), into storage repository
// repo: the repository link a fill's commit writes (LinkBlob), without data, under the lock
// eviction deletes blob data with, and recorded in the index. The caller holds the blob
// (Acquire) from before it asked HasBlob, so eviction cannot delete the data meanwhile.
//
// Errors: the data is gone (evicted before the caller acquired it), the link cannot be written.
func (s *Store) LinkStored(ctx context.Context, repo string, d digest.Digest) error {
	return s.Locked(func() error {
		if _, err := s.driver.Stat(ctx, BlobDataPath(d)); err != nil {
			return fmt.Errorf("link blob %s into %s: its data is not stored: %w", d, repo, err)
		}
		if err := s.driver.PutContent(ctx, path.Join(LayerLinkPath(repo, d), "link"), []byte(d.String())); err != nil {
			s.fullOn(err)
			return fmt.Errorf("link blob %s into %s: %w", d, repo, err)
		}
		s.idx.AddLink(repo, d)
		return nil
	})
}
