package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Where a referrers list came from (storedReferrers.Source).
const (
	referrersFromAPI = "api"        // the upstream's referrers API
	referrersFromTag = "tag-schema" // the referrers tag schema, for an upstream without the API
)

// storedReferrers is a referrers list as the cache stores it (cache.ReferrersPath): the whole
// list, unfiltered, as the upstream last gave it.
type storedReferrers struct {
	// Subject is the manifest whose referrers these are (checked on every read).
	Subject digest.Digest `json:"subject"`
	// Source is referrersFromAPI or referrersFromTag.
	Source string `json:"source"`
	// Listed is when the upstream gave the list (RFC 3339, UTC).
	Listed time.Time `json:"listed"`
	// Manifests are the referrers' descriptors, byte for byte as the upstream listed them.
	Manifests []json.RawMessage `json:"manifests"`
}

// serveReferrers answers GET and HEAD /v2/<name>/referrers/<digest> (OCI distribution spec,
// "Listing Referrers"): an image index (Content-Type application/vnd.oci.image.index.v1+json)
// listing the descriptors of the manifests whose subject is the digest, in one page, from the
// list referrers gives; with ?artifactType=<type> only those of that artifactType, and the
// header OCI-Filters-Applied: artifactType. HEAD gets the headers of GET (the spec defines GET;
// HEAD answers as it does for manifests).
//
// Errors: a *readError, nothing written: 400 DIGEST_INVALID for a digest that does not parse;
// else referrers' errors.
func (r *repository) serveReferrers(ctx context.Context, w http.ResponseWriter, req *http.Request, ref string) (outcome, error) {
	subject, err := digest.Parse(ref)
	if err != nil {
		return outcome{}, codeError(errcode.ErrorCodeDigestInvalid, err)
	}
	list, out, err := r.referrers(ctx, subject)
	if err != nil {
		return out, err
	}
	manifests := list
	types := req.URL.Query()["artifactType"]
	if len(types) > 0 {
		manifests = filterArtifactType(list, types)
		w.Header().Set("OCI-Filters-Applied", "artifactType")
	}
	body, err := json.Marshal(struct {
		SchemaVersion int               `json:"schemaVersion"`
		MediaType     string            `json:"mediaType"`
		Manifests     []json.RawMessage `json:"manifests"`
	}{2, mirrorapi.MediaTypeOCIIndex, manifests})
	if err != nil {
		return out, codeError(errcode.ErrorCodeUnknown, err)
	}
	w.Header().Set("Content-Type", mirrorapi.MediaTypeOCIIndex)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	setCacheHeader(w, out)
	w.WriteHeader(http.StatusOK)
	if req.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	return out, nil
}

// filterArtifactType returns the descriptors of list whose artifactType is one of types.
func filterArtifactType(list []json.RawMessage, types []string) []json.RawMessage {
	out := []json.RawMessage{}
	for _, d := range list {
		var desc struct {
			ArtifactType string `json:"artifactType"`
		}
		if json.Unmarshal(d, &desc) == nil && slices.Contains(types, desc.ArtifactType) {
			out = append(out, d)
		}
	}
	return out
}

// referrers returns the descriptors of the referrers of manifest subject, unfiltered: the list
// stored when Options.TagTTL says it is fresh ("hit"), else listed again by the upstream
// ("revalidated"; "miss" when none was stored; "coalesced" when joined to a listing another
// request started) and stored when the subject manifest is cached (cache.ReferrersPath: the list
// shares its lifetime). An upstream without the referrers API (upstream.ReferrerList.NoAPI) is
// read through the referrers tag schema: the image index tagged <alg>-<hex> (pulled through like
// any tag), its manifests the list; no such tag is an empty list. When the upstream fails, times
// out or answers 429/5xx the stored list is the answer ("stale").
//
// An offline upstream's list (offline.go) is the one stored ("hit").
//
// Errors: never an empty list for a failure (an empty list tells a policy engine that nothing
// is signed): 503 UNAVAILABLE when the upstream failed or is offline and nothing is stored; 404
// NAME_UNKNOWN or MANIFEST_UNKNOWN as the upstream answered them; 502 for a list past the
// bounds of upstream.Referrers or an answer that is not an image index; else the upstream's
// failure as upstreamAPIError answers it.
func (r *repository) referrers(ctx context.Context, subject digest.Digest) ([]json.RawMessage, outcome, error) {
	stored, have := r.storedReferrers(ctx, subject)
	if r.up.Offline {
		if have {
			return stored.Manifests, outcome{cache: mirrorapi.CacheHit}, nil
		}
		return nil, outcome{}, &readError{err: errcode.ErrorCodeUnavailable.WithMessage(fmt.Sprintf(
			"the referrers of %s in %s are not in the cache, and upstream %s is offline (never asked: --upstream %s=offline or --offline); "+
				"503, not an empty list, which would say that nothing refers to it", subject, r.repo, r.up.Name, r.up.Name))}
	}
	if have && r.fetch.ReferrersFresh(r.up.Name, r.repo, subject) {
		return stored.Manifests, outcome{cache: mirrorapi.CacheHit}, nil
	}
	list, out, err := r.listReferrers(ctx, subject)
	if err == nil {
		if have && out.cache == mirrorapi.CacheMiss {
			out.cache = mirrorapi.CacheRevalidated // a list was stored: the upstream confirmed or replaced it
		}
		r.storeReferrers(ctx, subject, list)
		return list.Manifests, out, nil
	}
	var (
		ue *upstream.Error
		re *readError
	)
	switch {
	case errors.Is(err, upstream.ErrReferrersTooLarge), errors.Is(err, upstream.ErrNotReferrers):
		return nil, outcome{}, badGateway(err)
	case errors.As(err, &ue) && ue.NotFound():
		code := errcode.ErrorCodeNameUnknown
		if errors.Is(err, upstream.ErrManifestUnknown) {
			code = errcode.ErrorCodeManifestUnknown
		}
		return nil, outcome{}, &readError{err: code.WithMessage(ue.Error())}
	case errors.As(err, &ue) && !ue.Unavailable(),
		errors.As(err, &re) && re.httpStatus() < 500 && re.httpStatus() != http.StatusTooManyRequests:
		return nil, outcome{}, upstreamAPIError(err)
	}
	if have {
		// Debug, not Warn: a client polling a failing upstream would log a warning a request; the
		// failure with its cause is logged once a minute (upstream health), the access line says
		// cache=stale.
		r.log.Debug().Str("upstream", r.up.Name).Str("repository", r.repo).Str("subject", subject.String()).
			Err(err).Msg("upstream failed; serving the cached referrers list")
		return stored.Manifests, outcome{cache: mirrorapi.CacheStale}, nil
	}
	e := upstreamAPIError(err)
	if e.httpStatus() == http.StatusServiceUnavailable {
		e.err.Message = fmt.Sprintf("referrers of %s: %s; nothing cached: 503, not an empty list, which would say that nothing refers to it",
			subject, e.err.Message)
	}
	return nil, outcome{}, e
}

// listReferrers asks the upstream for the referrers of subject, through the referrers tag schema
// when it does not serve the API.
//
// Errors: upstream.Referrers', the tag schema's as tag and manifest give them.
func (r *repository) listReferrers(ctx context.Context, subject digest.Digest) (storedReferrers, outcome, error) {
	ans, err := r.up.remote.Referrers(ctx, r.repo, subject)
	if err != nil {
		return storedReferrers{}, outcome{}, err
	}
	out := outcome{cache: mirrorapi.CacheMiss, tier: ans.Tier}
	if ans.Joined {
		out.cache = mirrorapi.CacheCoalesced
	}
	list := storedReferrers{Subject: subject, Source: referrersFromAPI, Listed: time.Now().UTC(), Manifests: ans.Manifests}
	if ans.NoAPI {
		var tagOut outcome
		list.Source = referrersFromTag
		list.Manifests, tagOut, err = r.referrersByTag(ctx, subject)
		if err != nil {
			return storedReferrers{}, outcome{}, err
		}
		out = out.and(tagOut)
	}
	if list.Manifests == nil {
		list.Manifests = []json.RawMessage{}
	}
	return list, out, nil
}

// referrersTagOf is the tag of the referrers tag schema (OCI distribution spec, "Referrers Tag
// Schema"): <alg>-<ref>, the algorithm truncated to 32 characters and the encoded digest to 64.
func referrersTagOf(subject digest.Digest) string {
	alg, enc := subject.Algorithm().String(), subject.Encoded()
	return alg[:min(len(alg), 32)] + "-" + enc[:min(len(enc), 64)]
}

// referrersByTag reads the referrers of subject from the referrers tag schema: the manifests of
// the image index tagged referrersTagOf(subject), read or filled like any tag and manifest (so
// the index is cached as any pulled image); none when the upstream has no such tag, or when it
// names something other than an OCI image index (logged).
//
// Errors: tag's and manifest's, but an unknown tag.
func (r *repository) referrersByTag(ctx context.Context, subject digest.Digest) ([]json.RawMessage, outcome, error) {
	tag := referrersTagOf(subject)
	desc, out, pending, err := r.tag(ctx, tag)
	var unknown distribution.ErrTagUnknown
	if errors.As(err, &unknown) {
		return []json.RawMessage{}, out, nil
	}
	if err != nil {
		return nil, out, err
	}
	if !pending {
		tag = ""
	}
	man, manOut, err := r.manifest(ctx, desc.Digest, tag)
	out = out.and(manOut)
	if err != nil {
		return nil, out, err
	}
	mt, payload, err := man.Payload()
	if err != nil {
		return nil, out, fmt.Errorf("read manifest %s: %w", desc.Digest, err)
	}
	var index struct {
		Manifests []json.RawMessage `json:"manifests"`
	}
	if mt != mirrorapi.MediaTypeOCIIndex || json.Unmarshal(payload, &index) != nil {
		r.log.Warn().Str("upstream", r.up.Name).Str("repository", r.repo).Str("tag", tag).Str("media_type", mt).
			Msg("the referrers tag schema's tag names no OCI image index; answering no referrers")
		return []json.RawMessage{}, out, nil
	}
	return upstream.UniqueDescriptors(index.Manifests), out, nil
}

// storedReferrers reads the list stored for subject; ok is false when none is (a list that does
// not parse or names another subject is deleted, and listed again).
func (r *repository) storedReferrers(ctx context.Context, subject digest.Digest) (storedReferrers, bool) {
	b, ok := r.cache.Referrers(ctx, r.storageName(), subject)
	if !ok {
		return storedReferrers{}, false
	}
	var s storedReferrers
	if err := json.Unmarshal(b, &s); err != nil || s.Subject != subject || s.Manifests == nil {
		r.log.Warn().Err(err).Str("repository", r.repo).Str("subject", subject.String()).
			Msg("stored referrers list unusable; deleting it")
		r.cache.DropReferrers(ctx, r.storageName(), subject)
		return storedReferrers{}, false
	}
	return s, true
}

// storeReferrers stores list and marks it fresh when the subject manifest is cached; otherwise
// (or when the write fails, logged) it is only answered.
func (r *repository) storeReferrers(ctx context.Context, subject digest.Digest, list storedReferrers) {
	b, err := json.Marshal(list)
	if err == nil {
		err = r.cache.PutReferrers(context.WithoutCancel(ctx), r.storageName(), subject, b)
	}
	switch {
	case errors.Is(err, cache.ErrNoSubject):
		r.log.Debug().Str("repository", r.repo).Str("subject", subject.String()).
			Msg("referrers list not stored: its subject manifest is not cached")
	case err != nil:
		r.log.Warn().Err(err).Str("repository", r.repo).Str("subject", subject.String()).Msg("store referrers list")
	default:
		r.fetch.MarkReferrersFresh(r.up.Name, r.repo, subject)
	}
}
