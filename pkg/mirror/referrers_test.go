package mirror_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// Artifact types of the referrers the tests push: cosign's signature (its config media type,
// which registries list as the artifactType of an image manifest without one) and an SPDX SBOM.
const (
	cosignSigType = "application/vnd.dev.cosign.artifact.sig.v1+json"
	sbomType      = "application/spdx+json"
)

// referrersUpstream is go-containerregistry's registry with the referrers API, behind a front
// that answers the referrers list in pages of perPage descriptors linked by Link headers
// (rel="next", ?page=N), as registries that page do: go-containerregistry's registry answers in
// one page. pages counts the referrers requests it answered.
type referrersUpstream struct {
	srv   *httptest.Server
	host  string
	pages atomic.Int64
}

func newReferrersUpstream(t *testing.T, perPage int) *referrersUpstream {
	t.Helper()
	u := &referrersUpstream{}
	reg := registry.New(registry.WithReferrersSupport(true), registry.Logger(log.New(io.Discard, "", 0)))
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/referrers/") || r.Method != http.MethodGet {
			reg.ServeHTTP(w, r)
			return
		}
		u.pages.Add(1)
		whole := httptest.NewRecorder()
		all := r.Clone(r.Context())
		all.URL.RawQuery = ""
		reg.ServeHTTP(whole, all)
		if whole.Code != http.StatusOK {
			w.Header().Set("Content-Type", whole.Header().Get("Content-Type"))
			w.WriteHeader(whole.Code)
			_, _ = w.Write(whole.Body.Bytes())
			return
		}
		var idx v1.IndexManifest
		if err := json.Unmarshal(whole.Body.Bytes(), &idx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// The registry lists from a map: sorted, so that pages are stable.
		slices.SortFunc(idx.Manifests, func(a, b v1.Descriptor) int { return strings.Compare(a.Digest.String(), b.Digest.String()) })
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		start, end := min(page*perPage, len(idx.Manifests)), min((page+1)*perPage, len(idx.Manifests))
		if end < len(idx.Manifests) {
			w.Header().Set("Link", fmt.Sprintf(`<%s?page=%d>; rel="next"`, r.URL.Path, page+1))
		}
		idx.Manifests = idx.Manifests[start:end]
		w.Header().Set("Content-Type", string(types.OCIImageIndex))
		_ = json.NewEncoder(w).Encode(idx)
	}))
	t.Cleanup(u.srv.Close)
	u.host = u.srv.Listener.Addr().String()
	return u
}

// upstream is u as nodecache's upstream called upstreamName.
func (u *referrersUpstream) upstream(t *testing.T, upstreamName string) regname.Upstream {
	t.Helper()
	return parseUpstream(t, upstreamName+"="+u.srv.URL)
}

// pushRef pushes img (an image or an artifact) to host/repo:tag (by digest when tag is "") and
// returns its descriptor.
func pushRef(t *testing.T, host, repo, tag string, img v1.Image) v1.Descriptor {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	target := host + "/" + repo + "@" + d.String()
	if tag != "" {
		target = host + "/" + repo + ":" + tag
	}
	if err := remote.Write(ref(t, target), img); err != nil {
		t.Fatalf("push %s: %v", target, err)
	}
	desc, err := partialDescriptor(img)
	if err != nil {
		t.Fatal(err)
	}
	return desc
}

func partialDescriptor(img v1.Image) (v1.Descriptor, error) {
	d, err := img.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	size, err := img.Size()
	if err != nil {
		return v1.Descriptor{}, err
	}
	mt, err := img.MediaType()
	return v1.Descriptor{Digest: d, Size: size, MediaType: mt}, err
}

// artifact is a referrer of subject shaped as cosign writes a signature: an OCI image manifest
// whose config media type is the artifact type, with one layer (payload, of layerType) carrying
// annotations, and subject.
func artifact(t *testing.T, artifactType, layerType string, payload string, subject v1.Descriptor) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.MediaType(artifactType))
	img, err := mutate.Append(img, mutate.Addendum{
		Layer:       static.NewLayer([]byte(payload), types.MediaType(layerType)),
		Annotations: map[string]string{"dev.cosignproject.cosign/signature": "MEUCIQ" + strconv.Itoa(len(payload))},
	})
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.Annotations(img, map[string]string{"org.opencontainers.image.created": "2026-01-01T00:00:00Z"}).(v1.Image)
	return mutate.Subject(img, subject).(v1.Image)
}

// referrersAnswer is an answer to a referrers request: its status, headers and Content-Length,
// and the digests its index lists, sorted.
type referrersAnswer struct {
	StatusCode    int
	Header        http.Header
	ContentLength int64
}

// referrersList GETs (or HEADs) the referrers of subject through h at path prefix p
// ("/v2/<upstream>/<repo>") with query, and returns the answer and its descriptors' digests.
func referrersList(t *testing.T, h *harness, method, p, subject, query string) (referrersAnswer, []string) {
	t.Helper()
	u := fmtURL(h, p+"/referrers/"+subject)
	if query != "" {
		u += "?" + query // escaped by the caller
	}
	resp, body := get(t, method, u, nil)
	ans := referrersAnswer{resp.StatusCode, resp.Header, resp.ContentLength}
	if resp.StatusCode != http.StatusOK || method == http.MethodHead {
		return ans, nil
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(body, &idx); err != nil {
		t.Fatalf("%s %s: %v: %s", method, u, err, body)
	}
	if idx.SchemaVersion != 2 || idx.MediaType != types.OCIImageIndex || resp.Header.Get("Content-Type") != string(types.OCIImageIndex) {
		t.Fatalf("%s %s: not an OCI image index: Content-Type %q, %s", method, u, resp.Header.Get("Content-Type"), body)
	}
	var out []string
	for _, d := range idx.Manifests {
		out = append(out, d.Digest.String())
	}
	slices.Sort(out)
	return ans, out
}

func layerBytes(l v1.Layer) ([]byte, error) {
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func sortedDigests(ds ...v1.Descriptor) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Digest.String())
	}
	slices.Sort(out)
	return out
}

// TestReferrersAPI (issue 25): an upstream with the referrers API, answering in pages. A cosign
// signature and an SBOM of an image are listed through nodecache by go-containerregistry's
// remote.Referrers (every page merged into one index), filtered by artifactType with
// OCI-Filters-Applied, answered to HEAD; the signature manifest and its blobs pull through; with
// the upstream stopped the cached list is served (stale), and a subject with nothing cached is
// 503, never an empty list; an unknown repository is the upstream's 404 NAME_UNKNOWN. Fails
// before: nodecache answered 404 UNSUPPORTED without asking the upstream (remote.Referrers then
// reads the tag schema, which this upstream does not write: no referrers).
func TestReferrersAPI(t *testing.T) {
	t.Parallel()
	up := newReferrersUpstream(t, 1)
	const repo = "team/app"
	subjectImg := mirrortest.Image(t, 4096, 1, "linux/amd64")
	subject := pushRef(t, up.host, repo, "v1", subjectImg)
	sig := pushRef(t, up.host, repo, "", artifact(t, cosignSigType, "application/vnd.dev.cosign.simplesigning.v1+json", `{"critical":{}}`, subject))
	sbom := pushRef(t, up.host, repo, "", artifact(t, sbomType, sbomType, `{"spdxVersion":"SPDX-2.3"}`, subject))
	other := pushRef(t, up.host, repo, "v2", mirrortest.Image(t, 4096, 1, "linux/amd64"))

	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{up.upstream(t, "refs.test")}})
	prefix := "/v2/refs.test/" + repo
	up.pages.Store(0) // the pushes asked too
	// The subject is pulled first, as a verifier resolves the tag: the list is cached with it.
	pullImage(t, h.host+"/refs.test/"+repo+":v1")

	nc := ref(t, h.host+"/refs.test/"+repo+"@"+subject.Digest.String()).(name.Digest)
	idx, err := remote.Referrers(nc)
	if err != nil {
		t.Fatalf("remote.Referrers through nodecache: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sortedDigests(im.Manifests...), sortedDigests(sig, sbom); !slices.Equal(got, want) {
		t.Fatalf("referrers through nodecache: %v, want the signature and the SBOM %v", got, want)
	}
	for _, d := range im.Manifests {
		if d.Digest == sig.Digest && (d.ArtifactType != cosignSigType || d.Annotations["org.opencontainers.image.created"] == "") {
			t.Errorf("signature descriptor %+v: want artifactType %s and the upstream's annotations", d, cosignSigType)
		}
	}
	if n := up.pages.Load(); n != 2 {
		t.Errorf("upstream answered %d referrers pages, want 2 (one descriptor a page, both followed)", n)
	}

	resp, got := referrersList(t, h, http.MethodGet, prefix, subject.Digest.String(), "artifactType="+url.QueryEscape(cosignSigType))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("OCI-Filters-Applied") != "artifactType" || !slices.Equal(got, sortedDigests(sig)) {
		t.Fatalf("filtered by artifactType: %d OCI-Filters-Applied=%q %v, want 200, artifactType, only the signature %s",
			resp.StatusCode, resp.Header.Get("OCI-Filters-Applied"), got, sig.Digest)
	}
	if c := resp.Header.Get(mirrorapi.HeaderCache); c != mirrorapi.CacheRevalidated {
		t.Errorf("second listing: %s=%q, want %q (no --tag-ttl: asked again)", mirrorapi.HeaderCache, c, mirrorapi.CacheRevalidated)
	}
	if resp, _ := referrersList(t, h, http.MethodHead, prefix, subject.Digest.String(), ""); resp.StatusCode != http.StatusOK ||
		resp.Header.Get("Content-Type") != string(types.OCIImageIndex) || resp.ContentLength <= 0 {
		t.Errorf("HEAD: %d %q Content-Length %d, want 200 with the headers of GET", resp.StatusCode, resp.Header.Get("Content-Type"), resp.ContentLength)
	}

	// The signature is a manifest like any: pulled through by digest, with its blobs.
	sigImg, err := remote.Image(ref(t, h.host+"/refs.test/"+repo+"@"+sig.Digest.String()))
	if err != nil {
		t.Fatalf("pull the signature through nodecache: %v", err)
	}
	layers, err := sigImg.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("signature layers: %v %v", layers, err)
	}
	if b, err := layerBytes(layers[0]); err != nil || string(b) != `{"critical":{}}` {
		t.Fatalf("signature payload through nodecache: %q %v", b, err)
	}
	if raw, _ := sigImg.RawManifest(); !strings.Contains(string(raw), subject.Digest.String()) {
		t.Fatalf("signature manifest lost its subject: %s", raw)
	}

	// Unknown repository: the upstream's 404, passed on.
	if resp, _ := referrersList(t, h, http.MethodGet, "/v2/refs.test/team/nope", subject.Digest.String(), ""); resp.StatusCode != http.StatusNotFound ||
		resp.Header.Get(mirrorapi.HeaderErrorCode) != "NAME_UNKNOWN" {
		t.Errorf("unknown repository: %d %s, want 404 NAME_UNKNOWN", resp.StatusCode, resp.Header.Get(mirrorapi.HeaderErrorCode))
	}

	up.srv.Close()
	resp, got = referrersList(t, h, http.MethodGet, prefix, subject.Digest.String(), "")
	if resp.StatusCode != http.StatusOK || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheStale || !slices.Equal(got, sortedDigests(sig, sbom)) {
		t.Fatalf("upstream stopped: %d %s=%q %v, want 200 stale with both referrers", resp.StatusCode, mirrorapi.HeaderCache,
			resp.Header.Get(mirrorapi.HeaderCache), got)
	}
	resp, _ = referrersList(t, h, http.MethodGet, prefix, other.Digest.String(), "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("upstream stopped, nothing cached: %d, want 503 (never an empty list)", resp.StatusCode)
	}
	if !strings.Contains(h.logs.String(), "serving the cached referrers list") {
		t.Errorf("the stale answer was not logged:\n%s", h.logs.String())
	}
	// A listing is an upstream exchange like any (issue 25, upstream health): the stopped
	// upstream's refusals are counted as connect failures.
	if n := failures(t, h, "refs.test", "connect"); n < 2 {
		t.Errorf(`nodecache_upstream_failures_total{upstream="refs.test",reason="connect"} = %v after two referrers listings of a stopped upstream, want >= 2`, n)
	}
}

// tagSchemaUpstream is distribution 3.1.2 (no referrers API) holding repo:v1, an image, whose
// descriptor it returns: the subject of the referrers tag schema tests.
func tagSchemaUpstream(t *testing.T, repo string) (*mirrortest.Registry, v1.Descriptor) {
	t.Helper()
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 4096, 1, "linux/amd64")
	up.PushImage(t, repo, "v1", img)
	subject, err := partialDescriptor(img)
	if err != nil {
		t.Fatal(err)
	}
	return up, subject
}

// TestReferrersTagSchema (issue 25): an upstream without the referrers API (distribution 3.1.2,
// whose 404 is plain text): the list is built from the referrers tag schema (the index
// go-containerregistry's push tags sha256-<hex>), pulled through; a subject without that tag is
// 200 with an empty index; with the upstream stopped the cached list is served, and a subject
// with nothing cached is 503. Fails before: 404 UNSUPPORTED for every request.
func TestReferrersTagSchema(t *testing.T) {
	t.Parallel()
	const repo = "team/app"
	up, subject := tagSchemaUpstream(t, repo)
	sig := pushRef(t, up.Addr, repo, "", artifact(t, cosignSigType, "application/vnd.dev.cosign.simplesigning.v1+json", `{"critical":{}}`, subject))
	tag := strings.Replace(subject.Digest.String(), ":", "-", 1)
	if _, err := remote.Head(ref(t, up.Addr+"/"+repo+":"+tag)); err != nil {
		t.Fatalf("the push wrote no referrers tag %s: %v", tag, err)
	}
	bare := mirrortest.Image(t, 4096, 1, "linux/amd64")
	up.PushImage(t, repo, "v2", bare)
	bareDigest := digestOf(t, bare)

	h := newHarnessFor(t, up)
	prefix := "/v2/upstream.test/" + repo
	pullImage(t, h.host+"/upstream.test/"+repo+":v1")
	pullImage(t, h.host+"/upstream.test/"+repo+":v2")

	resp, got := referrersList(t, h, http.MethodGet, prefix, subject.Digest.String(), "")
	if resp.StatusCode != http.StatusOK || !slices.Equal(got, sortedDigests(sig)) {
		t.Fatalf("tag schema: %d %v, want 200 with the signature %s", resp.StatusCode, got, sig.Digest)
	}
	if up.Count(http.MethodGet, "/manifests/"+tag) == 0 && up.Count(http.MethodHead, "/manifests/"+tag) == 0 {
		t.Errorf("the referrers tag %s was not asked of the upstream", tag)
	}
	resp, got = referrersList(t, h, http.MethodGet, prefix, bareDigest, "")
	if resp.StatusCode != http.StatusOK || len(got) != 0 {
		t.Fatalf("no referrers tag: %d %v, want 200 with an empty index", resp.StatusCode, got)
	}
	// An upstream without the API answers 404: a normal answer, not an upstream failure.
	for _, reason := range []string{"other", "http_5xx", "connect"} {
		if n := failures(t, h, "upstream.test", reason); n != 0 {
			t.Errorf("no referrers API: nodecache_upstream_failures_total{reason=%q} = %v, want 0 (the 404 is the answer)", reason, n)
		}
	}
	resp, got = referrersList(t, h, http.MethodGet, prefix, subject.Digest.String(), "artifactType="+url.QueryEscape(sbomType))
	if resp.StatusCode != http.StatusOK || len(got) != 0 || resp.Header.Get("OCI-Filters-Applied") != "artifactType" {
		t.Fatalf("filtered for an SBOM: %d %v %q, want 200, none, OCI-Filters-Applied", resp.StatusCode, got, resp.Header.Get("OCI-Filters-Applied"))
	}

	up.Stop()
	resp, got = referrersList(t, h, http.MethodGet, prefix, subject.Digest.String(), "")
	if resp.StatusCode != http.StatusOK || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheStale || !slices.Equal(got, sortedDigests(sig)) {
		t.Fatalf("upstream stopped: %d %s=%q %v, want 200 stale with the signature", resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache), got)
	}
	unknown := "sha256:" + strings.Repeat("ab", 32)
	if resp, _ := referrersList(t, h, http.MethodGet, prefix, unknown, ""); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("upstream stopped, nothing cached: %d, want 503 (never an empty list)", resp.StatusCode)
	}
}

// TestReferrersOffline (issue 25): the lists stored under a filesystem root are served by a
// nodecache whose upstream is offline ("hit"); a subject with none stored is 503 at once, never
// an empty list (nor the 404 of an offline miss, which a client reads as "no referrers API" and
// then finds no tag). Fails before: 404 UNSUPPORTED.
func TestReferrersOffline(t *testing.T) {
	t.Parallel()
	up := newReferrersUpstream(t, 10)
	const repo = "team/app"
	subject := pushRef(t, up.host, repo, "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
	sig := pushRef(t, up.host, repo, "", artifact(t, cosignSigType, "application/vnd.dev.cosign.simplesigning.v1+json", `{"critical":{}}`, subject))
	root := t.TempDir()
	h := newHarness(t, mirror.Options{Root: root, Upstreams: []regname.Upstream{up.upstream(t, "refs.test")}})
	pullImage(t, h.host+"/refs.test/"+repo+":v1")
	prefix := "/v2/refs.test/" + repo
	if resp, got := referrersList(t, h, http.MethodGet, prefix, subject.Digest.String(), ""); resp.StatusCode != http.StatusOK || !slices.Equal(got, sortedDigests(sig)) {
		t.Fatalf("online: %d %v", resp.StatusCode, got)
	}
	file := filepath.Join(root, filepath.FromSlash(cache.ReferrersPath("refs.test/"+repo, digest.Digest(subject.Digest.String()))))
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the list was not stored with its subject: %v", err)
	}
	h.close(t)

	h = newHarness(t, mirror.Options{Root: root, Upstreams: []regname.Upstream{parseUpstream(t, "refs.test=offline")}})
	resp, got := referrersList(t, h, http.MethodGet, prefix, subject.Digest.String(), "")
	if resp.StatusCode != http.StatusOK || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheHit || !slices.Equal(got, sortedDigests(sig)) {
		t.Fatalf("offline, stored: %d %s=%q %v, want 200 hit with the signature", resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache), got)
	}
	resp, _ = referrersList(t, h, http.MethodGet, prefix, sig.Digest.String(), "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("offline, nothing stored: %d, want 503", resp.StatusCode)
	}
}

// TestReferrersEvictedWithSubject (issue 25): a stored referrers list lives as long as its subject
// manifest: a pinned subject keeps it through evictions under the cap, an unpinned subject
// evicted takes it along, and cache rm of the subject removes it. Fails before: no list is
// stored at all (404 UNSUPPORTED).
func TestReferrersEvictedWithSubject(t *testing.T) {
	t.Parallel()
	up := newReferrersUpstream(t, 10)
	const repo = "team/app"
	var subjects []v1.Descriptor
	for i := range 3 {
		s := pushRef(t, up.host, repo, fmt.Sprintf("v%d", i), mirrortest.Image(t, 256<<10, 1, "linux/amd64"))
		pushRef(t, up.host, repo, "", artifact(t, cosignSigType, "application/vnd.dev.cosign.simplesigning.v1+json", fmt.Sprintf(`{"n":%d}`, i), s))
		subjects = append(subjects, s)
	}
	for i := range 3 {
		pushRef(t, up.host, "team/big", fmt.Sprintf("v%d", i), mirrortest.Image(t, 512<<10, 1, "linux/amd64"))
	}
	root := t.TempDir()
	h := newHarness(t, mirror.Options{Root: root, MaxSize: 1 << 20, Upstreams: []regname.Upstream{up.upstream(t, "refs.test")}})
	h.runReady(t)
	listFile := func(s v1.Descriptor) string {
		return filepath.Join(root, filepath.FromSlash(cache.ReferrersPath("refs.test/"+repo, digest.Digest(s.Digest.String()))))
	}
	for i, s := range subjects {
		pullImage(t, fmt.Sprintf("%s/refs.test/%s:v%d", h.host, repo, i))
		if resp, got := referrersList(t, h, http.MethodGet, "/v2/refs.test/"+repo, s.Digest.String(), ""); resp.StatusCode != http.StatusOK || len(got) != 1 {
			t.Fatalf("referrers of v%d: %d %v", i, resp.StatusCode, got)
		}
		if _, err := os.Stat(listFile(s)); err != nil {
			t.Fatalf("referrers list of v%d not stored: %v", i, err)
		}
	}
	if code := deleteImage(t, h.host, "refs.test/"+repo+"@"+subjects[2].Digest.String()); code != http.StatusOK {
		t.Fatalf("cache rm v2: %d", code)
	}
	if _, err := os.Stat(listFile(subjects[2])); !os.IsNotExist(err) {
		t.Errorf("cache rm of the subject left its referrers list: %v", err)
	}

	if code, _, msg := pinRequest(t, h, http.MethodPut, "refs.test/"+repo+"@"+subjects[0].Digest.String()); code != http.StatusOK {
		t.Fatalf("pin v0: %d %s", code, msg)
	}
	for i := range 3 {
		pullImage(t, fmt.Sprintf("%s/refs.test/team/big:v%d", h.host, i))
		h.waitIdle(t)
	}
	waitInventory(t, h.host, "v1 evicted under the cap", func(inv mirrorapi.CacheInventory) bool {
		return imageByDigest(inv, subjects[1].Digest.String()) == nil
	})
	if _, err := os.Stat(listFile(subjects[1])); !os.IsNotExist(err) {
		t.Errorf("the evicted subject's referrers list is still stored: %v", err)
	}
	if _, err := os.Stat(listFile(subjects[0])); err != nil {
		t.Errorf("the pinned subject's referrers list is gone: %v", err)
	}
	resp, got := referrersList(t, h, http.MethodGet, "/v2/refs.test/"+repo, subjects[0].Digest.String(), "")
	if resp.StatusCode != http.StatusOK || len(got) != 1 {
		t.Errorf("referrers of the pinned subject after the evictions: %d %v", resp.StatusCode, got)
	}
}

// TestReferrersPastBounds (issue 25, upstream health): an upstream whose Link headers never end
// (each page points to one more) makes a listing past its 64 pages: 502 UNKNOWN, counted as
// reason too_large as a tag list past its bounds is (both are lists nodecache refuses for their
// size). Fails before: reason other.
func TestReferrersPastBounds(t *testing.T) {
	t.Parallel()
	reg := mirrortest.NewRegistry(t)
	var pages atomic.Int64
	reg.Intercept("", "/referrers/", func(_ http.Handler, w http.ResponseWriter, r *http.Request) {
		n := pages.Add(1)
		w.Header().Set("Link", fmt.Sprintf(`<%s?page=%d>; rel="next"`, r.URL.Path, n))
		w.Header().Set("Content-Type", string(types.OCIImageIndex))
		_, _ = io.WriteString(w, `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}`)
	})
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "endless.test", reg)}})
	subject := digest.FromString("subject").String()
	resp, _ := referrersList(t, h, http.MethodGet, "/v2/endless.test/team/app", subject, "")
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(mirrorapi.HeaderErrorCode) != "UNKNOWN" {
		t.Fatalf("endless Link pages: %d %s, want 502 UNKNOWN", resp.StatusCode, resp.Header.Get(mirrorapi.HeaderErrorCode))
	}
	if n := pages.Load(); n != 64 {
		t.Errorf("upstream answered %d pages, want 64 (the bound)", n)
	}
	if got := failures(t, h, "endless.test", "too_large"); got != 1 {
		t.Errorf(`failures{reason="too_large"} %v, want 1 (other: %v)`, got, failures(t, h, "endless.test", "other"))
	}
}

// TestReferrersTagSchemaDuplicates: an index kept by the referrers tag schema that lists a
// referrer twice (every pushing client edits it) is answered with each referrer once, as the
// referrers API answers. Fails before: the signature listed twice.
func TestReferrersTagSchemaDuplicates(t *testing.T) {
	t.Parallel()
	const repo = "team/app"
	up, subject := tagSchemaUpstream(t, repo)
	sigImg := artifact(t, cosignSigType, "application/vnd.dev.cosign.simplesigning.v1+json", `{"critical":{}}`, subject)
	sig := pushRef(t, up.Addr, repo, "", sigImg)
	twice := mutate.IndexMediaType(mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: sigImg, Descriptor: sig}, mutate.IndexAddendum{Add: sigImg, Descriptor: sig}), types.OCIImageIndex)
	tag := strings.Replace(subject.Digest.String(), ":", "-", 1)
	if err := remote.WriteIndex(ref(t, up.Addr+"/"+repo+":"+tag), twice); err != nil {
		t.Fatalf("push the referrers tag %s: %v", tag, err)
	}

	h := newHarnessFor(t, up)
	pullImage(t, h.host+"/upstream.test/"+repo+":v1")
	resp, got := referrersList(t, h, http.MethodGet, "/v2/upstream.test/"+repo, subject.Digest.String(), "")
	if resp.StatusCode != http.StatusOK || !slices.Equal(got, sortedDigests(sig)) {
		t.Fatalf("tag schema index listing the signature twice: %d %v, want 200 with the signature %s once", resp.StatusCode, got, sig.Digest)
	}
}
