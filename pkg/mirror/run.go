package mirror

import (
	"context"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
)

// ErrRootInUse is wrapped by Run's error when another process holds the lock of a filesystem
// --root: two processes on one root would keep separate indexes and evict what the other serves.
// It is cache.ErrRootInUse (cache.LockRoot).
var ErrRootInUse = cache.ErrRootInUse

// Run takes the storage root and does the mirror's background work until ctx ends. Before
// anything else it takes the root lock (filesystem storage: one process per root, cache.LockRoot),
// then removes what an earlier run left (staging files of fills, leaving those of fills in flight
// that requests served before Run started; and distribution's uploads:
// every one on a filesystem root, those older than Options.FillTimeout in a shared bucket,
// which also holds other replicas' fills in flight). Then it loads the cache index (or rebuilds
// it from storage while serving goes on), keeps the cache under Options.MaxSize (eviction waits
// for the index), writes the index at most every minute, and every hour removes uploads older
// than Options.FillTimeout (a fill writes through an upload only while it commits, so an older
// one was left by a fill that died). With peers it keeps the membership (PeerOptions.Refresh).
// With Options.Seed it stores the bundle's images once the index is loaded (Ready says not
// ready until then). Every goroutine it starts has stopped when it returns; the
// root lock is held until Close, which writes the index first.
//
// Errors: ErrRootInUse when another process holds the root (nothing was removed), an
// unusable root; the seed's failure (a bundle refused or damaged: nothing of it stored), which
// ends it early; nil when ctx ends.
func (m *Mirror) Run(ctx context.Context) error { return m.run(ctx, nil) }

// run is Run; started, when set, is closed once the root is taken and swept, before the
// background work starts (Serve binds its listeners then).
func (m *Mirror) run(ctx context.Context, started chan<- struct{}) error {
	if _, err := m.cache.Take(ctx); err != nil {
		return err
	}
	if started != nil {
		close(started)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var seedErr error
	seeded := make(chan struct{})
	go func() {
		defer close(seeded)
		if m.opts.Seed != "" {
			m.runSeed(ctx, func(err error) { seedErr = err; cancel() })
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if m.listening != nil {
			select {
			case <-m.listening:
			case <-ctx.Done():
				return
			}
		}
		m.peering.run(ctx)
	}()
	m.cache.Run(ctx)
	<-done
	<-seeded
	return seedErr
}
