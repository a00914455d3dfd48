package warm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// maxManifestBytes is the largest manifest accepted: distribution's own limit for a manifest
// body (4 MiB, registry/handlers/manifests.go maxManifestBodySize).
const maxManifestBytes = 4 << 20

// maxIndexDepth bounds nested indexes (an index that lists indexes).
const maxIndexDepth = 4

// attestationAnnotation marks BuildKit's attestation manifests in an index (platform
// unknown/unknown); they are never fetched.
const attestationAnnotation = "vnd.docker.reference.type"

// ErrSchema1 is the failure for a Docker schema 1 manifest, which warm does not walk.
var ErrSchema1 = errors.New("docker schema 1 manifest: not supported (deprecated since 2017, refused by containerd 2); push the image again with a current client")

// manifestDoc is one manifest fetched through the mirror.
type manifestDoc struct {
	Body      []byte
	MediaType types.MediaType
	Digest    digest.Digest
	Cache     string // X-Nodecache-Cache answer, "" when absent
}

// getManifest fetches ref's manifest id (tag or digest) through the mirror, with retries, and
// verifies its digest: against id when id is a digest, else against Docker-Content-Digest when
// the mirror sends one.
func (c *client) getManifest(ctx context.Context, ref Reference, id string, timeout time.Duration) (manifestDoc, error) {
	var want digest.Digest
	if d, err := digest.Parse(id); err == nil {
		want = d
	}
	target := c.endpoint(ref, "manifests", id)
	var doc manifestDoc
	err := c.retry(ctx, "manifest "+ref.Repository+":"+id, func(ctx context.Context, _ int) error {
		actx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, err := c.newRequest(actx, target)
		if err != nil {
			return permanent(err)
		}
		req.Header.Set("Accept", mirrorapi.ManifestAccept) // schema 1 is not asked for, and refused
		resp, err := c.do(req, ref)
		if err != nil {
			return c.explain(fmt.Errorf("GET %s: %w", target, err))
		}
		if resp.StatusCode != http.StatusOK {
			return c.explain(newStatusError(resp))
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxManifestBytes+1))
		if err != nil {
			return fmt.Errorf("read manifest %s: %w: %w", target, errBrokenStream, err)
		}
		if len(body) > maxManifestBytes {
			return permanent(fmt.Errorf("manifest %s is larger than %d bytes", target, maxManifestBytes))
		}
		doc = manifestDoc{Body: body, Cache: resp.Header.Get(mirrorapi.HeaderCache)}
		doc.MediaType = manifestMediaType(body, resp.Header.Get("Content-Type"))
		if want != "" {
			if got := want.Algorithm().FromBytes(body); got != want {
				return permanent(fmt.Errorf("manifest %s: digest mismatch: body is %s", target, got))
			}
			doc.Digest = want
			return nil
		}
		doc.Digest = digest.FromBytes(body)
		if h, err := digest.Parse(resp.Header.Get("Docker-Content-Digest")); err == nil && h.Algorithm().Available() {
			if got := h.Algorithm().FromBytes(body); got != h {
				return permanent(fmt.Errorf("manifest %s: digest mismatch: mirror says %s, body is %s", target, h, got))
			}
			doc.Digest = h
		}
		return nil
	})
	return doc, err
}

// manifestMediaType takes the media type from the body's mediaType field, else from the
// Content-Type header, else from the shape of the body (OCI allows omitting mediaType).
func manifestMediaType(body []byte, contentType string) types.MediaType {
	var probe struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     types.MediaType `json:"mediaType"`
		Manifests     json.RawMessage `json:"manifests"`
		Config        json.RawMessage `json:"config"`
		FSLayers      json.RawMessage `json:"fsLayers"`
	}
	_ = json.Unmarshal(body, &probe)
	if probe.MediaType != "" {
		return probe.MediaType
	}
	if ct, _, err := mime.ParseMediaType(contentType); err == nil && ct != "application/json" && ct != "text/plain" && ct != "application/octet-stream" {
		return types.MediaType(ct)
	}
	switch {
	case probe.SchemaVersion == 1 || probe.FSLayers != nil:
		return types.DockerManifestSchema1
	case probe.Manifests != nil:
		return types.OCIImageIndex
	case probe.Config != nil:
		return types.OCIManifestSchema1
	}
	return ""
}

// walked is the outcome of resolving one reference to one platform's manifest.
type walked struct {
	Top            manifestDoc // what the tag or digest named
	Manifest       *v1.Manifest
	ManifestDigest digest.Digest
	Platform       string // chosen index entry's platform; "" for a single manifest walked as is
	Manifests      int    // manifests fetched
	Skipped        int    // index entries not fetched (other platforms, attestations)
	Caches         []string
	// Docs is every manifest fetched, Top first (what warm --to stores); Images the image
	// manifests whose blobs to fetch: Manifest alone, or with --platform all every image of the
	// index.
	Docs   []manifestDoc
	Images []*v1.Manifest
}

// walk resolves ref through the mirror to the manifest for m's platform: an index yields exactly
// its best matching entry (nested indexes followed, attestation entries never fetched); a single
// manifest is returned as is (walked.Platform ""), and the caller checks its config's platform.
func (c *client) walk(ctx context.Context, ref Reference, m platformMatcher, timeout time.Duration) (walked, error) {
	var w walked
	top, err := c.getManifest(ctx, ref, ref.manifestRef(), timeout)
	if err != nil {
		return w, err
	}
	w.Top, w.Manifests, w.Caches, w.Docs = top, 1, append(w.Caches, top.Cache), []manifestDoc{top}
	doc := top
	if top.MediaType.IsIndex() {
		var cands []v1.Descriptor
		if err := c.collect(ctx, ref, m, top, 0, &cands, &w, timeout); err != nil {
			return w, err
		}
		plats := make([]*v1.Platform, len(cands))
		for i := range cands {
			plats[i] = cands[i].Platform
		}
		best := m.best(plats)
		if best < 0 {
			offered := make([]string, 0, len(cands))
			for _, p := range plats {
				offered = append(offered, formatV1Platform(p))
			}
			return w, permanent(fmt.Errorf("index %s has no manifest for %s %s; it offers [%s]",
				top.Digest, FormatPlatform(m.want), m.rule.describe(), strings.Join(offered, ", ")))
		}
		w.Skipped += len(cands) - 1
		chosen := cands[best]
		w.Platform = formatV1Platform(chosen.Platform)
		doc, err = c.getManifest(ctx, ref, chosen.Digest.String(), timeout)
		if err != nil {
			return w, err
		}
		w.Manifests++
		w.Caches = append(w.Caches, doc.Cache)
		w.Docs = append(w.Docs, doc)
	}
	mf, err := parseImage(doc)
	if err != nil {
		return w, err
	}
	w.Manifest, w.ManifestDigest, w.Images = mf, doc.Digest, []*v1.Manifest{mf}
	return w, nil
}

// parseImage parses doc as an image manifest (OCI or Docker schema 2); anything else is a
// permanent error naming it.
func parseImage(doc manifestDoc) (*v1.Manifest, error) {
	switch {
	case doc.MediaType.IsSchema1():
		return nil, permanent(ErrSchema1)
	case doc.MediaType.IsIndex():
		return nil, permanent(fmt.Errorf("manifest %s is an index inside an index entry for an image", doc.Digest))
	case !doc.MediaType.IsImage():
		return nil, permanent(fmt.Errorf("manifest %s has media type %q: want an OCI or Docker v2 image manifest", doc.Digest, doc.MediaType))
	}
	mf, err := v1.ParseManifest(bytes.NewReader(doc.Body))
	if err != nil {
		return nil, permanent(fmt.Errorf("parse manifest %s: %w", doc.Digest, err))
	}
	if mf.SchemaVersion != 2 {
		return nil, permanent(fmt.Errorf("manifest %s: schemaVersion %d, want 2", doc.Digest, mf.SchemaVersion))
	}
	return mf, nil
}

// collect appends idx's image entries to cands, following nested indexes whose platform is unset
// or matches. Attestation entries and entries that are neither images nor indexes are skipped.
func (c *client) collect(ctx context.Context, ref Reference, m platformMatcher, idx manifestDoc, depth int, cands *[]v1.Descriptor, w *walked, timeout time.Duration) error {
	if depth >= maxIndexDepth {
		return permanent(fmt.Errorf("index %s: indexes nested deeper than %d", idx.Digest, maxIndexDepth))
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(idx.Body))
	if err != nil {
		return permanent(fmt.Errorf("parse index %s: %w", idx.Digest, err))
	}
	for _, d := range im.Manifests {
		switch {
		case d.Annotations[attestationAnnotation] == "attestation-manifest",
			d.Platform != nil && d.Platform.OS == "unknown" && d.Platform.Architecture == "unknown":
			w.Skipped++
		case d.MediaType.IsIndex():
			if d.Platform != nil && !m.match(d.Platform) {
				w.Skipped++
				continue
			}
			nested, err := c.getManifest(ctx, ref, d.Digest.String(), timeout)
			if err != nil {
				return err
			}
			w.Manifests++
			w.Caches = append(w.Caches, nested.Cache)
			w.Docs = append(w.Docs, nested)
			if err := c.collect(ctx, ref, m, nested, depth+1, cands, w, timeout); err != nil {
				return err
			}
		case d.MediaType.IsImage() || d.MediaType == "":
			*cands = append(*cands, d)
		default:
			w.Skipped++
		}
	}
	return nil
}

// walkAll resolves ref to every manifest it names (warm --to --platform all): an index and,
// recursively, every entry of it — each platform's image and the attestation manifests too, so
// the index is whole — or a single manifest. Entries that are neither indexes nor images are
// skipped (counted in Skipped).
func (c *client) walkAll(ctx context.Context, ref Reference, timeout time.Duration) (walked, error) {
	var w walked
	top, err := c.getManifest(ctx, ref, ref.manifestRef(), timeout)
	if err != nil {
		return w, err
	}
	w.Top, w.Manifests, w.Caches, w.Docs = top, 1, []string{top.Cache}, []manifestDoc{top}
	var visit func(doc manifestDoc, depth int) error
	visit = func(doc manifestDoc, depth int) error {
		if !doc.MediaType.IsIndex() {
			mf, err := parseImage(doc)
			if err != nil {
				return err
			}
			w.Images = append(w.Images, mf)
			return nil
		}
		if depth >= maxIndexDepth {
			return permanent(fmt.Errorf("index %s: indexes nested deeper than %d", doc.Digest, maxIndexDepth))
		}
		im, err := v1.ParseIndexManifest(bytes.NewReader(doc.Body))
		if err != nil {
			return permanent(fmt.Errorf("parse index %s: %w", doc.Digest, err))
		}
		for _, d := range im.Manifests {
			if !d.MediaType.IsIndex() && !d.MediaType.IsImage() && d.MediaType != "" {
				w.Skipped++
				continue
			}
			child, err := c.getManifest(ctx, ref, d.Digest.String(), timeout)
			if err != nil {
				return err
			}
			w.Manifests++
			w.Caches = append(w.Caches, child.Cache)
			w.Docs = append(w.Docs, child)
			if err := visit(child, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := visit(top, 0); err != nil {
		return w, err
	}
	if !top.MediaType.IsIndex() {
		w.Manifest, w.ManifestDigest = w.Images[0], top.Digest
	}
	return w, nil
}
