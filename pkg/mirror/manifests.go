package mirror

import (
	"context"
	"errors"
	"fmt"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/distribution/distribution/v3/registry/storage"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// manifestService serves manifests by digest from local storage, filling from the upstream on a
// miss. A digest names immutable content, so a cached one is served without upstream contact.
type manifestService struct {
	local distribution.ManifestService
	r     *repository
}

var _ distribution.ManifestService = (*manifestService)(nil)

func (s *manifestService) Exists(ctx context.Context, dgst digest.Digest) (bool, error) {
	return s.local.Exists(ctx, dgst)
}

func (s *manifestService) Get(ctx context.Context, dgst digest.Digest, options ...distribution.ManifestServiceOption) (distribution.Manifest, error) {
	st := stateFrom(ctx)
	man, err := s.local.Get(ctx, dgst)
	switch {
	case err == nil:
		st.setCache(mirrorapi.CacheHit)
	default:
		var unknown distribution.ErrManifestUnknownRevision
		if !errors.As(err, &unknown) {
			// Not a stored manifest: distribution's descriptor cache also finds a cached blob
			// of that digest here, which then fails to parse. What the digest is, the upstream
			// says, exactly as it did before anything was cached.
			s.r.log.Debug().Err(err).Str("repository", s.r.repo).Str("digest", dgst.String()).Msg("local manifest unusable; asking the upstream")
		}
		fetched, joined, ferr := s.r.up.remote.Manifest(ctx, s.r.repo, dgst.String(), dgst, s.r.keepManifest)
		if ferr != nil {
			return nil, upstreamAPIError(st, ferr)
		}
		if joined {
			st.setCache(mirrorapi.CacheCoalesced)
		} else {
			st.setCache(mirrorapi.CacheMiss)
		}
		man = fetched.Kept.(distribution.Manifest)
	}
	s.r.cache.Pulled(s.r.storageName(), dgst)
	st.mu.Lock()
	pt := st.pendingTag
	st.pendingTag = nil
	st.mu.Unlock()
	if pt != nil && pt.desc.Digest == dgst {
		// Store the tag only now that its manifest is stored, so a stale answer always has
		// content behind it.
		tctx := context.WithoutCancel(ctx)
		if terr := s.r.Repository.Tags(tctx).Tag(tctx, pt.tag, v1.Descriptor{Digest: dgst}); terr != nil {
			s.r.log.Error().Err(terr).Str("repository", s.r.repo).Str("tag", pt.tag).Msg("store tag")
		} else {
			s.r.cache.Tagged(s.r.storageName(), pt.tag, dgst)
			s.r.fetch.MarkTagFresh(s.r.up.Name, s.r.repo, pt.tag)
		}
	}
	return man, nil
}

func (s *manifestService) Put(context.Context, distribution.Manifest, ...distribution.ManifestServiceOption) (digest.Digest, error) {
	return "", distribution.ErrUnsupported
}

func (s *manifestService) Delete(context.Context, digest.Digest) error {
	return distribution.ErrUnsupported
}

// keepManifest parses a manifest fetched from the upstream and stores it in r's repository
// (upstream.KeepFunc); it returns the distribution.Manifest.
//
// Errors: MANIFEST_INVALID (400, the client's answer as is, see upstreamAPIError) naming the
// upstream and digest for content that is not an OCI or Docker v2 manifest or index, and for
// one that lists more than cache.MaxManifestRefs descriptors (nothing of it is stored); a plain error
// (503 to the client) when storing fails.
func (r *repository) keepManifest(ctx context.Context, fm upstream.Manifest) (any, error) {
	// Parsed and bounded before the store lock: every manifest store and blob commit of the
	// cache waits for that lock, so under it is only what must be atomic with eviction.
	refs, listed := cache.ManifestRefs(fm.Raw, cache.MaxManifestRefs)
	if listed > cache.MaxManifestRefs {
		return nil, errcode.ErrorCodeManifestInvalid.WithMessage(fmt.Sprintf(
			"upstream %s: manifest %s lists %d descriptors (config, layers, child manifests); nodecache refuses more than %d per manifest (real images have at most 125 layers)",
			r.up.Name, fm.Digest, listed, cache.MaxManifestRefs))
	}
	man, _, err := distribution.UnmarshalManifest(fm.MediaType, fm.Raw)
	if err != nil {
		return nil, errcode.ErrorCodeManifestInvalid.WithMessage(
			fmt.Sprintf("upstream %s: manifest %s of media type %q is not an OCI or Docker v2 manifest or index: %v", r.up.Name, fm.Digest, fm.MediaType, err))
	}
	store, err := r.Repository.Manifests(ctx, storage.SkipLayerVerification())
	if err != nil {
		return nil, fmt.Errorf("open manifest store: %w", err)
	}
	// Stored and recorded under the lock eviction deletes blob data with, so an eviction of the
	// same manifest (from another repository, or pulled again meanwhile) never deletes the data
	// of a manifest being linked.
	err = r.cache.CommitManifest(r.storageName(), fm.Digest, int64(len(fm.Raw)), refs, func() error {
		_, err := store.Put(ctx, man)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store manifest %s@%s: %w", r.repo, fm.Digest, err)
	}
	return man, nil
}
