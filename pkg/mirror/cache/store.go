package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/distribution/v3/registry/storage/driver/factory"
	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Storage kinds (Options.Kind), as the mirror's --storage names them.
const (
	// KindFilesystem keeps the cache under Options.Root (in memory when Root is "").
	KindFilesystem = "filesystem"
	// KindS3 keeps it in a bucket several replicas may share; Options.Root then holds only the
	// index file (and the mirror's staging directory), and is not locked.
	KindS3 = "s3"
)

// Options configure a Store.
type Options struct {
	// Root is the storage root: the index file (FilePath) and, for KindFilesystem, the cache
	// itself and its lock (LockPath). "" keeps no file and takes no lock (in-memory storage).
	Root string
	// Kind is KindFilesystem or KindS3.
	Kind string
	// Config is distribution's storage configuration the driver is built from (factory.Create
	// of its Type with its Parameters; the drivers must be registered, by importing them).
	Config configuration.Storage
	// MaxSize is the cap in bytes eviction keeps the cache under; 0: none.
	MaxSize int64
	// Clock gives the times recorded in the index (stored, last pulled) and the file's.
	Clock func() time.Time
	// Logger receives eviction's and the index's messages.
	Logger zerolog.Logger
	// Filling reports whether a fill of blob d is in flight: eviction leaves its data alone.
	// Called only once Run runs; nil: never.
	Filling func(d digest.Digest) bool
	// StagingInUse reports whether the file at path in the staging directory is a fill's in
	// flight (started by a request served before Run): Take leaves it. nil: none is.
	StagingInUse func(path string) bool
	// Evicted is called for each image evicted (with its reason: EvictCap, EvictENOSPC,
	// EvictAPI) and each unreferenced blob removed (EvictUnreferenced); nil: not called.
	Evicted func(reason string)
	// Freed is called with the bytes of each blob data file eviction deleted; nil: not called.
	Freed func(bytes int64)
	// ScrubInterval is how often the background scrubber re-hashes each stored blob (Run); 0:
	// no background scrubbing (verify passes, StartVerify, still run). The mirror defaults it to
	// DefaultScrubInterval on filesystem storage and to 0 on a shared bucket.
	ScrubInterval time.Duration
	// ScrubRate bounds what the scrubber and a verify pass read, bytes a second;
	// 0: DefaultScrubRate.
	ScrubRate int64
	// Corrupt is called for each stored blob found not to match its digest or verified size,
	// with where it was found (FoundByServe, FoundByScrub, FoundByVerify); nil: not called.
	Corrupt func(foundBy string)
	// UploadMaxAge is how long an upload of distribution's may be in progress: a fill writes
	// through one only while it commits (non-filesystem storage), so an older one was left by a
	// fill that died; Take and Run remove those (the mirror's fill timeout). 0: DefaultUploadMaxAge.
	UploadMaxAge time.Duration
}

// Upload sweeping (Options.UploadMaxAge, Run).
const (
	// DefaultUploadMaxAge is Options.UploadMaxAge's default (the mirror's default fill timeout).
	DefaultUploadMaxAge = 2 * time.Hour
	// UploadSweepInterval is how often Run removes uploads older than Options.UploadMaxAge.
	UploadSweepInterval = time.Hour
)

// Store owns the on-disk cache: the storage driver, the index of what it holds and the index
// file, the eviction loop that keeps it under Options.MaxSize and makes room when the disk is
// full, the lock serving and eviction share around blob data, and the root lock. Its methods
// are safe for concurrent use.
type Store struct {
	opts   Options
	idx    *Index
	driver storagedriver.StorageDriver
	// fsRoot is the filesystem storage root (Options.Root for KindFilesystem, else ""): blob
	// data is hard-linked under it, and its free space tells a disk-full eviction how much room
	// a blob needs.
	fsRoot string
	// staging is the directory fills stage blobs in (StagingDir).
	staging string
	log     zerolog.Logger

	// storeMu is taken by a fill while distribution commits its blob (data moved into the blob
	// store, then linked) and by eviction while it deletes blob data, so a fill of the same
	// digest in another repository never links data that is being deleted.
	storeMu sync.Mutex

	useMu sync.Mutex
	inUse map[digest.Digest]int // blobs being served from storage
	// enospcTarget, when not 0, is the size (bytes) a disk-full eviction brings the cache to.
	enospcTarget int64
	// kick asks the eviction loop to look at the size now (buffer 1: requests coalesce).
	kick chan struct{}

	// scrub is the scrub loop's state: verify passes asked for, and whether it runs.
	scrub scrubState

	// pinsFileMu serialises writes of the pins file; pinsLoaded is set once loadPins ran (the
	// file is never written before: an unread file is never overwritten).
	pinsFileMu sync.Mutex
	pinsLoaded atomic.Bool
	// pinMu serialises Pin and Unpin: a pin's check against the cap and its record are one step.
	pinMu sync.Mutex
	// listed remembers the sizes stored manifests list for their blobs (listedBlobs).
	listedMu sync.Mutex
	listed   map[digest.Digest]map[digest.Digest]int64

	// lockMu guards rootLock (the flock on LockPath, taken by Take, released by Close) and
	// taken (set once Take ran).
	lockMu   sync.Mutex
	rootLock *os.File
	taken    bool
}

// New builds a Store over the storage of opts, building its driver from opts.Config. It starts
// nothing and takes no lock (Take, Run). Errors: the driver's (an unknown driver name, invalid
// parameters).
func New(ctx context.Context, opts Options) (*Store, error) {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.UploadMaxAge <= 0 {
		opts.UploadMaxAge = DefaultUploadMaxAge
	}
	if opts.ScrubRate <= 0 {
		opts.ScrubRate = DefaultScrubRate
	}
	params := opts.Config.Parameters()
	if params == nil {
		params = configuration.Parameters{}
	}
	driver, err := factory.Create(ctx, opts.Config.Type(), params)
	if err != nil {
		return nil, fmt.Errorf("storage driver %s: %w", opts.Config.Type(), err)
	}
	staging, err := stagingDir(opts.Root)
	if err != nil {
		return nil, err
	}
	s := &Store{opts: opts, idx: NewIndex(), driver: driver, staging: staging, log: opts.Logger,
		inUse: map[digest.Digest]int{}, kick: make(chan struct{}, 1), scrub: scrubState{wake: make(chan struct{}, 1)},
		listed: map[digest.Digest]map[digest.Digest]int64{}}
	if opts.Kind == KindFilesystem {
		s.fsRoot = opts.Root
	}
	return s, nil
}

// stagingDir returns (and creates) the directory for blobs being filled: <root>/nodecache/staging,
// under the root so that a commit (LinkBlob) stays on one file system; a private temporary
// directory when root is "" (in-memory storage), removed by Close.
func stagingDir(root string) (string, error) {
	if root == "" {
		return os.MkdirTemp("", "nodecache-staging-")
	}
	dir := filepath.Join(root, "nodecache", "staging")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("storage root %s: %w", root, err)
	}
	return dir, nil
}

// StagingDir is the directory fills stage blobs in (the fetcher's upstream.Options.StagingDir):
// <root>/nodecache/staging, or a temporary directory for in-memory storage.
func (s *Store) StagingDir() string { return s.staging }

// Driver is the storage driver (the one the mirror's distribution storage reads and writes).
func (s *Store) Driver() storagedriver.StorageDriver { return s.driver }

// Totals are the bytes of blob data stored (each blob once, however many repositories link
// it) and the number of blobs, as the index counts them.
func (s *Store) Totals() (size int64, blobs int) { return s.idx.Totals() }

// Unreferenced is Index.UnreferencedTotals: the blobs no stored manifest references, and their bytes.
func (s *Store) Unreferenced() (blobs int, size int64) { return s.idx.UnreferencedTotals() }

// Ready reports whether the index is loaded or rebuilt (before that, Totals and Images speak
// of a part of the cache only, and eviction waits).
func (s *Store) Ready() bool { return s.idx.IsReady() }

// Images lists the stored images (Index.Images), their storage repositories named by name.
func (s *Store) Images(name func(storageRepo string) (upstream, repo string)) []mirrorapi.CachedImage {
	return s.idx.Images(name)
}

// HasManifest reports whether manifest d is stored in storage repository repo.
func (s *Store) HasManifest(repo string, d digest.Digest) bool { return s.idx.HasManifest(repo, d) }

// Holders returns the images of storage repository repo that hold manifest d as a child
// manifest (Index.Holders).
func (s *Store) Holders(repo string, d digest.Digest) []digest.Digest { return s.idx.Holders(repo, d) }

// FilesystemRoot is the filesystem storage root blob data lives under, "" when storage is not
// local files (s3, memory).
func (s *Store) FilesystemRoot() string { return s.fsRoot }

// MaxSize is Options.MaxSize (bytes; 0: no cap).
func (s *Store) MaxSize() int64 { return s.opts.MaxSize }

// Check returns what a serve of blob d checks its data against (Index.Check): its verified size,
// and whether it was hashed in this process.
func (s *Store) Check(d digest.Digest) BlobCheck { return s.idx.Check(d) }

// Verified records that a serve read blob d's data whole, size bytes, and it hashed to d
// (Index.Verified), its data file then stamp (filesystem storage; zero otherwise): repo, the
// storage repository it was served from, links it in the index.
func (s *Store) Verified(repo string, d digest.Digest, size int64, stamp filestamp.Stamp) {
	s.idx.Verified(repo, d, size, s.opts.Clock(), stamp)
}

// stampOf is blob d's data file's stamp on filesystem storage; zero otherwise or when it cannot
// be stat'ed.
func (s *Store) stampOf(d digest.Digest) filestamp.Stamp {
	if s.fsRoot == "" {
		return filestamp.Stamp{}
	}
	st, _ := filestamp.Of(filepath.Join(s.fsRoot, filepath.FromSlash(BlobDataPath(d))))
	return st
}

// Acquire marks blob d as being served until the returned release is called: eviction leaves
// its data alone meanwhile.
func (s *Store) Acquire(d digest.Digest) (release func()) {
	s.useMu.Lock()
	s.inUse[d]++
	s.useMu.Unlock()
	return func() {
		s.useMu.Lock()
		if s.inUse[d]--; s.inUse[d] <= 0 {
			delete(s.inUse, d)
		}
		s.useMu.Unlock()
	}
}

func (s *Store) used(d digest.Digest) bool {
	s.useMu.Lock()
	defer s.useMu.Unlock()
	return s.inUse[d] > 0
}

// Locked runs f under the lock eviction deletes blob data with: what f stores and links (a
// blob committed, a manifest put) is never data eviction is deleting.
func (s *Store) Locked(f func() error) error {
	s.storeMu.Lock()
	defer s.storeMu.Unlock()
	return f()
}

// Grew is called after content was stored: over the cap, the eviction loop is woken.
func (s *Store) Grew() {
	if s.opts.MaxSize > 0 {
		if size, _ := s.idx.Totals(); size > s.opts.MaxSize {
			s.wake()
		}
	}
}

// wake asks the eviction loop to check the size.
func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Take takes the root and removes what an earlier run left there. On a filesystem root it first
// takes the root lock (LockRoot: one process per root; ErrRootInUse when another holds it,
// and then nothing is removed). Then it removes every file in the staging directory but those of
// fills in flight (Options.StagingInUse: requests may be served before Run; the others are
// leftovers of interrupted fills) and distribution's uploads: every
// one on a filesystem root, those older than Options.UploadMaxAge in a bucket (which other
// replicas' fills in flight share). Only the first call does any of this (first); a later one
// keeps the lock and the fills in flight. The lock is held until Close.
//
// Errors: ErrRootInUse (wrapped), an unusable lock file.
func (s *Store) Take(ctx context.Context) (first bool, err error) {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	if s.taken {
		return false, nil
	}
	if s.opts.Root != "" && s.opts.Kind != KindS3 {
		f, err := LockRoot(s.opts.Root)
		if err != nil {
			return false, err
		}
		s.rootLock = f
	}
	s.taken = true
	s.removeStaging()
	if s.opts.Kind == KindS3 {
		s.purgeUploads(ctx, s.opts.Clock().Add(-s.opts.UploadMaxAge))
	} else {
		s.purgeUploads(ctx, s.opts.Clock())
	}
	return true, nil
}

// removeStaging removes the regular files in the staging directory, but those of fills in flight.
func (s *Store) removeStaging() {
	entries, err := os.ReadDir(s.staging)
	if err != nil {
		s.log.Debug().Err(err).Msg("read staging directory")
		return
	}
	for _, e := range entries {
		path := filepath.Join(s.staging, e.Name())
		if e.Type().IsRegular() && (s.opts.StagingInUse == nil || !s.opts.StagingInUse(path)) {
			if err := os.Remove(path); err != nil {
				s.log.Debug().Err(err).Msg("remove staging file left by an earlier run")
			}
		}
	}
}

// sweepUploads removes the uploads older than Options.UploadMaxAge (Run, every
// UploadSweepInterval).
func (s *Store) sweepUploads(ctx context.Context) {
	s.purgeUploads(ctx, s.opts.Clock().Add(-s.opts.UploadMaxAge))
}

// purgeUploads removes distribution's uploads started before olderThan, through the driver.
func (s *Store) purgeUploads(ctx context.Context, olderThan time.Time) {
	deleted, errs := s.PurgeUploads(ctx, olderThan)
	for _, err := range errs {
		s.log.Debug().Err(err).Msg("remove fill leftovers")
	}
	if len(deleted) > 0 {
		s.log.Info().Int("uploads", len(deleted)).Time("older_than", olderThan).Msg("removed uploads left by fills")
	}
}

// Save writes the index file when the index changed (always when clean): Index.Save at
// FilePath(Options.Root).
func (s *Store) Save(clean bool) error {
	return s.idx.Save(FilePath(s.opts.Root), s.opts.Clock, clean)
}

// Close writes the index file, clean, and the pins file when the pins changed, removes a
// temporary staging directory (in-memory storage), then releases the root lock (after the
// writes: the next process reads a clean file). It returns the writes' errors; the rest is done
// anyway.
func (s *Store) Close() error {
	err := errors.Join(s.Save(true), s.savePins(false))
	if s.opts.Root == "" {
		_ = os.RemoveAll(s.staging)
	}
	s.lockMu.Lock()
	if s.rootLock != nil {
		_ = s.rootLock.Close()
		s.rootLock = nil
	}
	s.lockMu.Unlock()
	return err
}

func isPathNotFound(err error) bool {
	var nf storagedriver.PathNotFoundError
	return errors.As(err, &nf)
}
