package cache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3/registry/storage"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/filestamp"
)

// LinkBlob stores a verified fill's staging file (under the filesystem root, FilesystemRoot) as
// blob d's data file of distribution's layout (BlobDataPath) by a hard link, then writes repo's
// blob link (LayerLinkPath) through the driver: what distribution's blob writer Commit does
// (data moved in place, then the _layers link), without the upload copy its API takes, so a
// fill needs the blob's size free once. Data already stored (the same digest filled for
// another repository, or damaged data the serve path has not caught yet) is replaced by the
// verified staging file, atomically (a hard link beside it renamed over it): the blob's data is
// always the bytes this fill verified. Both happen under the lock eviction deletes blob data
// with; the blob is then recorded in the index (size bytes, verified) and the eviction loop
// woken when the cache is over its cap.
//
// Errors: ErrNotFilesystem when storage is not local files; a failed link or write (the disk
// being full also asks for room, DiskFull); syscall.EXDEV, wrapped, when the staging file is on
// another file system than the blob store: the caller stores it through an upload instead.
func (s *Store) LinkBlob(ctx context.Context, repo, staging string, d digest.Digest, size int64) error {
	if s.fsRoot == "" {
		return ErrNotFilesystem
	}
	// The driver writes files 0666 and directories 0777, less the umask; the staging file is 0600.
	if err := os.Chmod(staging, 0o644); err != nil {
		return fmt.Errorf("store blob %s: %w", d, err)
	}
	dst := filepath.Join(s.fsRoot, filepath.FromSlash(BlobDataPath(d)))
	return s.Locked(func() error { return s.linkLocked(ctx, repo, staging, dst, d, size) })
}

// ErrNotFilesystem is LinkBlob's error when storage is not local files (s3, memory).
var ErrNotFilesystem = errors.New("storage is not a filesystem root")

// linkLocked is LinkBlob's work under the store lock: staging linked as dst.
func (s *Store) linkLocked(ctx context.Context, repo, staging, dst string, d digest.Digest, size int64) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o777); err != nil {
		s.fullOn(err)
		return fmt.Errorf("store blob %s: %w", d, err)
	}
	if err := os.Link(staging, dst); errors.Is(err, fs.ErrExist) {
		err = replaceByLink(staging, dst)
		if err != nil {
			s.fullOn(err)
			return fmt.Errorf("store blob %s: %w", d, err)
		}
	} else if err != nil {
		s.fullOn(err)
		return fmt.Errorf("store blob %s: %w", d, err)
	}
	link := path.Join(LayerLinkPath(repo, d), "link")
	if err := s.driver.PutContent(ctx, link, []byte(d.String())); err != nil {
		s.fullOn(err)
		return fmt.Errorf("link blob %s into %s: %w", d, repo, err)
	}
	stamp, _ := filestamp.Of(dst)
	s.idx.Stored(repo, d, size, s.opts.Clock(), true, stamp)
	s.Grew()
	s.pinProgress()
	return nil
}

// replaceByLink replaces dst by a hard link to src, atomically: a link beside dst (named after
// src, which is unique in the staging directory) renamed over it. A reader that has dst open
// keeps the file it opened.
func replaceByLink(src, dst string) error {
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(src))
	_ = os.Remove(tmp) // left by a process that died between the link and the rename
	if err := os.Link(src, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// fullOn asks for room (DiskFull, amount unknown) when err says the disk is full.
func (s *Store) fullOn(err error) {
	if errors.Is(err, syscall.ENOSPC) {
		s.DiskFull(-1)
	}
}

// CommitBlob runs commit (distribution's blob writer Commit of blob d, size bytes as a fill
// verified it, into storage repository repo) under the lock eviction deletes blob data with,
// records the blob in the index when it succeeded, and then wakes the eviction loop when the
// cache is over its cap. distribution's commit keeps data already stored under the digest
// (registry/storage/blobwriter.go, moveBlob): the blob counts as verified (Index.Stored) only
// when no data was there before. It returns commit's error.
func (s *Store) CommitBlob(ctx context.Context, repo string, d digest.Digest, size int64, commit func() error) error {
	err := s.Locked(func() error {
		_, statErr := s.driver.Stat(ctx, BlobDataPath(d))
		if err := commit(); err != nil {
			return err
		}
		s.idx.Stored(repo, d, size, s.opts.Clock(), isPathNotFound(statErr), s.stampOf(d))
		return nil
	})
	if err == nil {
		s.Grew()
		s.pinProgress()
	}
	return err
}

// CommitManifest runs put (distribution's manifest store Put of manifest d of storage
// repository repo, a body of size bytes referencing refs, ManifestRefs) under the lock eviction
// deletes blob data with, so an eviction of the same manifest never deletes the data of a
// manifest being linked; it records the manifest in the index, pulled now, when put succeeded,
// and then wakes the eviction loop when the cache is over its cap. It returns put's error.
func (s *Store) CommitManifest(repo string, d digest.Digest, size int64, refs []digest.Digest, put func() error) error {
	err := s.Locked(func() error {
		if err := put(); err != nil {
			return err
		}
		s.idx.AddManifest(repo, d, size, refs, s.opts.Clock())
		return nil
	})
	if err == nil {
		s.Grew()
		s.pinProgress()
	}
	return err
}

// Pulled records a pull of manifest d of storage repository repo now (Index.Touch).
func (s *Store) Pulled(repo string, d digest.Digest) { s.idx.Touch(repo, d, s.opts.Clock()) }

// ReadByPeer records that a member of --peers read blob d (Index.ReadByPeer).
func (s *Store) ReadByPeer(d digest.Digest) { s.idx.ReadByPeer(d, s.opts.Clock()) }

// Tagged records that tag of storage repository repo points at manifest d (Index.SetTag); a pin
// of the tag follows it (settlePins completes the move).
func (s *Store) Tagged(repo, tag string, d digest.Digest) {
	s.idx.SetTag(repo, tag, d)
	s.pinProgress()
}

// PurgeUploads removes distribution's uploads (_uploads directories) started before olderThan,
// through the driver (storage.PurgeUploads); it returns the paths removed and the errors met.
func (s *Store) PurgeUploads(ctx context.Context, olderThan time.Time) (deleted []string, errs []error) {
	return storage.PurgeUploads(ctx, s.driver, olderThan, true)
}
