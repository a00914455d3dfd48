package mirror

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
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
	if t.r.fetch.TagFresh(t.r.up.Name, t.r.repo, tag) {
		if desc, err := t.local.Get(ctx, tag); err == nil {
			st.setCache(mirrorapi.CacheHit)
			return desc, nil
		}
	}
	ans, err := t.r.up.remote.Tag(ctx, t.r.repo, tag, t.r.keepManifest)
	desc := ans.Desc
	if err == nil {
		st.setCache(mirrorapi.CacheRevalidated)
		if ans.Fetched {
			st.setCache(mirrorapi.CacheMiss)
		}
		if cur, lerr := t.local.Get(ctx, tag); lerr != nil || cur.Digest != desc.Digest {
			st.mu.Lock()
			st.pendingTag = &pendingTag{tag: tag, desc: desc}
			st.mu.Unlock()
		} else {
			t.r.fetch.MarkTagFresh(t.r.up.Name, t.r.repo, tag)
		}
		return desc, nil
	}
	var ue *upstream.Error
	if errors.As(err, &ue) && ue.NotFound() {
		return v1.Descriptor{}, distribution.ErrTagUnknown{Tag: tag}
	}
	if cached, lerr := t.local.Get(ctx, tag); lerr == nil {
		st.setCache(mirrorapi.CacheStale)
		t.r.log.Warn().Str("upstream", t.r.up.Name).Str("repository", t.r.repo).Str("tag", tag).
			Err(err).Msg("upstream failed; serving the cached tag")
		return cached, nil
	}
	return v1.Descriptor{}, upstreamAPIError(st, err)
}

// upstreamAPIError turns an upstream failure with nothing cached into the client's answer:
// 400 MANIFEST_INVALID for schema 1 and for what is not a manifest, 429 with the upstream's
// Retry-After, 404 for an authoritative not-found, 401/403 DENIED, 502 UNKNOWN naming the target
// for a redirect or realm the address guard refused (upstream.ErrUnsafeTarget) and for a blob of
// unstated size past its bound, 503 otherwise.
func upstreamAPIError(st *reqState, err error) error {
	var (
		ue *upstream.Error
		ec errcode.Error
	)
	switch {
	case errors.Is(err, upstream.ErrSchema1):
		return errcode.ErrorCodeManifestInvalid.WithMessage(err.Error()) // ends "schema 1 manifests are not supported"
	case errors.Is(err, upstream.ErrNotManifest):
		return errcode.ErrorCodeManifestInvalid.WithMessage(err.Error())
	case errors.As(err, &ec):
		return ec // already the client's answer (e.g. MANIFEST_INVALID from storing)
	case errors.Is(err, upstream.ErrUnsafeTarget), errors.Is(err, upstream.ErrUnknownSizeTooLarge):
		// The upstream's answer, not this cache, is at fault: 502 with what was refused.
		st.mu.Lock()
		st.badGateway = true
		st.mu.Unlock()
		return errcode.ErrorCodeUnknown.WithMessage(err.Error())
	}
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
		case ue.Status == http.StatusLoopDetected:
			st.mu.Lock()
			st.loop = true
			st.mu.Unlock()
			return errcode.ErrorCodeUnknown.WithMessage(ue.Error() + ": the request went round a loop of chained nodecaches (check --chain and --upstream URLs)")
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

// All lists the upstream repository's tags (every page, merged, in lexical order), as
// upstream.Remote.Tags answers them: fetched now ("miss"), joined to a fetch another request
// started ("coalesced"), or kept from a fetch less than Options.TagTTL ago ("hit"); when the
// upstream fails, times out or answers 429/5xx, the tags stored locally ("stale"). The slice
// is shared: callers must not modify it.
//
// Errors: distribution.ErrRepositoryUnknown for a repository the upstream does not know (404
// NAME_UNKNOWN), a 502 UNKNOWN naming the bound when the listing is past one of
// upstream.Remote.Tags' (pages, bytes, tags), else the upstream's failure as upstreamAPIError
// answers it.
func (t *tagService) All(ctx context.Context) ([]string, error) {
	st := stateFrom(ctx)
	list, err := t.r.up.remote.Tags(ctx, t.r.repo)
	if err == nil {
		switch {
		case list.Kept:
			st.setCache(mirrorapi.CacheHit)
		case list.Joined:
			st.setCache(mirrorapi.CacheCoalesced)
		default:
			st.setCache(mirrorapi.CacheMiss)
		}
		return list.Tags, nil
	}
	var ue *upstream.Error
	switch {
	case errors.Is(err, upstream.ErrTagListTooLarge):
		st.mu.Lock()
		st.badGateway = true
		st.mu.Unlock()
		return nil, errcode.ErrorCodeUnknown.WithMessage(err.Error())
	case errors.As(err, &ue) && ue.NotFound():
		return nil, distribution.ErrRepositoryUnknown{Name: t.r.client.Name()}
	case errors.As(err, &ue) && !ue.Unavailable():
		return nil, upstreamAPIError(st, err)
	}
	if local, lerr := t.local.All(ctx); lerr == nil {
		st.setCache(mirrorapi.CacheStale)
		slices.Sort(local)
		return local, nil
	}
	return nil, upstreamAPIError(st, err)
}

// List returns up to limit tags (all when limit < 0) that sort after last, in lexical order
// (OCI distribution spec, "Listing Tags"). Its error is io.EOF when no tag follows the page, so
// distribution's handler sends a Link header only when there are more; an empty page is a
// valid answer.
func (t *tagService) List(ctx context.Context, limit int, last string) ([]string, error) {
	all, err := t.All(ctx)
	if err != nil {
		return nil, err
	}
	start := 0
	if last != "" {
		start, _ = slices.BinarySearch(all, last)
		if start < len(all) && all[start] == last {
			start++
		}
	}
	rest := all[start:]
	if limit < 0 || limit >= len(rest) {
		return slices.Clone(rest), io.EOF
	}
	return slices.Clone(rest[:limit]), nil
}

func (t *tagService) Lookup(ctx context.Context, desc v1.Descriptor) ([]string, error) {
	return t.local.Lookup(ctx, desc)
}
