package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// BlobStat asks the upstream about repo's blob dgst without downloading it: one HEAD. The HEAD
// is a hint: when it is refused with a 4xx other than 429, or lacks Content-Length or a
// Docker-Content-Digest equal to dgst, then with probe a GET of the first byte
// (Range: bytes=0-0; the size from Content-Range) decides; without probe the descriptor comes
// back with Size -1 and the fill's GET decides. Concurrent requests share the exchange, bounded
// by the upstream timeout.
//
// The tier is where the answer came from (TierShared, TierUpstream).
//
// Errors: an *Error: NotFound only when the GET said so (or the HEAD, when the upstream answers
// nothing else), Unavailable for no answer, 429 and 5xx.
func (r *Remote) BlobStat(ctx context.Context, repo string, dgst digest.Digest, probe bool) (desc v1.Descriptor, tier string, err error) {
	key := "blobstat\x00" + r.Name + "\x00" + repo + "\x00" + dgst.String() + "\x00" + strconv.FormatBool(probe)
	v, err, _ := r.f.flight.Do(key, func() (any, error) {
		desc, tier, err := r.blobStat(ctx, repo, dgst, probe)
		return tiered[v1.Descriptor]{desc, tier}, err
	})
	if err != nil {
		return v1.Descriptor{}, "", err
	}
	t := v.(tiered[v1.Descriptor])
	return t.v, t.tier, nil
}

// tiered is a result shared by concurrent requests, with the tier that answered it.
type tiered[T any] struct {
	v    T
	tier string
}

// blobStat is BlobStat's exchange, with the tier that answered; its end (not a HEAD refused as a
// hint) is what the upstream's health counts.
func (r *Remote) blobStat(ctx context.Context, repo string, dgst digest.Digest, probe bool) (v1.Descriptor, string, error) {
	desc, tier, err := r.statBlob(ctx, repo, dgst, probe)
	r.f.health.record(r.Name, tier, err)
	return desc, tier, err
}

// statBlob is blobStat's HEAD and, when needed, its probe.
func (r *Remote) statBlob(ctx context.Context, repo string, dgst digest.Digest, probe bool) (v1.Descriptor, string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.f.exchangeTimeout())
	defer cancel()
	ctx, tier := trackTier(ctx)
	desc := v1.Descriptor{Digest: dgst, Size: -1, MediaType: "application/octet-stream"}
	start := time.Now()
	resp, err := r.client.do(ctx, http.MethodHead, repo, "blobs", dgst.String(), nil, http.StatusOK)
	r.f.metrics.observe(r.Name, tier(), KindBlob, start, err)
	var ue *Error
	switch {
	case err == nil:
		_ = resp.Body.Close()
		if resp.ContentLength >= 0 && resp.Header.Get("Docker-Content-Digest") == dgst.String() {
			desc.Size = resp.ContentLength
			return desc, tier(), nil
		}
	case errors.As(err, &ue) && ue.Status >= 400 && ue.Status < 500 && ue.Status != http.StatusTooManyRequests:
		// Refused: only a hint.
	default:
		return desc, tier(), err
	}
	if !probe {
		return desc, tier(), nil
	}
	start = time.Now()
	resp, err = r.client.do(ctx, http.MethodGet, repo, "blobs", dgst.String(),
		http.Header{"Range": {"bytes=0-0"}}, http.StatusOK, http.StatusPartialContent)
	r.f.metrics.observe(r.Name, tier(), KindBlob, start, err)
	if err != nil {
		return desc, tier(), err
	}
	_ = resp.Body.Close() // a 200 is the whole blob: not read
	desc.Size = resp.ContentLength
	if resp.StatusCode == http.StatusPartialContent {
		desc.Size = contentRangeTotal(resp.Header.Get("Content-Range"))
	}
	return desc, tier(), nil
}

// Manifest is a manifest as an upstream answered it.
type Manifest struct {
	// Raw is the body, byte for byte; Digest is its digest.
	Raw    []byte
	Digest digest.Digest
	// MediaType is the manifest's media type (see ManifestType).
	MediaType string
	// Kept is what the KeepFunc returned for it.
	Kept any
	// Tier is where it came from: TierShared or TierUpstream.
	Tier string
}

// KeepFunc stores a manifest fetched from the upstream and returns what callers of
// (*Remote).Manifest get as Manifest.Kept. It runs once per fetch, whoever asked.
type KeepFunc func(ctx context.Context, m Manifest) (any, error)

// Manifest GETs repo's manifest ref (tag or digest) from the upstream, checks it against want
// (when set; else against the upstream's Docker-Content-Digest, when sent), and hands it to
// keep. Concurrent requests for the same manifest share one fetch; joined reports that this
// caller joined one another request had started.
func (r *Remote) Manifest(ctx context.Context, repo, ref string, want digest.Digest, keep KeepFunc) (m Manifest, joined bool, err error) {
	leader := false
	v, err, _ := r.f.flight.Do("manifest\x00"+r.Name+"\x00"+repo+"\x00"+ref, func() (any, error) {
		leader = true
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.f.exchangeTimeout()+30*time.Second)
		defer cancel()
		ctx, tier := trackTier(withPeerMemory(ctx))
		start := time.Now()
		m, err := r.getManifest(ctx, repo, ref, want, tier)
		r.f.done(r.Name, tier(), KindManifest, start, err)
		if err != nil {
			return Manifest{}, err
		}
		kept, err := keep(context.WithoutCancel(ctx), m)
		if err != nil {
			return Manifest{}, err
		}
		m.Kept = kept
		return m, nil
	})
	if err != nil {
		return Manifest{}, false, err
	}
	return v.(Manifest), !leader, nil
}

// getManifest is Manifest's exchange: the GET, its body read and checked (size, digest, media
// type), tier being where it came from.
func (r *Remote) getManifest(ctx context.Context, repo, ref string, want digest.Digest, tier func() string) (Manifest, error) {
	resp, err := r.client.do(ctx, http.MethodGet, repo, "manifests", ref,
		http.Header{"Accept": {mirrorapi.ManifestAccept}}, http.StatusOK)
	if err != nil {
		return Manifest{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxManifestBytes+1))
	if err != nil {
		return Manifest{}, r.client.classify("read manifest "+ref, err)
	}
	if len(body) > MaxManifestBytes {
		return Manifest{}, fmt.Errorf("upstream %s: manifest %s is larger than %d bytes: %w", r.Name, ref, MaxManifestBytes, ErrManifestTooLarge)
	}
	r.f.metrics.upstreamBytes.WithLabelValues(r.Name, tier()).Add(float64(len(body)))
	// The digest is that of the bytes received; a digest asked for must match it.
	if want != "" {
		if got := want.Algorithm().FromBytes(body); got != want {
			r.f.metrics.mismatches.WithLabelValues(r.Name, KindManifest, tier()).Inc()
			r.f.distrustPeers(ctx)
			return Manifest{}, fmt.Errorf("upstream %s: manifest %s: content digest %s does not match %s: %w", r.Name, ref, got, want, ErrDigestMismatch)
		}
	} else {
		want = digest.FromBytes(body)
	}
	ct, err := ManifestType(resp.Header.Get("Content-Type"), body)
	if err != nil {
		return Manifest{}, fmt.Errorf("upstream %s: manifest %s: %w", r.Name, ref, err)
	}
	return Manifest{Raw: body, Digest: want, MediaType: ct, Tier: tier()}, nil
}

// TagAnswer is what the upstream says a tag names now.
type TagAnswer struct {
	Desc v1.Descriptor
	// Fetched reports that the upstream's HEAD named no digest, so the manifest was fetched
	// (and kept) to learn it.
	Fetched bool
	// Tier is where the answer came from: TierShared or TierUpstream.
	Tier string
}

// Tag asks the upstream which manifest repo:tag names now: one HEAD, shared by concurrent
// requests for the same tag, bounded by the upstream timeout as a whole. When the HEAD names
// no digest the manifest is fetched and handed to keep.
func (r *Remote) Tag(ctx context.Context, repo, tag string, keep KeepFunc) (TagAnswer, error) {
	v, err, _ := r.f.flight.Do("tag\x00"+r.Name+"\x00"+repo+"\x00"+tag, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.f.exchangeTimeout())
		defer cancel()
		ctx, tier := trackTier(ctx)
		start := time.Now()
		resp, err := r.client.do(ctx, http.MethodHead, repo, "manifests", tag,
			http.Header{"Accept": {mirrorapi.ManifestAccept}}, http.StatusOK)
		r.f.metrics.observe(r.Name, tier(), KindManifest, start, err)
		var ue *Error
		if errors.As(err, &ue) && ue.Status >= 400 && ue.Status < 500 && ue.Status != http.StatusTooManyRequests {
			// A HEAD refused (401, 403, 404, 405, ...) is only a hint: the GET is the truth.
			return r.tagByGet(ctx, repo, tag, keep)
		}
		r.f.health.record(r.Name, tier(), err)
		if err != nil {
			return nil, err
		}
		_ = resp.Body.Close()
		dgst, perr := digest.Parse(resp.Header.Get("Docker-Content-Digest"))
		if perr != nil {
			// The digest header is optional on HEAD: fetch the manifest to learn it.
			return r.tagByGet(ctx, repo, tag, keep)
		}
		return TagAnswer{Desc: v1.Descriptor{Digest: dgst, Size: resp.ContentLength, MediaType: MediaType(resp.Header.Get("Content-Type"))}, Tier: tier()}, nil
	})
	if err != nil {
		return TagAnswer{}, err
	}
	return v.(TagAnswer), nil
}

// tagByGet learns what tag names by GETting (and keeping) the manifest.
func (r *Remote) tagByGet(ctx context.Context, repo, tag string, keep KeepFunc) (TagAnswer, error) {
	m, _, err := r.Manifest(ctx, repo, tag, "", keep)
	if err != nil {
		return TagAnswer{}, err
	}
	return TagAnswer{Desc: v1.Descriptor{Digest: m.Digest, Size: int64(len(m.Raw)), MediaType: m.MediaType}, Fetched: true, Tier: m.Tier}, nil
}

// Docker image manifest v2 schema 1 media types: recognised only to be refused (the manifest
// types nodecache serves are mirrorapi's).
const (
	MediaTypeDockerSchema1    = "application/vnd.docker.distribution.manifest.v1+json"
	MediaTypeDockerSchema1JWS = "application/vnd.docker.distribution.manifest.v1+prettyjws"
)

// ErrSchema1 marks a Docker schema 1 manifest: refused, as containerd >= 2.0 refuses it.
var ErrSchema1 = errors.New("schema 1 manifests are not supported")

// ErrNotManifest marks a body that is neither of a manifest media type nor recognisable as one.
var ErrNotManifest = errors.New("not an OCI or Docker manifest or index")

// ManifestType returns the media type of a manifest body as an upstream sent it with
// contentType. A manifest media type in contentType is taken as it is; any other Content-Type
// (empty, application/json, text/plain, application/octet-stream, ...) is decided by the bytes:
// the document's mediaType field; without one, a "manifests" key is an OCI image index,
// "config" and "layers" an OCI image manifest, "schemaVersion": 1 Docker schema 1.
//
// Errors: ErrSchema1 for a schema 1 manifest (either way), ErrNotManifest for anything else.
func ManifestType(contentType string, body []byte) (string, error) {
	mt := MediaType(contentType)
	switch mt {
	case MediaTypeDockerSchema1, MediaTypeDockerSchema1JWS:
		return "", fmt.Errorf("media type %s: %w", mt, ErrSchema1)
	case mirrorapi.MediaTypeOCIIndex, mirrorapi.MediaTypeOCIManifest, mirrorapi.MediaTypeDockerList, mirrorapi.MediaTypeDockerManifest:
		return mt, nil
	}
	var doc struct {
		MediaType     string          `json:"mediaType"`
		SchemaVersion *int            `json:"schemaVersion"`
		Manifests     json.RawMessage `json:"manifests"`
		Config        json.RawMessage `json:"config"`
		Layers        json.RawMessage `json:"layers"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", fmt.Errorf("Content-Type %q and a body that is not JSON: %w", contentType, ErrNotManifest)
	}
	switch {
	case doc.MediaType == MediaTypeDockerSchema1 || doc.MediaType == MediaTypeDockerSchema1JWS,
		doc.MediaType == "" && doc.SchemaVersion != nil && *doc.SchemaVersion == 1:
		return "", fmt.Errorf("Content-Type %q, schema 1 document: %w", contentType, ErrSchema1)
	case doc.MediaType != "":
		return doc.MediaType, nil
	case doc.Manifests != nil:
		return mirrorapi.MediaTypeOCIIndex, nil
	case doc.Config != nil && doc.Layers != nil:
		return mirrorapi.MediaTypeOCIManifest, nil
	}
	return "", fmt.Errorf("Content-Type %q and a document without mediaType, manifests or config and layers: %w", contentType, ErrNotManifest)
}

// MediaType returns the media type of a Content-Type value without parameters, "" when it
// does not parse.
func MediaType(ct string) string {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return ""
	}
	return mt
}
