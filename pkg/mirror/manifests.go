package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/distribution/distribution/v3/registry/storage"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
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
		st.setCache(CacheHit)
	default:
		var unknown distribution.ErrManifestUnknownRevision
		if !errors.As(err, &unknown) {
			return nil, err
		}
		fetched, ferr := s.r.fetchManifest(ctx, dgst.String(), dgst)
		if ferr != nil {
			return nil, upstreamAPIError(st, ferr)
		}
		if fetched.joined {
			st.setCache(CacheCoalesced)
		} else {
			st.setCache(CacheMiss)
		}
		man = fetched.manifest
	}
	st.mu.Lock()
	pt := st.pendingTag
	st.pendingTag = nil
	st.mu.Unlock()
	if pt != nil && pt.desc.Digest == dgst {
		// Store the tag only now that its manifest is stored, so a stale answer always has
		// content behind it.
		tctx := context.WithoutCancel(ctx)
		if terr := s.r.Repository.Tags(tctx).Tag(tctx, pt.tag, v1.Descriptor{Digest: dgst}); terr != nil {
			s.r.m.log.Error().Err(terr).Str("repository", s.r.repo).Str("tag", pt.tag).Msg("store tag")
		} else {
			s.r.m.markTagFresh(s.r.up.Name + "/" + s.r.repo + ":" + pt.tag)
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

// fetchedManifest is a manifest fetched from the upstream and stored locally.
type fetchedManifest struct {
	manifest distribution.Manifest
	desc     v1.Descriptor
	joined   bool // this caller shared a fetch another request had started
}

// fetchManifest GETs the manifest ref (tag or digest) from the upstream, checks it against want
// (when set; else against the upstream's Docker-Content-Digest, when sent), and stores it.
// Concurrent requests for the same manifest share one fetch.
func (r *repository) fetchManifest(ctx context.Context, ref string, want digest.Digest) (fetchedManifest, error) {
	leader := false
	v, err, _ := r.m.flight.Do("manifest\x00"+r.up.Name+"\x00"+r.repo+"\x00"+ref, func() (any, error) {
		leader = true
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.m.opts.UpstreamTimeout+30*time.Second)
		defer cancel()
		start := time.Now()
		resp, err := r.up.client.do(ctx, http.MethodGet, r.repo, "manifests", ref,
			http.Header{"Accept": {manifestAccept}}, http.StatusOK)
		r.m.metrics.observeUpstream(r.up.Name, kindManifest, start, err)
		if err != nil {
			return fetchedManifest{}, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxManifestBytes+1))
		if err != nil {
			return fetchedManifest{}, r.up.client.classify("read manifest "+ref, err)
		}
		if len(body) > maxManifestBytes {
			return fetchedManifest{}, fmt.Errorf("upstream %s: manifest %s is larger than %d bytes", r.up.Name, ref, maxManifestBytes)
		}
		r.m.metrics.upstreamBytes.WithLabelValues(r.up.Name).Add(float64(len(body)))
		if want == "" {
			want, _ = digest.Parse(resp.Header.Get("Docker-Content-Digest"))
		}
		if want != "" {
			if got := want.Algorithm().FromBytes(body); got != want {
				return fetchedManifest{}, fmt.Errorf("upstream %s: manifest %s: content digest %s does not match %s", r.up.Name, ref, got, want)
			}
		} else {
			want = digest.FromBytes(body)
		}
		ct := mediaType(resp.Header.Get("Content-Type"))
		if ct == "" || ct == "application/json" || ct == "text/plain" {
			var probe struct {
				MediaType string `json:"mediaType"`
			}
			_ = json.Unmarshal(body, &probe)
			ct = probe.MediaType
		}
		man, desc, err := distribution.UnmarshalManifest(ct, body)
		if err != nil {
			return fetchedManifest{}, errcode.ErrorCodeManifestInvalid.WithMessage(
				fmt.Sprintf("upstream %s: manifest %s of media type %q is not an OCI or Docker v2 manifest or index: %v", r.up.Name, ref, ct, err))
		}
		desc.Digest = want
		sctx := context.WithoutCancel(ctx)
		store, err := r.Repository.Manifests(sctx, storage.SkipLayerVerification())
		if err != nil {
			return fetchedManifest{}, fmt.Errorf("open manifest store: %w", err)
		}
		if _, err := store.Put(sctx, man); err != nil {
			return fetchedManifest{}, fmt.Errorf("store manifest %s@%s: %w", r.repo, want, err)
		}
		return fetchedManifest{manifest: man, desc: desc}, nil
	})
	if err != nil {
		return fetchedManifest{}, err
	}
	fm := v.(fetchedManifest)
	fm.joined = !leader
	return fm, nil
}

// remoteTags lists the upstream repository's tags (tags/list, first page of up to 10000).
func (r *repository) remoteTags(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.m.opts.UpstreamTimeout)
	defer cancel()
	resp, err := r.up.client.do(ctx, http.MethodGet, r.repo, "tags", "list?n=10000", nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Tags []string `json:"tags"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxManifestBytes)).Decode(&body); err != nil {
		return nil, fmt.Errorf("upstream %s: decode tags of %s: %w", r.up.Name, r.repo, err)
	}
	return body.Tags, nil
}

func mediaType(ct string) string {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return ""
	}
	return mt
}
