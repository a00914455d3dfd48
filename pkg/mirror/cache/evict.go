package cache

import (
	"context"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Eviction reasons, the values of nodecache_evictions_total's reason label (Options.Evicted).
const (
	EvictCap          = "cap"          // the cache grew over Options.MaxSize (--max-size)
	EvictENOSPC       = "enospc"       // a fill found the disk full
	EvictUnreferenced = "unreferenced" // blob data no manifest references
	EvictAPI          = "api"          // DELETE /nodecache/v1/cache/...
)

// evictLowWater is the share of the cap eviction brings the cache down to (90 %).
const evictLowWater = 0.9

// evictPause is the pause after each storage deletion of an eviction: it bounds eviction's I/O
// (at most 200 deletions a second) so serving keeps the disk.
const evictPause = 5 * time.Millisecond

// Run loads the pins and the index (LoadIndex), then evicts whenever the cache is over its cap
// (at once when it already is; down to capTarget) or a disk-full fill asks for room (DiskFull),
// settles the pins by tag whose tag moved (settlePins) as their new images are stored, saves the
// index every SaveInterval, every UploadSweepInterval removes uploads older than
// Options.UploadMaxAge, and runs the scrub loop (verify passes, and the background scrubber with
// Options.ScrubInterval), until ctx ends. Every goroutine it starts has stopped when it returns.
func (s *Store) Run(ctx context.Context) {
	s.LoadIndex(ctx)
	if err := s.Save(false); err != nil {
		s.log.Warn().Err(err).Msg("write cache index")
	}
	scrubbed := make(chan struct{})
	go func() {
		defer close(scrubbed)
		s.scrubLoop(ctx)
	}()
	defer func() { <-scrubbed }()
	save := time.NewTicker(SaveInterval)
	defer save.Stop()
	uploads := time.NewTicker(UploadSweepInterval)
	defer uploads.Stop()
	for {
		s.settlePins(ctx)
		if target := s.takeENOSPCTarget(); target > 0 {
			s.evictTo(ctx, target, EvictENOSPC)
		}
		if maxSize := s.opts.MaxSize; maxSize > 0 {
			if size, _ := s.idx.Totals(); size > maxSize {
				s.evictTo(ctx, s.capTarget(ctx, maxSize), EvictCap)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-save.C:
			if err := s.Save(false); err != nil {
				s.log.Warn().Err(err).Msg("write cache index")
			}
		case <-uploads.C:
			s.sweepUploads(ctx)
		}
	}
}

// capTarget is the size an eviction over the cap maxSize brings the cache to: 90 % of the cap, or
// more when the pins hold much of it — the pinned bytes plus the largest image no pin holds
// (evictionFloor), so the image just pulled is not evicted at once to make room that pins hold
// for good (issue 24) — but never more than the cap itself.
func (s *Store) capTarget(ctx context.Context, maxSize int64) int64 {
	pinned, largest := s.evictionFloor(ctx)
	return min(maxSize, max(int64(float64(maxSize)*evictLowWater), pinned+largest))
}

// evictTo removes content until the cache holds at most target bytes, least recently used first
// (Index.NextVictim: unreferenced blobs by when they were stored or read by a member, images no
// pin holds by when they were last pulled). It stops early when what is left is pinned or in use
// (being served or filled) and returns the bytes it freed.
func (s *Store) evictTo(ctx context.Context, target int64, reason string) int64 {
	skip := map[Victim]bool{}
	var freed int64
	images := 0
	for ctx.Err() == nil {
		size, _ := s.idx.Totals()
		if size <= target {
			break
		}
		v, ok := s.idx.NextVictim(skip)
		if !ok {
			s.log.Warn().Int64("size_bytes", size).Int64("target_bytes", target).Int64("pinned_bytes", s.idx.PinnedBytes()).
				Msg("eviction stopped above its target: what is left is pinned, or being served or filled")
			break
		}
		skip[v] = true
		if v.Repo == "" {
			if n, ok := s.removeBlobData(ctx, v.Manifest); ok {
				freed += n
				s.evicted(EvictUnreferenced)
			}
			continue
		}
		freed += s.EvictImage(ctx, v.Repo, v.Manifest, reason)
		images++
	}
	if freed > 0 {
		size, _ := s.idx.Totals()
		s.log.Info().Str("reason", reason).Int("images", images).Int64("freed_bytes", freed).
			Int64("size_bytes", size).Int64("target_bytes", target).Msg("evicted")
	}
	return freed
}

func (s *Store) evicted(reason string) {
	if s.opts.Evicted != nil {
		s.opts.Evicted(reason)
	}
}

// EvictImage removes image manifest of repo (a storage repository name, "<upstream
// key>/<repository>"): links first (revisions, tags, blob links), then the blob data nothing
// references any more and nobody uses. It returns the bytes of blob data it deleted; 0 and
// nothing done when the index does not hold the image or a pin holds it.
func (s *Store) EvictImage(ctx context.Context, repo string, manifest digest.Digest, reason string) int64 {
	rm := s.idx.RemoveImage(repo, manifest)
	if len(rm.Manifests) == 0 {
		return 0
	}
	log := s.log.With().Str("repository", repo).Str("digest", manifest.String()).Str("reason", reason).Logger()
	for _, d := range rm.Manifests {
		s.deletePath(ctx, log, RevisionPath(repo, d))
	}
	for _, t := range rm.Tags {
		s.deletePath(ctx, log, TagPath(repo, t))
	}
	for _, d := range rm.Layers {
		s.deletePath(ctx, log, LayerLinkPath(repo, d))
	}
	var freed int64
	for _, d := range rm.Data {
		if n, ok := s.removeBlobData(ctx, d); ok {
			freed += n
		}
	}
	s.evicted(reason)
	log.Debug().Int("manifests", len(rm.Manifests)).Strs("tags", rm.Tags).Int64("freed_bytes", freed).Msg("image evicted")
	return freed
}

// removeBlobData deletes blob d's links and data when no manifest references it and no request
// serves or fills it, under the lock fills take to commit. ok is false when it stays.
func (s *Store) removeBlobData(ctx context.Context, d digest.Digest) (int64, bool) {
	s.storeMu.Lock()
	defer s.storeMu.Unlock()
	if !s.idx.Unreferenced(d) || s.used(d) || (s.opts.Filling != nil && s.opts.Filling(d)) {
		return 0, false
	}
	for _, repo := range s.idx.LinksOf(d) {
		s.deletePath(ctx, s.log, LayerLinkPath(repo, d))
	}
	if !s.deletePath(ctx, s.log, BlobDirPath(d)) {
		return 0, false
	}
	n := s.idx.DropBlob(d)
	if s.opts.Freed != nil {
		s.opts.Freed(n)
	}
	return n, true
}

// deletePath deletes a storage path through the driver (gone already counts as deleted), then
// pauses for evictPause.
func (s *Store) deletePath(ctx context.Context, log zerolog.Logger, p string) bool {
	if err := s.driver.Delete(ctx, p); err != nil && !isPathNotFound(err) {
		log.Error().Err(err).Str("path", p).Msg("eviction: delete from storage")
		return false
	}
	select {
	case <-time.After(evictPause):
	case <-ctx.Done():
	}
	return true
}

// DiskFull asks the eviction loop to make room after a fill found the disk full; lacked is how
// many more bytes the blob needed than the disk had (upstream.Options.OnDiskFull; -1: unknown).
// The cache goes to 90 % of the bytes it holds now, or to the pinned bytes plus the largest image
// no pin holds when that is more (as capTarget), but lower when the blob needs more: to what
// leaves the blob room (with diskFullSlack) once the fill's partial staging file is gone. Pinned
// content is never evicted (evictTo). When even a cache emptied of everything no pin holds would
// leave the blob no room (the rest of the file system is other data or pins, or the blob is
// larger than it), nothing is evicted: it would empty the cache for a blob that never fits.
func (s *Store) DiskFull(lacked int64) {
	size, _ := s.idx.Totals()
	target := int64(float64(size) * evictLowWater)
	if lacked >= 0 && s.fsRoot != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(s.fsRoot, &st); err == nil {
			free := int64(st.Bavail) * int64(st.Bsize) //nolint:gosec // block counts of a real file system fit in int64
			short := lacked - free + diskFullSlack(lacked)
			// Called by a fill that found the disk full, without a context of its own: the
			// manifests evictionFloor reads are small and local.
			pinned, largest := s.evictionFloor(context.Background())
			if stored := s.idx.PinnedBytes(); short > size-stored {
				s.log.Warn().Int64("blob_lacked_bytes", lacked).Int64("free_bytes", free).Int64("size_bytes", size).Int64("pinned_bytes", stored).
					Msg("disk full: the blob would not fit even with the whole cache evicted (pinned content stays); nothing evicted for it")
				return
			}
			target = min(max(target, pinned+largest), size-short)
		}
	}
	s.useMu.Lock()
	s.enospcTarget = max(1, target)
	s.useMu.Unlock()
	s.wake()
}

// diskFullSlack is the room a blob of n bytes needs beyond its own size on the file system: its
// directories and the last partial block (64 KiB), plus 1/64 of it for file-system overhead.
func diskFullSlack(n int64) int64 { return 64<<10 + n/64 }

// takeENOSPCTarget returns and clears the size a disk-full eviction asked for (0: none).
func (s *Store) takeENOSPCTarget() int64 {
	s.useMu.Lock()
	defer s.useMu.Unlock()
	t := s.enospcTarget
	s.enospcTarget = 0
	return t
}
