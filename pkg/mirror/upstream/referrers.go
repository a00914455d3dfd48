package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// KindReferrers is the kind label of the upstream metrics for a referrers listing.
const KindReferrers = "referrers"

// Bounds of one referrers listing (Remote.Referrers), whatever the upstream sends. A listing is
// the upstream's answer to GET /v2/<name>/referrers/<digest> plus the pages its Link headers
// lead to (OCI distribution spec, "Listing Referrers"). The merged list is one image index the
// cache stores and answers with, so it is bounded like a manifest.
const (
	// MaxReferrersPages bounds the pages, so the upstream requests, of one listing.
	MaxReferrersPages = 64
	// MaxReferrersBytes bounds the bodies of all pages of one listing together, in bytes: a
	// manifest's bound (MaxManifestBytes, 4 MiB), about 15,000 descriptors of referrers.
	MaxReferrersBytes = MaxManifestBytes
	// ReferrersTimeout bounds one listing as a whole; each page is bounded by the upstream
	// timeout as well. The fetch is shared, so it does not end with the request that started it.
	ReferrersTimeout = 2 * time.Minute
)

// ErrReferrersTooLarge marks a listing past MaxReferrersPages or MaxReferrersBytes; the error
// wrapping it names which.
var ErrReferrersTooLarge = fmt.Errorf("referrers list larger than nodecache lists (at most %d pages, %d MiB)",
	MaxReferrersPages, MaxReferrersBytes>>20)

// ErrNotReferrers marks an upstream's 200 answer to a referrers request whose body is not an
// image index.
var ErrNotReferrers = errors.New("referrers answer is not an image index")

// The OCI error codes of a referrers 404 that Referrers passes on (the *Error of that 404 wraps
// one): the upstream serves the API and does not know the repository (or, for MANIFEST_UNKNOWN,
// refuses the subject).
var (
	ErrNameUnknown     = errors.New("NAME_UNKNOWN")
	ErrManifestUnknown = errors.New("MANIFEST_UNKNOWN")
)

// ReferrerList is a subject's referrers as Referrers answers them.
type ReferrerList struct {
	// Manifests are the descriptors of the referrers, each digest once, in the order the
	// upstream listed them, byte for byte as it sent each (artifactType, annotations and
	// fields nodecache does not know kept). Empty when NoAPI.
	Manifests []json.RawMessage
	// NoAPI reports that the upstream does not serve the referrers API: its answer was a 404
	// whose body names no NAME_UNKNOWN or MANIFEST_UNKNOWN (a plain-text 404, distribution's
	// "404 page not found", or another code such as UNSUPPORTED or METHOD_UNKNOWN). The
	// caller then reads the referrers tag schema (OCI distribution spec, "Referrers Tag
	// Schema").
	NoAPI bool
	// Joined reports that this call joined a fetch another call had started.
	Joined bool
	// Tier is where the fetch was answered (TierShared, TierUpstream).
	Tier string
}

// Referrers lists the referrers of manifest subject in repo (OCI distribution spec, "Listing
// Referrers"): the first page unfiltered (no artifactType is sent: the caller keeps the whole
// list and filters it), then every page its Link header (rel="next") points to, merged, each
// digest once. Only the query of a Link is used: the next page is always asked of the same
// repository on the configured upstream. Concurrent calls for the same subject share one fetch,
// bounded by ReferrersTimeout, MaxReferrersPages and MaxReferrersBytes, which goes on when the
// caller that started it goes away and stops when the Fetcher is closed.
//
// Errors: an *Error for an upstream failure: NotFound for a 404 naming NAME_UNKNOWN or
// MANIFEST_UNKNOWN (the repository, as the upstream says, is unknown), Unavailable for no
// answer, a timeout, 429 and 5xx; an error wrapping ErrReferrersTooLarge past a bound, or
// ErrNotReferrers for a 200 whose body is not an image index.
func (r *Remote) Referrers(ctx context.Context, repo string, subject digest.Digest) (ReferrerList, error) {
	leader := false
	v, err, _ := r.f.flight.Do("referrers\x00"+r.Name+"\x00"+repo+"\x00"+subject.String(), func() (any, error) {
		leader = true
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReferrersTimeout)
		defer cancel()
		defer context.AfterFunc(r.f.fillCtx, cancel)()
		ctx, tier := trackTier(ctx)
		start := time.Now()
		list, err := r.listReferrers(ctx, repo, subject)
		r.f.done(r.Name, tier(), KindReferrers, start, err) // duration and health (health.go)
		list.Tier = tier()
		return list, err
	})
	if err != nil {
		return ReferrerList{}, err
	}
	l := v.(ReferrerList)
	l.Joined = !leader
	return l, nil
}

// listReferrers is the fetch of Referrers.
func (r *Remote) listReferrers(ctx context.Context, repo string, subject digest.Digest) (ReferrerList, error) {
	var (
		out    ReferrerList
		seen   = map[digest.Digest]bool{}
		budget = int64(MaxReferrersBytes)
		query  = ""
	)
	for page := 0; ; page++ {
		if page == MaxReferrersPages {
			return ReferrerList{}, r.referrersTooLarge(repo, subject, fmt.Sprintf("more than %d pages", MaxReferrersPages))
		}
		descs, next, read, noAPI, err := r.referrersPage(ctx, repo, subject, query, budget)
		if err != nil {
			return ReferrerList{}, err
		}
		if noAPI {
			if page > 0 { // a page the upstream itself pointed to
				return ReferrerList{}, &Error{Upstream: r.Name, Op: "GET " + repo + "/referrers/" + subject.String() + query, Status: http.StatusNotFound}
			}
			return ReferrerList{NoAPI: true}, nil
		}
		budget -= read
		out.Manifests = appendUnique(out.Manifests, seen, descs)
		if next == "" {
			return out, nil
		}
		query = next
	}
}

// referrersTooLarge is the error of a listing past the bound what describes.
func (r *Remote) referrersTooLarge(repo string, subject digest.Digest, what string) error {
	return fmt.Errorf("upstream %s: referrers of %s@%s: %s: %w", r.Name, repo, subject, what, ErrReferrersTooLarge)
}

// referrersPage fetches one referrers page (query "" or "?…" as a Link gave it), reading at most
// budget bytes of its body, and returns its descriptors, the query of the next page ("" when
// none was announced), how many bytes of body it read, and noAPI for a 404 that says the
// upstream does not serve the API.
func (r *Remote) referrersPage(ctx context.Context, repo string, subject digest.Digest, query string, budget int64) (descs []json.RawMessage, next string, read int64, noAPI bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.f.exchangeTimeout())
	defer cancel()
	op := "GET " + repo + "/referrers/" + subject.String() + query
	resp, err := r.client.do(ctx, http.MethodGet, repo, "referrers", subject.String()+query,
		http.Header{"Accept": {mirrorapi.MediaTypeOCIIndex}}, http.StatusOK, http.StatusNotFound)
	if err != nil {
		return nil, "", 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		switch errorCode(body) {
		case "NAME_UNKNOWN":
			return nil, "", 0, false, &Error{Upstream: r.Name, Op: op, Status: http.StatusNotFound, Err: ErrNameUnknown}
		case "MANIFEST_UNKNOWN":
			return nil, "", 0, false, &Error{Upstream: r.Name, Op: op, Status: http.StatusNotFound, Err: ErrManifestUnknown}
		}
		return nil, "", 0, true, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, budget+1))
	if err != nil {
		return nil, "", 0, false, r.client.classify(op, err)
	}
	if int64(len(body)) > budget {
		return nil, "", 0, false, r.referrersTooLarge(repo, subject, fmt.Sprintf("more than %d bytes of pages", MaxReferrersBytes))
	}
	var index struct {
		Manifests []json.RawMessage `json:"manifests"`
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&index); err != nil {
		return nil, "", 0, false, fmt.Errorf("upstream %s: referrers of %s@%s: %w: %w", r.Name, repo, subject, ErrNotReferrers, err)
	}
	return index.Manifests, nextQuery(resp.Header.Values("Link")), int64(len(body)), false, nil
}

// referrersTag is the tag of the key ReferrersFresh keeps: no tag can hold "@" (OCI
// distribution spec, tag grammar), so it is never a tag's key.
func referrersTag(subject digest.Digest) string { return "@referrers/" + subject.String() }

// ReferrersFresh reports whether the referrers of subject in repo of upstream were listed by the
// upstream less than TagTTL ago (the freshness of a tag, TagFresh, with the same clock).
func (f *Fetcher) ReferrersFresh(upstream, repo string, subject digest.Digest) bool {
	return f.TagFresh(upstream, repo, referrersTag(subject))
}

// MarkReferrersFresh records that the referrers of subject in repo of upstream were listed by the
// upstream now (a no-op when TagTTL is 0).
func (f *Fetcher) MarkReferrersFresh(upstream, repo string, subject digest.Digest) {
	f.MarkTagFresh(upstream, repo, referrersTag(subject))
}

// UniqueDescriptors returns the descriptors of list (raw JSON, each an OCI descriptor) with one
// entry per digest, the first, and without entries that are no descriptor (nothing a client
// could fetch): the referrers API lists each referrer once (OCI distribution spec, "Listing
// Referrers"), while an index kept by the referrers tag schema is edited by every client that
// pushes a referrer and can list one twice.
func UniqueDescriptors(list []json.RawMessage) []json.RawMessage {
	return appendUnique(make([]json.RawMessage, 0, len(list)), map[digest.Digest]bool{}, list)
}

// appendUnique appends to out the descriptors of list whose digest seen does not hold, and notes
// them in seen.
func appendUnique(out []json.RawMessage, seen map[digest.Digest]bool, list []json.RawMessage) []json.RawMessage {
	for _, d := range list {
		var desc struct {
			Digest digest.Digest `json:"digest"`
		}
		if json.Unmarshal(d, &desc) != nil || desc.Digest.Validate() != nil || seen[desc.Digest] {
			continue
		}
		seen[desc.Digest] = true
		out = append(out, d)
	}
	return out
}
