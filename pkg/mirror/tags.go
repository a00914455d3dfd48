package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/distribution/distribution/v3/registry/api/errcode"

	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// serveTags answers GET /v2/<name>/tags/list[?n=<int>&last=<tag>] (OCI distribution spec,
// "Listing Tags"): up to n tags that sort after last, in lexical order, from the upstream's
// listing (tags), as {"name": <the name the client sent>, "tags": [...]}; a Link header
// (rel="next") to the client's own path, with its ?ns= kept, when more follow. n=0 answers an
// empty page without asking the upstream. Other methods get distribution's 405.
//
// Errors: a *readError, nothing written: 400 PAGINATION_NUMBER_INVALID for an n that is not a
// whole number ≥ 0; 404 NAME_UNKNOWN for a repository the upstream does not know; else the
// upstream's failure as tags answers it.
func (r *repository) serveTags(ctx context.Context, w http.ResponseWriter, req *http.Request) (outcome, error) {
	if req.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "Method not allowed", http.StatusMethodNotAllowed)
		return outcome{}, nil
	}
	q := req.URL.Query()
	last, limit := q.Get("last"), -1
	if n := q.Get("n"); n != "" {
		parsed, err := strconv.Atoi(n)
		if err != nil || parsed < 0 {
			return outcome{}, codeError(errcode.ErrorCodePaginationNumberInvalid, map[string]int{"n": parsed})
		}
		limit = parsed
	}
	var (
		out  outcome
		page = []string{}
		more bool
	)
	if limit != 0 {
		all, listOut, err := r.tags(ctx)
		out = listOut
		if err != nil {
			return out, err
		}
		page, more = tagPage(all, last, limit)
	}
	w.Header().Set("Content-Type", "application/json")
	if more {
		next := url.Values{"n": {strconv.Itoa(limit)}, "last": {page[len(page)-1]}}
		if ns := q.Get("ns"); ns != "" {
			next.Set("ns", ns)
		}
		w.Header().Set("Link", "<"+(&url.URL{Path: req.URL.Path, RawQuery: next.Encode()}).String()+`>; rel="next"`)
	}
	setCacheHeader(w, out)
	_ = json.NewEncoder(w).Encode(struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}{r.client, page})
	return out, nil
}

// tagPage returns up to limit tags of all (sorted; every one when limit < 0) that sort after
// last, and whether more follow the page. An empty page is a valid answer.
func tagPage(all []string, last string, limit int) (page []string, more bool) {
	start := 0
	if last != "" {
		start, _ = slices.BinarySearch(all, last)
		if start < len(all) && all[start] == last {
			start++
		}
	}
	rest := all[start:]
	if limit < 0 || limit >= len(rest) {
		return slices.Clone(rest), false
	}
	return slices.Clone(rest[:limit]), true
}

// tags lists the upstream repository's tags (every page, merged, in lexical order), as
// upstream.Remote.Tags answers them: fetched now ("miss"), joined to a fetch another request
// started ("coalesced"), or kept from a fetch less than Options.TagTTL ago ("hit"); when the
// upstream fails, times out or answers 429/5xx, the tags stored locally ("stale"). The slice
// is shared: callers must not modify it.
//
// An offline upstream's listing (offline.go) is the tags stored ("hit"), 404 NAME_UNKNOWN when
// the cache holds none of the repository.
//
// Errors: 404 NAME_UNKNOWN for a repository the upstream does not know, a 502 UNKNOWN naming
// the bound when the listing is past one of upstream.Remote.Tags' (pages, bytes, tags), else the
// upstream's failure as upstreamAPIError answers it.
func (r *repository) tags(ctx context.Context) ([]string, outcome, error) {
	if r.up.Offline { // the tags stored (offline.go)
		local, err := r.local.Tags(ctx).All(ctx)
		if err != nil {
			return nil, outcome{}, r.offlineMiss(errcode.ErrorCodeNameUnknown, "repository "+r.client)
		}
		slices.Sort(local)
		return local, outcome{cache: mirrorapi.CacheHit}, nil
	}
	list, err := r.up.remote.Tags(ctx, r.repo)
	if err == nil {
		out := outcome{cache: mirrorapi.CacheMiss, tier: list.Tier}
		switch {
		case list.Kept:
			out.cache = mirrorapi.CacheHit
		case list.Joined:
			out.cache = mirrorapi.CacheCoalesced
		}
		return list.Tags, out, nil
	}
	var ue *upstream.Error
	switch {
	case errors.Is(err, upstream.ErrTagListTooLarge):
		return nil, outcome{}, badGateway(err)
	case errors.As(err, &ue) && ue.NotFound():
		return nil, outcome{}, codeError(errcode.ErrorCodeNameUnknown, map[string]string{"name": r.client})
	case errors.As(err, &ue) && !ue.Unavailable():
		return nil, outcome{}, upstreamAPIError(err)
	}
	if local, lerr := r.local.Tags(ctx).All(ctx); lerr == nil {
		slices.Sort(local)
		return local, outcome{cache: mirrorapi.CacheStale}, nil
	}
	return nil, outcome{}, upstreamAPIError(err)
}
