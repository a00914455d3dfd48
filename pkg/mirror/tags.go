package mirror

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// tagService resolves tags: revalidated with the upstream (HEAD) on each request unless
// Options.TagTTL says the cached answer is fresh; the cached tag is served ("stale") when the
// upstream fails, times out or answers 429/5xx.
type tagService struct {
	local distribution.TagService
	r     *repository
}

var _ distribution.TagService = (*tagService)(nil)

func (t *tagService) Get(ctx context.Context, tag string) (v1.Descriptor, error) {
	st := stateFrom(ctx)
	m := t.r.m
	key := t.r.up.Name + "/" + t.r.repo + ":" + tag
	if m.opts.TagTTL > 0 && m.tagFresh(key) {
		if desc, err := t.local.Get(ctx, tag); err == nil {
			st.setCache(CacheHit)
			return desc, nil
		}
	}
	desc, fetched, err := t.r.remoteTag(ctx, tag)
	if err == nil {
		st.setCache(CacheRevalidated)
		if fetched {
			st.setCache(CacheMiss)
		}
		if cur, lerr := t.local.Get(ctx, tag); lerr != nil || cur.Digest != desc.Digest {
			st.mu.Lock()
			st.pendingTag = &pendingTag{tag: tag, desc: desc}
			st.mu.Unlock()
		} else {
			m.markTagFresh(key)
		}
		return desc, nil
	}
	var ue *upstreamError
	if errors.As(err, &ue) && ue.notFound() {
		return v1.Descriptor{}, distribution.ErrTagUnknown{Tag: tag}
	}
	if cached, lerr := t.local.Get(ctx, tag); lerr == nil {
		st.setCache(CacheStale)
		m.log.Warn().Str("upstream", t.r.up.Name).Str("repository", t.r.repo).Str("tag", tag).
			Err(err).Msg("upstream failed; serving the cached tag")
		return cached, nil
	}
	return v1.Descriptor{}, upstreamAPIError(st, err)
}

type remoteTagAnswer struct {
	desc    v1.Descriptor
	fetched bool // the manifest was fetched (and stored) to learn its digest
}

// remoteTag asks the upstream which manifest tag names now: one HEAD, shared by concurrent
// requests for the same tag, bounded by Options.UpstreamTimeout as a whole. fetched reports
// that the upstream's HEAD named no digest, so the manifest was fetched and stored instead.
func (r *repository) remoteTag(ctx context.Context, tag string) (desc v1.Descriptor, fetched bool, err error) {
	v, err, _ := r.m.flight.Do("tag\x00"+r.up.Name+"\x00"+r.repo+"\x00"+tag, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.m.opts.UpstreamTimeout)
		defer cancel()
		start := time.Now()
		resp, err := r.up.client.do(ctx, http.MethodHead, r.repo, "manifests", tag,
			http.Header{"Accept": {manifestAccept}}, http.StatusOK)
		r.m.metrics.observeUpstream(r.up.Name, kindManifest, start, err)
		if err != nil {
			return nil, err
		}
		_ = resp.Body.Close()
		dgst, perr := digest.Parse(resp.Header.Get("Docker-Content-Digest"))
		if perr != nil {
			// The digest header is optional on HEAD: fetch the manifest to learn it.
			m, gerr := r.fetchManifest(ctx, tag, "")
			if gerr != nil {
				return nil, gerr
			}
			return remoteTagAnswer{desc: m.desc, fetched: true}, nil
		}
		return remoteTagAnswer{desc: v1.Descriptor{Digest: dgst, Size: resp.ContentLength, MediaType: mediaType(resp.Header.Get("Content-Type"))}}, nil
	})
	if err != nil {
		return v1.Descriptor{}, false, err
	}
	a := v.(remoteTagAnswer)
	return a.desc, a.fetched, nil
}

// upstreamAPIError turns an upstream failure with nothing cached into the client's answer:
// 429 with the upstream's Retry-After, 404 for an authoritative not-found, 503 otherwise.
func upstreamAPIError(st *reqState, err error) error {
	var ue *upstreamError
	if errors.As(err, &ue) {
		switch {
		case ue.Status == http.StatusTooManyRequests:
			if ue.RetryAfter != "" {
				st.mu.Lock()
				st.retryAfter = ue.RetryAfter
				st.mu.Unlock()
			}
			return errcode.ErrorCodeTooManyRequests.WithMessage(ue.Error())
		case ue.Status == http.StatusNotFound:
			return errcode.ErrorCodeManifestUnknown.WithMessage(ue.Error())
		case ue.Status == http.StatusUnauthorized || ue.Status == http.StatusForbidden:
			return errcode.ErrorCodeDenied.WithMessage(ue.Error())
		}
	}
	return errcode.ErrorCodeUnavailable.WithMessage(err.Error())
}

// The rest of TagService: a read-only cache answers listings from the upstream (see
// tagsList) and refuses changes.

func (t *tagService) Tag(context.Context, string, v1.Descriptor) error {
	return distribution.ErrUnsupported
}
func (t *tagService) Untag(context.Context, string) error { return distribution.ErrUnsupported }

func (t *tagService) All(ctx context.Context) ([]string, error) {
	tags, err := t.r.remoteTags(ctx)
	if err == nil {
		return tags, nil
	}
	if local, lerr := t.local.All(ctx); lerr == nil {
		stateFrom(ctx).setCache(CacheStale)
		return local, nil
	}
	return nil, upstreamAPIError(stateFrom(ctx), err)
}

func (t *tagService) List(ctx context.Context, limit int, last string) ([]string, error) {
	all, err := t.All(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(all))
	for _, tag := range all {
		if last != "" && tag <= last {
			continue
		}
		out = append(out, tag)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out, nil
}

func (t *tagService) Lookup(ctx context.Context, desc v1.Descriptor) ([]string, error) {
	return t.local.Lookup(ctx, desc)
}
