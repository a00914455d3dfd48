package mirror

import (
	"context"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
)

// ErrRootInUse is wrapped by Run's error when another process holds the lock of a filesystem
// --root: two processes on one root would keep separate indexes and evict what the other serves.
// It is cache.ErrRootInUse (cache.LockRoot).
var ErrRootInUse = cache.ErrRootInUse

// uploadSweepInterval is how often Run removes uploads left by fills.
const uploadSweepInterval = time.Hour

// Run takes the storage root and does the mirror's background work until ctx ends. Before
// anything else it takes the root lock (filesystem storage: one process per root, cache.LockRoot),
// then removes what an earlier run left (staging files of fills, and distribution's uploads:
// every one on a filesystem root, those older than Options.FillTimeout in a shared bucket,
// which also holds other replicas' fills in flight). Then it loads the cache index (or rebuilds
// it from storage while serving goes on), keeps the cache under Options.MaxSize (eviction waits
// for the index), writes the index at most every minute, and every hour removes uploads older
// than Options.FillTimeout (a fill writes through an upload only while it commits, so an older
// one was left by a fill that died). Every goroutine it starts has stopped when it returns; the
// root lock is held until Close, which writes the index first.
//
// Errors: ErrRootInUse when another process holds the root (nothing was removed), an
// unusable root; nil when ctx ends.
func (m *Mirror) Run(ctx context.Context) error { return m.run(ctx, nil) }

// run is Run; started, when set, is closed once the root is taken and swept, before the
// background work starts (Serve binds its listeners then).
func (m *Mirror) run(ctx context.Context, started chan<- struct{}) error {
	if err := m.takeRoot(ctx); err != nil {
		return err
	}
	if started != nil {
		close(started)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.cache.Run(ctx)
	}()
	defer func() { <-done }()
	t := time.NewTicker(uploadSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			m.sweepUploads(ctx)
		}
	}
}

// takeRoot locks a filesystem root and removes what an earlier run left: staging files and
// uploads. Only the first call does: a second Run keeps the lock and the fills in flight.
func (m *Mirror) takeRoot(ctx context.Context) error {
	first, err := m.cache.Take()
	if err != nil || !first {
		return err // !first: swept already, what is staged now belongs to fills in flight
	}
	upstream.RemoveStaging(m.fetch.StagingDir())
	if m.opts.Storage == StorageS3 {
		m.purgeUploads(ctx, m.opts.Clock().Add(-m.opts.FillTimeout))
	} else {
		m.purgeUploads(ctx, m.opts.Clock())
	}
	return nil
}

// sweepUploads removes the uploads older than Options.FillTimeout.
func (m *Mirror) sweepUploads(ctx context.Context) {
	m.purgeUploads(ctx, m.opts.Clock().Add(-m.opts.FillTimeout))
}

// purgeUploads removes the uploads started before olderThan, through the storage driver.
func (m *Mirror) purgeUploads(ctx context.Context, olderThan time.Time) {
	deleted, errs := m.cache.PurgeUploads(ctx, olderThan)
	for _, err := range errs {
		m.log.Debug().Err(err).Msg("remove fill leftovers")
	}
	if len(deleted) > 0 {
		m.log.Info().Int("uploads", len(deleted)).Time("older_than", olderThan).Msg("removed uploads left by fills")
	}
}
