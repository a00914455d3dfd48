package mirror

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/manifest/manifestlist"
	"github.com/distribution/distribution/v3/manifest/ocischema"
	"github.com/distribution/distribution/v3/manifest/schema2"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/distribution/distribution/v3/registry/storage"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// serveManifest answers GET and HEAD /v2/<name>/manifests/<reference> (OCI distribution spec,
// "Pulling manifests"): a tag is resolved (tag), the manifest is read from storage or filled
// from the upstream (manifest), and the answer follows the rules of distribution's manifest
// handler (registry/handlers/manifests.go, v3.1.2), which nodecache answered with before and
// TestDifferential holds it to: 304 for a matching If-None-Match; an OCI manifest or index only
// to a client whose Accept lists its media type (404 MANIFEST_UNKNOWN otherwise); a Docker
// manifest list asked for by tag by a client that does not accept lists is answered with its
// linux/amd64 manifest; HEAD gets the headers of GET.
//
// Errors: a *readError, nothing written.
func (r *repository) serveManifest(ctx context.Context, w http.ResponseWriter, req *http.Request, ref string) (outcome, error) {
	var (
		out outcome
		tag string
	)
	dgst, err := digest.Parse(ref)
	if err != nil {
		if strings.ContainsRune(ref, ':') {
			return out, codeError(errcode.ErrorCodeDigestInvalid, err)
		}
		tag = ref
		desc, tagOut, pending, err := r.tag(ctx, tag)
		out = out.and(tagOut)
		if err != nil {
			var unknown distribution.ErrTagUnknown
			if errors.As(err, &unknown) {
				return out, codeError(errcode.ErrorCodeManifestUnknown, unknown)
			}
			return out, asReadError(err)
		}
		dgst = desc.Digest
		if !pending {
			tag = "" // nothing to store once the manifest is
		}
	}
	if etagMatch(req, dgst.String()) {
		setCacheHeader(w, out)
		w.WriteHeader(http.StatusNotModified)
		return out, nil
	}
	man, manOut, err := r.manifest(ctx, dgst, tag)
	out = out.and(manOut)
	if err != nil {
		return out, manifestError(err)
	}
	supports := acceptedManifests(req)
	list, isList := man.(*manifestlist.DeserializedManifestList)
	switch {
	case isOCIManifest(man) && !supports[v1.MediaTypeImageManifest]:
		return out, &readError{err: errcode.ErrorCodeManifestUnknown.WithMessage("OCI manifest found, but accept header does not support OCI manifests")}
	case isList && list.MediaType == v1.MediaTypeImageIndex && !supports[v1.MediaTypeImageIndex]:
		return out, &readError{err: errcode.ErrorCodeManifestUnknown.WithMessage("OCI index found, but accept header does not support OCI indexes")}
	case isList && list.MediaType == manifestlist.MediaTypeManifestList && ref != dgst.String() && !supports[manifestlist.MediaTypeManifestList]:
		var childOut outcome
		man, dgst, childOut, err = r.defaultPlatformManifest(ctx, list, supports)
		out = out.and(childOut)
		if err != nil {
			return out, err
		}
	}
	ct, payload, err := man.Payload()
	if err != nil {
		return out, codeError(errcode.ErrorCodeUnknown, err)
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(payload)))
	w.Header().Set("Docker-Content-Digest", dgst.String())
	w.Header().Set("Etag", `"`+dgst.String()+`"`)
	setCacheHeader(w, out)
	w.WriteHeader(http.StatusOK)
	if req.Method != http.MethodHead {
		_, _ = w.Write(payload)
	}
	return out, nil
}

// manifestError is the answer for a manifest that could not be read: 404 MANIFEST_UNKNOWN (with
// distribution's error as detail) for one storage does not have, the upstream's answer otherwise.
func manifestError(err error) *readError {
	var unknown distribution.ErrManifestUnknownRevision
	if errors.As(err, &unknown) {
		return codeError(errcode.ErrorCodeManifestUnknown, unknown)
	}
	return asReadError(err)
}

// defaultPlatformManifest answers for a Docker manifest list asked for by tag by a client that
// does not accept lists: the list's linux/amd64 manifest, read or filled as any manifest, and
// its digest (distribution's rule for clients older than manifest lists).
//
// Errors: 404 MANIFEST_UNKNOWN when the list has no linux/amd64 manifest or storage does not
// have it; 400 MANIFEST_INVALID when it is a Docker v2 manifest the client does not accept;
// 500 UNKNOWN (502 or 508 for an upstream's answer at fault) with any other failure as detail.
func (r *repository) defaultPlatformManifest(ctx context.Context, list *manifestlist.DeserializedManifestList, supports map[string]bool) (distribution.Manifest, digest.Digest, outcome, error) {
	var child digest.Digest
	for _, d := range list.Manifests {
		if d.Platform.Architecture == "amd64" && d.Platform.OS == "linux" {
			child = d.Digest
			break
		}
	}
	if child == "" {
		return nil, "", outcome{}, &readError{err: errcode.ErrorCodeManifestUnknown.WithDetail(nil)}
	}
	man, out, err := r.manifest(ctx, child, "")
	if err != nil {
		var unknown distribution.ErrManifestUnknownRevision
		if errors.As(err, &unknown) {
			return nil, "", out, codeError(errcode.ErrorCodeManifestUnknown, unknown)
		}
		re := asReadError(err)
		if r.up.Offline { // not stored, and the upstream is never asked: 404 as for the list itself
			return nil, "", out, re
		}
		status := 0
		if re.status == http.StatusBadGateway || re.status == http.StatusLoopDetected {
			status = re.status
		}
		return nil, "", out, &readError{status: status, err: errcode.ErrorCodeUnknown.WithDetail(re.err)}
	}
	if _, ok := man.(*schema2.DeserializedManifest); ok && !supports[schema2.MediaTypeManifest] {
		return nil, "", out, &readError{err: errcode.ErrorCodeManifestInvalid.WithMessage("Schema 2 manifest not supported by client")}
	}
	return man, child, out, nil
}

func isOCIManifest(m distribution.Manifest) bool {
	_, ok := m.(*ocischema.DeserializedManifest)
	return ok
}

// acceptedManifests are the manifest media types the request's Accept headers list (parameters
// and q-values ignored, as distribution reads them).
func acceptedManifests(req *http.Request) map[string]bool {
	out := map[string]bool{}
	for _, h := range req.Header.Values("Accept") {
		for _, v := range strings.Split(h, ",") {
			if mt, _, err := mime.ParseMediaType(v); err == nil {
				out[mt] = true
			}
		}
	}
	return out
}

// etagMatch reports whether an If-None-Match header is the digest, quoted or not.
func etagMatch(req *http.Request, etag string) bool {
	for _, v := range req.Header.Values("If-None-Match") {
		if v == etag || v == `"`+etag+`"` {
			return true
		}
	}
	return false
}

// tag resolves tag: from storage when Options.TagTTL says the stored answer is fresh ("hit"),
// else revalidated with the upstream ("revalidated"; "miss" when the manifest had to be fetched
// to learn the digest), the stored tag when the upstream fails, times out or answers 429/5xx
// ("stale"). pending reports that storage does not have the tag at that digest yet: it is stored
// once the manifest is (manifest), so a stale answer always has content behind it.
//
// Errors: distribution.ErrTagUnknown for a tag the upstream does not have; for an offline upstream
// (offline.go) a 404 MANIFEST_UNKNOWN *readError for a tag not stored; else the upstream's
// failure as upstreamAPIError answers it.
func (r *repository) tag(ctx context.Context, tag string) (desc v1.Descriptor, out outcome, pending bool, err error) {
	tags := r.local.Tags(ctx)
	if r.up.Offline { // the stored tag as it is, without revalidation (offline.go)
		if desc, err := tags.Get(ctx, tag); err == nil {
			return desc, outcome{cache: mirrorapi.CacheHit}, false, nil
		}
		return v1.Descriptor{}, out, false, r.offlineMiss(errcode.ErrorCodeManifestUnknown, fmt.Sprintf("tag %q of %s", tag, r.repo))
	}
	if r.fetch.TagFresh(r.up.Name, r.repo, tag) {
		if desc, err := tags.Get(ctx, tag); err == nil {
			return desc, outcome{cache: mirrorapi.CacheHit}, false, nil
		}
	}
	ans, err := r.up.remote.Tag(ctx, r.repo, tag, r.keepManifest)
	if err == nil {
		out = outcome{cache: mirrorapi.CacheRevalidated, tier: ans.Tier}
		if ans.Fetched {
			out.cache = mirrorapi.CacheMiss
		}
		if cur, lerr := tags.Get(ctx, tag); lerr != nil || cur.Digest != ans.Desc.Digest {
			return ans.Desc, out, true, nil
		}
		r.fetch.MarkTagFresh(r.up.Name, r.repo, tag)
		return ans.Desc, out, false, nil
	}
	var ue *upstream.Error
	if errors.As(err, &ue) && ue.NotFound() {
		return v1.Descriptor{}, out, false, distribution.ErrTagUnknown{Tag: tag}
	}
	if cached, lerr := tags.Get(ctx, tag); lerr == nil {
		// Debug, not Warn: a client polling a failing upstream would log a warning a request; the
		// failure with its cause is logged once a minute (upstream health), the access line says
		// cache=stale.
		r.log.Debug().Str("upstream", r.up.Name).Str("repository", r.repo).Str("tag", tag).
			Err(err).Msg("upstream failed; serving the cached tag")
		return cached, outcome{cache: mirrorapi.CacheStale}, false, nil
	}
	return v1.Descriptor{}, out, false, upstreamAPIError(err)
}

// manifest reads manifest dgst from storage ("hit"), else fills it from the upstream ("miss", or
// "coalesced" when it joined another request's fetch); a digest names immutable content, so a
// stored one is served without upstream contact. With tag set, the tag is stored at dgst once
// the manifest is.
//
// Errors: for an offline upstream (offline.go) a 404 MANIFEST_UNKNOWN *readError for a manifest
// not stored; else the upstream's failure as upstreamAPIError answers it.
func (r *repository) manifest(ctx context.Context, dgst digest.Digest, tag string) (distribution.Manifest, outcome, error) {
	var out outcome
	local, err := r.local.Manifests(ctx)
	if err != nil {
		return nil, out, fmt.Errorf("open manifest store: %w", err)
	}
	man, err := local.Get(ctx, dgst)
	if r.damagedManifest(ctx, dgst, man, err) {
		r.evictDamaged(ctx, dgst, -1, "the manifest does not match its digest")
		man, err = nil, errDamaged // fetched again below
	}
	if err == nil {
		out.cache = mirrorapi.CacheHit
	} else {
		if alt, ok := r.manifestByBlob(ctx, dgst); ok {
			man, out.cache = alt, mirrorapi.CacheHit
			r.cache.Pulled(r.storageName(), dgst)
			return man, out, nil
		}
		if cacheOnly(ctx) { // a member's probe: the cache only
			return nil, out, distribution.ErrManifestUnknownRevision{Name: r.storageName(), Revision: dgst}
		}
		if r.up.Offline {
			return nil, out, r.offlineMiss(errcode.ErrorCodeManifestUnknown, "manifest "+dgst.String()+" of "+r.repo)
		}
		var unknown distribution.ErrManifestUnknownRevision
		if !errors.As(err, &unknown) {
			// Not a stored manifest (a blob of that digest, which fails to parse): what the
			// digest is, the upstream says, exactly as it did before anything was cached.
			r.log.Debug().Err(err).Str("repository", r.repo).Str("digest", dgst.String()).Msg("local manifest unusable; asking the upstream")
		}
		fetched, joined, ferr := r.up.remote.Manifest(ctx, r.repo, dgst.String(), dgst, r.keepManifest)
		if ferr != nil {
			return nil, out, upstreamAPIError(ferr)
		}
		out = outcome{cache: mirrorapi.CacheMiss, tier: fetched.Tier}
		if joined {
			out.cache = mirrorapi.CacheCoalesced
		}
		man = fetched.Kept.(distribution.Manifest)
	}
	r.cache.Pulled(r.storageName(), dgst)
	if tag != "" {
		r.storeTag(context.WithoutCancel(ctx), tag, dgst)
	}
	return man, out, nil
}

// damagedManifest reports whether the stored manifest dgst, as local.Get answered it (man, err),
// is damaged: the bytes it parsed from do not hash to dgst (a manifest is read whole on every
// hit, so every hit is checked), or they do not parse and do not hash to dgst either (what
// keepManifest stores always parsed).
func (r *repository) damagedManifest(ctx context.Context, dgst digest.Digest, man distribution.Manifest, err error) bool {
	if !dgst.Algorithm().Available() {
		return false
	}
	if err == nil {
		_, payload, perr := man.Payload()
		return perr == nil && dgst.Algorithm().FromBytes(payload) != dgst
	}
	var unknown distribution.ErrManifestUnknownRevision
	return !errors.As(err, &unknown) && r.cache.Damaged(ctx, dgst, upstream.MaxManifestBytes)
}

// manifestByBlob reads manifest dgst of a digest algorithm other than distribution's canonical
// one (sha512): distribution files manifests by their sha256, so keepManifest also stores the
// bytes as a blob linked under dgst, and this reads them back. ok is false for sha256 digests and
// when nothing is stored under dgst.
func (r *repository) manifestByBlob(ctx context.Context, dgst digest.Digest) (distribution.Manifest, bool) {
	if dgst.Algorithm() == digest.Canonical {
		return nil, false
	}
	blobs := r.local.Blobs(ctx)
	desc, err := blobs.Stat(ctx, dgst)
	if err != nil || desc.Size > upstream.MaxManifestBytes {
		return nil, false
	}
	raw, err := blobs.Get(ctx, dgst)
	if err != nil {
		return nil, false
	}
	if dgst.Algorithm().FromBytes(raw) != dgst {
		r.evictDamaged(ctx, dgst, int64(len(raw)), "the manifest does not match its digest") // fetched again
		return nil, false
	}
	mt, err := upstream.ManifestType("", raw)
	if err != nil {
		return nil, false
	}
	man, _, err := distribution.UnmarshalManifest(mt, raw)
	if err != nil {
		return nil, false
	}
	return man, true
}

// keepByDigest stores the bytes of a manifest whose digest is not of the canonical algorithm as a
// blob linked under that digest (manifestByBlob reads it back); a failure is logged, and the next
// request for it asks the upstream again.
func (r *repository) keepByDigest(ctx context.Context, fm upstream.Manifest) {
	if fm.Digest.Algorithm() == digest.Canonical {
		return
	}
	err := func() error {
		bw, err := r.local.Blobs(ctx).Create(ctx)
		if err != nil {
			return err
		}
		if _, err := bw.Write(fm.Raw); err != nil {
			_ = bw.Cancel(ctx)
			return err
		}
		err = r.cache.CommitBlob(ctx, r.storageName(), fm.Digest, int64(len(fm.Raw)), func() error {
			_, err := bw.Commit(ctx, v1.Descriptor{Digest: fm.Digest, Size: int64(len(fm.Raw)), MediaType: fm.MediaType})
			return err
		})
		if err != nil {
			_ = bw.Cancel(ctx)
		}
		return err
	}()
	if err != nil {
		r.log.Warn().Err(err).Str("repository", r.repo).Str("digest", fm.Digest.String()).Msg("store a manifest under its digest")
	}
}

// storeTag stores tag at dgst and marks it fresh; a failure is logged (the answer stands).
func (r *repository) storeTag(ctx context.Context, tag string, dgst digest.Digest) {
	if err := r.local.Tags(ctx).Tag(ctx, tag, v1.Descriptor{Digest: dgst}); err != nil {
		r.log.Error().Err(err).Str("repository", r.repo).Str("tag", tag).Msg("store tag")
		return
	}
	r.cache.Tagged(r.storageName(), tag, dgst)
	r.fetch.MarkTagFresh(r.up.Name, r.repo, tag)
}

// keepManifest parses a manifest fetched from the upstream and stores it in r's repository
// (upstream.KeepFunc); it returns the distribution.Manifest.
//
// Errors: upstream.ErrNotManifest (502 to the client: the upstream's answer was wrong) naming the
// upstream and digest for content that is not an OCI or Docker v2 manifest or index; 400
// MANIFEST_INVALID (a *readError, the client's answer as is) for one that lists more than
// cache.MaxManifestRefs descriptors (nothing of either is stored); a plain error (503 to the
// client) when storing fails.
func (r *repository) keepManifest(ctx context.Context, fm upstream.Manifest) (any, error) {
	// Parsed and bounded before the store lock: every manifest store and blob commit of the
	// cache waits for that lock, so under it is only what must be atomic with eviction.
	refs, listed := cache.ManifestRefs(fm.Raw, cache.MaxManifestRefs)
	if listed > cache.MaxManifestRefs {
		return nil, &readError{err: errcode.ErrorCodeManifestInvalid.WithMessage(fmt.Sprintf(
			"upstream %s: manifest %s lists %d descriptors (config, layers, child manifests); nodecache refuses more than %d per manifest (real images have at most 125 layers)",
			r.up.Name, fm.Digest, listed, cache.MaxManifestRefs))}
	}
	man, _, err := distribution.UnmarshalManifest(fm.MediaType, fm.Raw)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: manifest %s of media type %q: %w: %w", r.up.Name, fm.Digest, fm.MediaType, upstream.ErrNotManifest, err)
	}
	store, err := r.local.Manifests(ctx, storage.SkipLayerVerification())
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
	r.keepByDigest(ctx, fm)
	return man, nil
}
