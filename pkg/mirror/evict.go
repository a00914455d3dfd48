package mirror

import (
	"context"
	"errors"
	"sync"
	"time"

	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
)

// Eviction reasons, the values of nodecache_evictions_total's reason label.
const (
	EvictCap          = "cap"          // the cache grew over --max-size
	EvictENOSPC       = "enospc"       // a fill found the disk full
	EvictUnreferenced = "unreferenced" // blob data no manifest references
	EvictAPI          = "api"          // DELETE /nodecache/v1/cache/...
)

// evictLowWater is the share of the cap eviction brings the cache down to (90 %).
const evictLowWater = 0.9

// evictPause is the pause after each storage deletion of an eviction: it bounds eviction's I/O
// (at most 200 deletions a second) so serving keeps the disk.
const evictPause = 5 * time.Millisecond

// cacheState is the part of the Mirror that eviction and the serving path share.
type cacheState struct {
	idx    *cache.Index
	driver storagedriver.StorageDriver
	// storeMu is taken by a fill while distribution commits its blob (data moved into the blob
	// store, then linked) and by eviction while it deletes blob data, so a fill of the same
	// digest in another repository never links data that is being deleted.
	storeMu sync.Mutex

	useMu sync.Mutex
	inUse map[digest.Digest]int // blobs being served from storage

	// kick asks the eviction loop to look at the size now (buffer 1: requests coalesce).
	kick chan struct{}
	// enospcTarget, when not 0, is the size (bytes) a disk-full eviction brings the cache to.
	enospcTarget int64
	// fsRoot is the filesystem storage root (Options.Root; "" for s3 and in-memory storage):
	// its free space tells a disk-full eviction how much room a blob needs.
	fsRoot string
	log    zerolog.Logger
}

func newCacheState() *cacheState {
	return &cacheState{idx: cache.NewIndex(), inUse: map[digest.Digest]int{}, kick: make(chan struct{}, 1)}
}

// acquire marks blob d as being served until release.
func (c *cacheState) acquire(d digest.Digest) func() {
	c.useMu.Lock()
	c.inUse[d]++
	c.useMu.Unlock()
	return func() {
		c.useMu.Lock()
		if c.inUse[d]--; c.inUse[d] <= 0 {
			delete(c.inUse, d)
		}
		c.useMu.Unlock()
	}
}

func (c *cacheState) used(d digest.Digest) bool {
	c.useMu.Lock()
	defer c.useMu.Unlock()
	return c.inUse[d] > 0
}

// wake asks the eviction loop to check the size.
func (c *cacheState) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// evictTo removes content until the cache holds at most target bytes: unreferenced blobs first
// (oldest first), then least recently pulled images. It stops early when what is left is in use
// (being served or filled) and returns the bytes it freed.
func (m *Mirror) evictTo(ctx context.Context, target int64, reason string) int64 {
	c := m.cache
	skip := map[cache.Victim]bool{}
	var freed int64
	images := 0
	for ctx.Err() == nil {
		size, _ := c.idx.Totals()
		if size <= target {
			break
		}
		v, ok := c.idx.NextVictim(skip)
		if !ok {
			m.log.Warn().Int64("size_bytes", size).Int64("target_bytes", target).
				Msg("eviction stopped above its target: what is left is being served or filled")
			break
		}
		skip[v] = true
		if v.Repo == "" {
			if n, ok := m.removeBlobData(ctx, v.Manifest); ok {
				freed += n
				m.metrics.evictions.WithLabelValues(EvictUnreferenced).Inc()
			}
			continue
		}
		freed += m.evictImage(ctx, v.Repo, v.Manifest, reason)
		images++
	}
	if freed > 0 {
		size, _ := c.idx.Totals()
		m.log.Info().Str("reason", reason).Int("images", images).Int64("freed_bytes", freed).
			Int64("size_bytes", size).Int64("target_bytes", target).Msg("evicted")
	}
	return freed
}

// evictImage removes image manifest of repo (a storage repository name): links first (revisions,
// tags, blob links), then the blob data nothing references any more and nobody uses.
func (m *Mirror) evictImage(ctx context.Context, repo string, manifest digest.Digest, reason string) int64 {
	c := m.cache
	rm := c.idx.RemoveImage(repo, manifest)
	if len(rm.Manifests) == 0 {
		return 0
	}
	log := m.log.With().Str("repository", repo).Str("digest", manifest.String()).Str("reason", reason).Logger()
	for _, d := range rm.Manifests {
		m.deletePath(ctx, log, cache.RevisionPath(repo, d))
	}
	for _, t := range rm.Tags {
		m.deletePath(ctx, log, cache.TagPath(repo, t))
	}
	for _, d := range rm.Layers {
		m.deletePath(ctx, log, cache.LayerLinkPath(repo, d))
	}
	var freed int64
	for _, d := range rm.Data {
		if n, ok := m.removeBlobData(ctx, d); ok {
			freed += n
		}
	}
	m.metrics.evictions.WithLabelValues(reason).Inc()
	log.Debug().Int("manifests", len(rm.Manifests)).Strs("tags", rm.Tags).Int64("freed_bytes", freed).Msg("image evicted")
	return freed
}

// removeBlobData deletes blob d's links and data when no manifest references it and no request
// serves or fills it, under the lock fills take to commit. ok is false when it stays.
func (m *Mirror) removeBlobData(ctx context.Context, d digest.Digest) (int64, bool) {
	c := m.cache
	c.storeMu.Lock()
	defer c.storeMu.Unlock()
	if !c.idx.Unreferenced(d) || c.used(d) || m.fetch.FillingDigest(d) {
		return 0, false
	}
	for _, repo := range c.idx.LinksOf(d) {
		m.deletePath(ctx, m.log, cache.LayerLinkPath(repo, d))
	}
	if !m.deletePath(ctx, m.log, cache.BlobDirPath(d)) {
		return 0, false
	}
	n := c.idx.DropBlob(d)
	m.metrics.evictedBytes.Add(float64(n))
	return n, true
}

// deletePath deletes a storage path through the driver (gone already counts as deleted), then
// pauses for evictPause.
func (m *Mirror) deletePath(ctx context.Context, log zerolog.Logger, p string) bool {
	err := m.cache.driver.Delete(ctx, p)
	var nf storagedriver.PathNotFoundError
	if err != nil && !errors.As(err, &nf) {
		log.Error().Err(err).Str("path", p).Msg("eviction: delete from storage")
		return false
	}
	select {
	case <-time.After(evictPause):
	case <-ctx.Done():
	}
	return true
}

// runCache loads the index, then evicts whenever the cache is over its cap (at once when it
// already is) or a disk-full fill asks for room, and saves the index every cache.SaveInterval.
func (m *Mirror) runCache(ctx context.Context) {
	c := m.cache
	m.loadIndex(ctx)
	if err := m.saveIndex(false); err != nil {
		m.log.Warn().Err(err).Msg("write cache index")
	}
	save := time.NewTicker(cache.SaveInterval)
	defer save.Stop()
	for {
		if target := c.takeENOSPCTarget(); target > 0 {
			m.evictTo(ctx, target, EvictENOSPC)
		}
		if max := m.opts.MaxSize; max > 0 {
			if size, _ := c.idx.Totals(); size > max {
				m.evictTo(ctx, int64(float64(max)*evictLowWater), EvictCap)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-save.C:
			if err := m.saveIndex(false); err != nil {
				m.log.Warn().Err(err).Msg("write cache index")
			}
		}
	}
}

// diskFull asks the eviction loop to make room after a fill found the disk full; lacked is how
// many more bytes the blob needed than the disk had (upstream.Options.OnDiskFull; -1: unknown).
// The cache goes to 90 % of the bytes it holds now, or lower when the blob needs more: to what
// leaves the blob room (with diskFullSlack) once the fill's partial staging file is gone. When
// even an empty cache would leave the blob no room (the rest of the file system is other data,
// or the blob is larger than it), nothing is evicted: it would empty the cache for a blob that
// never fits.
func (c *cacheState) diskFull(lacked int64) {
	size, _ := c.idx.Totals()
	target := int64(float64(size) * evictLowWater)
	if lacked >= 0 && c.fsRoot != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(c.fsRoot, &st); err == nil {
			free := int64(st.Bavail) * int64(st.Bsize) //nolint:gosec // block counts of a real file system fit in int64
			short := lacked - free + diskFullSlack(lacked)
			if short > size {
				c.log.Warn().Int64("blob_lacked_bytes", lacked).Int64("free_bytes", free).Int64("size_bytes", size).
					Msg("disk full: the blob would not fit even with the whole cache evicted; nothing evicted for it")
				return
			}
			target = min(target, size-short)
		}
	}
	c.useMu.Lock()
	c.enospcTarget = max(1, target)
	c.useMu.Unlock()
	c.wake()
}

// diskFullSlack is the room a blob of n bytes needs beyond its own size on the file system: its
// directories and the last partial block (64 KiB), plus 1/64 of it for file-system overhead.
func diskFullSlack(n int64) int64 { return 64<<10 + n/64 }

// takeENOSPCTarget returns and clears the size a disk-full eviction asked for (0: none).
func (c *cacheState) takeENOSPCTarget() int64 {
	c.useMu.Lock()
	defer c.useMu.Unlock()
	t := c.enospcTarget
	c.enospcTarget = 0
	return t
}

// grew is called after content was stored: over the cap, the eviction loop is woken.
func (m *Mirror) grew() {
	if m.opts.MaxSize > 0 {
		if size, _ := m.cache.idx.Totals(); size > m.opts.MaxSize {
			m.cache.wake()
		}
	}
}
