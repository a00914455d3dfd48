package mirror

import (
	"context"
	"time"

	"github.com/distribution/distribution/v3/registry/storage"
)

// uploadSweepInterval is how often Run removes uploads left by fills.
const uploadSweepInterval = time.Hour

// Run does the mirror's background work until ctx ends: it loads the cache index (or rebuilds
// it from storage while serving goes on), keeps the cache under Options.MaxSize (eviction waits
// for the index), writes the index at most every minute, and every hour removes uploads
// (distribution's `_uploads` directories) older than Options.FillTimeout. A fill writes its
// blob through an upload only while it commits, so an upload older than the longest fill was
// left by a fill that died (process killed, disk full). New already removed every upload of an
// earlier run. It returns nil when ctx ends.
func (m *Mirror) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.runCache(ctx)
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

// sweepUploads removes the uploads older than Options.FillTimeout.
func (m *Mirror) sweepUploads(ctx context.Context) {
	m.purgeUploads(ctx, m.opts.Clock().Add(-m.opts.FillTimeout))
}

// purgeUploads removes the uploads started before olderThan, through the storage driver.
func (m *Mirror) purgeUploads(ctx context.Context, olderThan time.Time) {
	if m.driver == nil {
		return
	}
	deleted, errs := storage.PurgeUploads(ctx, m.driver, olderThan, true)
	for _, err := range errs {
		m.log.Debug().Err(err).Msg("remove fill leftovers")
	}
	if len(deleted) > 0 {
		m.log.Info().Int("uploads", len(deleted)).Time("older_than", olderThan).Msg("removed uploads left by fills")
	}
}
