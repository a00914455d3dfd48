package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bundle"
)

// seedState is the readiness of serve --seed (Options.Seed): an error while the bundle is being
// stored or when storing it failed, nil once it is stored (or with no seed).
type seedState struct {
	err error
}

// seedStart is the seed's readiness before Run: not ready while there is a seed (dir).
func seedStart(dir string) seedState {
	if dir == "" {
		return seedState{}
	}
	return seedState{err: fmt.Errorf("seeding the cache from %s (--seed): ready once every image of it is stored", dir)}
}

// seedReady is Ready's answer about the seed: nil, or why serve is not ready.
func (m *Mirror) seedReady() error {
	m.seedMu.Lock()
	defer m.seedMu.Unlock()
	return m.seedStatus.err
}

func (m *Mirror) setSeed(err error) {
	m.seedMu.Lock()
	m.seedStatus.err = err
	m.seedMu.Unlock()
}

// runSeed stores the bundle of Options.Seed (seedBundle) once the cache index is loaded, then
// marks the mirror ready; when that fails, it keeps it unready with the failure and calls fail
// with it (Run then ends with it). It returns when done or ctx ends.
func (m *Mirror) runSeed(ctx context.Context, fail func(error)) {
	select {
	case <-m.cache.IndexLoaded():
	case <-ctx.Done():
		return
	}
	err := m.seedBundle(ctx)
	switch {
	case ctx.Err() != nil:
		return // stopping: neither ready nor failed
	case err != nil:
		err = fmt.Errorf("--seed %s: %w", m.opts.Seed, err)
		m.setSeed(err)
		fail(err)
		return
	}
	m.setSeed(nil)
}

// seedBundle reads the bundle of Options.Seed from serve's filesystem and stores its images as
// an import does (planImport, stageBlob, commitImport): only the blobs the cache does not hold
// are read, hashed and staged (a blob already stored is not read again), and nothing is stored
// until every one of them is staged and checked.
//
// Errors: the bundle's (a refusal, a *bundle.DamageError naming the blob), the plan's
// (*importError), a store's.
func (m *Mirror) seedBundle(ctx context.Context) error {
	start := time.Now()
	b, err := m.openBundle(ctx, m.opts.Seed, bundle.ReadOptions{})
	if errors.Is(err, bundle.ErrNeedsRef) {
		return fmt.Errorf("%w; serve --seed has no --ref: import this bundle with nodecache cache import --ref into the running serve, or write it with full names (crane pull --annotate-ref)", err)
	}
	if err != nil {
		return err
	}
	job, err := m.planImport(b.Plan())
	if err != nil {
		return err
	}
	missing := map[digest.Digest]bool{}
	for _, mb := range m.missingBlobs(job) {
		missing[digest.Digest(mb.Digest)] = true
	}
	m.log.Info().Str("seed", m.opts.Seed).Str("layout", string(b.Kind)).Int("images", len(b.Images)).Int("blobs", len(b.Blobs)).
		Int("blobs_missing", len(missing)).Msg("seeding the cache")
	st := m.newStaging()
	defer st.remove()
	err = b.Each(ctx, func(bl bundle.Blob) bool { return missing[bl.Digest] }, func(bl bundle.Blob, data io.Reader) error {
		return m.stageBlob(st, job, bl.Digest, data)
	})
	if err != nil {
		return err
	}
	res, err := m.commitImport(ctx, job, st)
	if err != nil {
		return err
	}
	m.log.Info().Str("seed", m.opts.Seed).Int("images", len(res.Images)).Int("manifests", res.Manifests).Int("blobs_stored", res.BlobsStored).
		Int64("bytes_stored", res.BytesStored).Int("blobs_present", res.BlobsPresent).Str("duration", clitext.Span(time.Since(start))).Msg("cache seeded")
	return nil
}
