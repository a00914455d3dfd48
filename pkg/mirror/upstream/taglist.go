package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Bounds of one tag listing (Remote.Tags), whatever the upstream sends. A listing is the
// upstream's answer to GET /v2/<name>/tags/list plus the pages its Link headers lead to (OCI
// distribution spec, "Content Discovery / Listing Tags"). The spec bounds neither the tags of a
// repository nor the pages of a listing, so without these one client request could cost an
// unbounded number of upstream requests and bytes, all held in memory until the answer is sent.
const (
	// MaxTagPages bounds the pages, so the upstream requests, of one listing: 100, as before
	// the other bounds. That is 5,000 to 10,000 tags at the 50 to 100 a page that Docker Hub
	// and quay.io send when asked without n; a registry that answers in one page is bounded
	// by the bytes and tags below instead.
	MaxTagPages = 100
	// MaxTagPageBytes bounds the body of one page, in bytes: 4 MiB.
	MaxTagPageBytes = 4 << 20
	// MaxTagListBytes bounds the bodies of all pages of one listing together, in bytes: 8 MiB.
	// The largest public repositories have tens of thousands of tags, mostly versions of 10
	// to 40 characters: about 1 MiB as JSON. 8 MiB still holds MaxTagListTags tags of 80
	// characters.
	MaxTagListBytes = 8 << 20
	// MaxTagListTags bounds the distinct tags of one listing: 100,000. A tag is 1 to 128
	// characters (the spec's tag rule, [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}), so MaxTagListBytes
	// alone would let through two million short ones; each costs a string header and an
	// entry of the deduplication set besides its bytes, and the answer holds them all.
	MaxTagListTags = 100_000
	// TagListTimeout bounds one listing as a whole, in time; each of its pages is bounded by
	// the upstream timeout as well. A listing of MaxTagPages pages ends within it when a page
	// takes under 1.2 s. It matters because the fetch is shared, so it does not end with the
	// request that started it (see Tags).
	TagListTimeout = 2 * time.Minute
)

// Bounds of the listings kept for Options.TagTTL (see Remote.Tags).
const (
	// MaxKeptTagLists bounds how many listings are kept.
	MaxKeptTagLists = 1024
	// MaxKeptTagListBytes bounds the memory of the kept listings, in bytes as tagListSize
	// counts them: 32 MiB, at least three listings at every bound above, or a thousand of a
	// few hundred tags.
	MaxKeptTagListBytes = 32 << 20
)

// ErrTagListTooLarge marks a listing past one of the bounds of MaxTagPages, MaxTagPageBytes,
// MaxTagListBytes and MaxTagListTags; the error wrapping it names which.
var ErrTagListTooLarge = fmt.Errorf("tag list larger than nodecache lists (at most %d pages, %d MiB of pages, %d tags)",
	MaxTagPages, MaxTagListBytes>>20, MaxTagListTags)

// TagList is a repository's tags as Tags answers them.
type TagList struct {
	// Tags are the tags, each once, in lexical order. The slice is shared with concurrent
	// callers and the kept listing: read it, never modify it.
	Tags []string
	// Kept reports that the listing is one fetched less than Options.TagTTL ago (no upstream
	// request); Joined that this call joined a fetch another call had started.
	Kept, Joined bool
	// Tier is where the fetch was answered (TierShared, TierUpstream); "" when Kept.
	Tier string
}

// Tags lists the upstream repository's tags (OCI distribution spec, "Content Discovery /
// Listing Tags"): the first page as the upstream chooses it, then every page its Link header
// (rel="next") points to, merged, deduplicated and in lexical order. Only the query of a Link
// is used: the next page is always asked of the same repository on the configured upstream.
//
// A listing is bounded as a whole: at most MaxTagPages pages, MaxTagPageBytes of body each and
// MaxTagListBytes together, MaxTagListTags tags, TagListTimeout (and the upstream timeout for
// each page). Concurrent calls for the same upstream and repository share one fetch, which
// goes on when the caller that started it goes away and stops when the Fetcher is closed.
// With Options.TagTTL, a listing is kept and answers the calls that come less than TagTTL
// after its fetch started, as Options.Clock tells; no goroutine expires it: an expired listing
// goes when it is next asked for or another is kept, and the oldest go first past
// MaxKeptTagLists or MaxKeptTagListBytes. Failures are not kept.
//
// Errors: an *Error for an upstream failure (NotFound for an unknown repository, Unavailable
// past TagListTimeout), an error wrapping ErrTagListTooLarge past a bound, or a body that is
// not a tag list.
func (r *Remote) Tags(ctx context.Context, repo string) (TagList, error) {
	key := r.Name + "\x00" + repo
	ttl := r.f.opts.TagTTL
	if tags, ok := r.f.tagLists.get(key, r.f.opts.Clock(), ttl); ok {
		return TagList{Tags: tags, Kept: true}, nil
	}
	leader := false
	v, err, _ := r.f.flight.Do("tags\x00"+key, func() (any, error) {
		leader = true
		start := r.f.opts.Clock()
		// A fetch that ended between the get above and this one kept its listing.
		if tags, ok := r.f.tagLists.get(key, start, ttl); ok {
			return TagList{Tags: tags, Kept: true}, nil
		}
		tctx, tier := trackTier(ctx)
		tags, err := r.listTags(tctx, repo)
		if err != nil {
			return TagList{}, err
		}
		r.f.tagLists.put(key, tags, start, r.f.opts.Clock(), ttl)
		return TagList{Tags: tags, Tier: tier()}, nil
	})
	if err != nil {
		return TagList{}, err
	}
	l := v.(TagList)
	l.Joined = !leader
	return l, nil
}

// listTags is the fetch of Tags, detached from ctx's cancellation and bounded by
// TagListTimeout and the Fetcher's Close.
func (r *Remote) listTags(ctx context.Context, repo string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), TagListTimeout)
	defer cancel()
	defer context.AfterFunc(r.f.fillCtx, cancel)()
	ctx, tier := trackTier(ctx)
	tags, err := r.listPages(ctx, repo)
	r.f.health.record(r.Name, tier(), err)
	return tags, err
}

// listPages is listTags' fetch of every page.
func (r *Remote) listPages(ctx context.Context, repo string) ([]string, error) {
	seen := map[string]struct{}{}
	var out []string
	budget := int64(MaxTagListBytes)
	query := ""
	for page := 0; ; page++ {
		if page == MaxTagPages {
			return nil, r.tooLarge(repo, fmt.Sprintf("more than %d pages", MaxTagPages))
		}
		tags, next, read, err := r.tagPage(ctx, repo, query, budget)
		if err != nil {
			return nil, err
		}
		budget -= read
		for _, t := range tags {
			if _, ok := seen[t]; ok {
				continue
			}
			if len(out) == MaxTagListTags {
				return nil, r.tooLarge(repo, fmt.Sprintf("more than %d tags", MaxTagListTags))
			}
			seen[t] = struct{}{}
			out = append(out, t)
		}
		if next == "" {
			break
		}
		query = next
	}
	slices.Sort(out)
	return out, nil
}

// tooLarge is the error of a listing of repo past the bound what describes.
func (r *Remote) tooLarge(repo, what string) error {
	return fmt.Errorf("upstream %s: tags of %s: %s: %w", r.Name, repo, what, ErrTagListTooLarge)
}

// tagPage fetches one tags/list page (query "" or "?n=…&last=…" as a Link gave it), reading at
// most MaxTagPageBytes of its body and at most budget bytes, and returns its tags, the query of
// the next page ("" when the upstream announced none) and how many bytes of body it read.
//
// Errors: an *Error for an upstream failure, an error wrapping ErrTagListTooLarge for a body
// past either bound, an error for a body that is not a tag list.
func (r *Remote) tagPage(ctx context.Context, repo, query string, budget int64) (tags []string, next string, read int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.f.exchangeTimeout())
	defer cancel()
	resp, err := r.client.do(ctx, http.MethodGet, repo, "tags", "list"+query, nil, http.StatusOK)
	if err != nil {
		return nil, "", 0, err
	}
	defer resp.Body.Close()
	limit := min(int64(MaxTagPageBytes), budget)
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, "", 0, r.client.classify("GET "+repo+"/tags/list"+query, err)
	}
	if int64(len(body)) > limit {
		if limit == MaxTagPageBytes {
			return nil, "", 0, r.tooLarge(repo, fmt.Sprintf("a page of more than %d bytes", MaxTagPageBytes))
		}
		return nil, "", 0, r.tooLarge(repo, fmt.Sprintf("more than %d bytes of pages", MaxTagListBytes))
	}
	var page struct {
		Tags []string `json:"tags"`
	}
	// A decoder, not Unmarshal: what follows the document is ignored, as it always was.
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&page); err != nil {
		return nil, "", 0, fmt.Errorf("upstream %s: decode tags of %s: %w", r.Name, repo, err)
	}
	return page.Tags, nextQuery(resp.Header.Values("Link")), int64(len(body)), nil
}

// nextQuery returns "?<query>" of the rel="next" target among Link header values (RFC 8288),
// "" when there is none or it has no query.
func nextQuery(links []string) string {
	for _, v := range links {
		for _, l := range strings.Split(v, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(l), ";")
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			isNext := false
			for _, p := range strings.Split(params, ";") {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(k, "rel") && slices.Contains(strings.Fields(strings.Trim(v, `"`)), "next") {
					isNext = true
				}
			}
			if !isNext {
				continue
			}
			u, err := url.Parse(target[1 : len(target)-1])
			if err != nil || u.RawQuery == "" {
				return ""
			}
			return "?" + u.RawQuery
		}
	}
	return ""
}

// tagListCache keeps listings for Options.TagTTL in a map bounded by entries and bytes, judged
// against the clock on each use: an expired listing goes when it is asked for or when another
// is put; past a bound the oldest go first (they expire first). It starts no goroutine. The
// zero value is ready for use; its methods are safe for concurrent use.
type tagListCache struct {
	mu      sync.Mutex
	entries map[string]keptTagList
	bytes   int64
	// maxEntries and maxBytes are the bounds; 0 means MaxKeptTagLists and
	// MaxKeptTagListBytes (tests set smaller ones).
	maxEntries int
	maxBytes   int64
}

// keptTagList is one kept listing: its tags, when its fetch started, its size by tagListSize.
type keptTagList struct {
	tags []string
	at   time.Time
	size int64
}

// tagListSize is what the cache counts for tags kept under key, in bytes: the strings' bytes,
// a 16-byte string header for each tag and the key, and 64 bytes for the entry itself.
func tagListSize(key string, tags []string) int64 {
	n := int64(len(key)) + 16*int64(len(tags)+1) + 64
	for _, t := range tags {
		n += int64(len(t))
	}
	return n
}

// fresh reports whether a listing whose fetch started at at is younger than ttl at now. A
// listing from the future (the clock went back) is not.
func fresh(at, now time.Time, ttl time.Duration) bool {
	age := now.Sub(at)
	return age >= 0 && age < ttl
}

// get returns the listing kept under key when it is fresh at now; an expired one is dropped.
func (c *tagListCache) get(key string, now time.Time, ttl time.Duration) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	if !fresh(e.at, now, ttl) {
		c.drop(key)
		return nil, false
	}
	return e.tags, true
}

// put keeps tags under key, fetched from at, unless ttl is 0, the listing is no longer fresh at
// now, or it is larger than the byte bound alone. It first drops what expired by now, then the
// oldest listings until the new one fits both bounds.
func (c *tagListCache) put(key string, tags []string, at, now time.Time, ttl time.Duration) {
	maxEntries, maxBytes := c.maxEntries, c.maxBytes
	if maxEntries <= 0 {
		maxEntries = MaxKeptTagLists
	}
	if maxBytes <= 0 {
		maxBytes = MaxKeptTagListBytes
	}
	size := tagListSize(key, tags)
	if ttl <= 0 || !fresh(at, now, ttl) || size > maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]keptTagList{}
	}
	c.drop(key)
	for k, e := range c.entries {
		if !fresh(e.at, now, ttl) {
			c.drop(k)
		}
	}
	for len(c.entries) > 0 && (len(c.entries) >= maxEntries || c.bytes+size > maxBytes) {
		oldest, first := "", true
		for k, e := range c.entries {
			if first || e.at.Before(c.entries[oldest].at) {
				oldest, first = k, false
			}
		}
		c.drop(oldest)
	}
	c.entries[key] = keptTagList{tags: tags, at: at, size: size}
	c.bytes += size
}

// drop forgets the listing under key, if any. c.mu is held.
func (c *tagListCache) drop(key string) {
	if e, ok := c.entries[key]; ok {
		delete(c.entries, key)
		c.bytes -= e.size
	}
}

// stats reports how many listings are kept and their size by tagListSize.
func (c *tagListCache) stats() (n int, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}
