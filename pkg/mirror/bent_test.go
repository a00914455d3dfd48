package mirror_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// headAnswer sets the headers of the answer to an upstream HEAD and returns its status.
type headAnswer func(http.Header) int

// answerHeads makes up answer its HEADs of paths containing part with a instead of the registry.
func answerHeads(up *mirrortest.Registry, part string, a headAnswer) {
	up.Intercept(http.MethodHead, part, func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(a(w.Header()))
	})
}

// headStatus is a HEAD answer of status, without headers.
func headStatus(status int) headAnswer { return func(http.Header) int { return status } }

// refuseHead answers every blob's HEAD with status (for TestBlobHeadIsAHint's table).
func refuseHead(status int) func(int, string) headAnswer {
	return func(int, string) headAnswer { return headStatus(status) }
}

// headWith is a HEAD answer 200 with the headers set sets.
func headWith(set func(http.Header)) headAnswer {
	return func(h http.Header) int {
		set(h)
		return http.StatusOK
	}
}

// counts returns how many HEAD and GET requests the upstream saw on paths containing part.
func counts(up *mirrortest.Registry, part string) (heads, gets int) {
	return up.Count(http.MethodHead, part), up.Count(http.MethodGet, part)
}

// TestBlobHeadIsAHint: a cold blob is servable whatever the upstream's HEAD says: refused (401,
// 403, 404, 405), without Content-Length or Docker-Content-Digest, or with the wrong size. A
// client HEAD costs one upstream HEAD plus, only when that HEAD was no use, one GET of byte 0;
// a client GET one HEAD plus the GET.
func TestBlobHeadIsAHint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// head, when set, is the upstream's answer to a blob HEAD, given the blob's size and digest
		head func(size int, dgst string) headAnswer
		// what one client HEAD and one client GET cost upstream: HEADs and GETs each
		headCost, getCost [2]int
	}{
		{"upstream as it should be", nil, [2]int{1, 0}, [2]int{1, 1}},
		{"HEAD 401", refuseHead(http.StatusUnauthorized), [2]int{1, 1}, [2]int{1, 1}},
		{"HEAD 403", refuseHead(http.StatusForbidden), [2]int{1, 1}, [2]int{1, 1}},
		{"HEAD 404", refuseHead(http.StatusNotFound), [2]int{1, 1}, [2]int{1, 1}},
		{"HEAD 405", refuseHead(http.StatusMethodNotAllowed), [2]int{1, 1}, [2]int{1, 1}},
		{"HEAD without Content-Length", func(_ int, dgst string) headAnswer {
			return headWith(func(h http.Header) { h.Set("Docker-Content-Digest", dgst) })
		}, [2]int{1, 1}, [2]int{1, 1}},
		{"HEAD without Docker-Content-Digest", func(size int, _ string) headAnswer {
			return headWith(func(h http.Header) { h.Set("Content-Length", strconv.Itoa(size)) })
		}, [2]int{1, 1}, [2]int{1, 1}},
		{"HEAD with the wrong size, GET wins", func(size int, dgst string) headAnswer {
			return headWith(func(h http.Header) {
				h.Set("Content-Length", strconv.Itoa(size+100))
				h.Set("Docker-Content-Digest", dgst)
			})
		}, [2]int{1, 0}, [2]int{1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 8192)
			d, data := mirrortest.LayerBlob(t, img, 0)
			dgst := d.String()
			if tc.head != nil {
				answerHeads(up, "/blobs/", tc.head(len(data), dgst))
			}
			for _, method := range []string{http.MethodHead, http.MethodGet} {
				h := newHarnessFor(t, up)
				up.ResetRequests()
				resp, body := get(t, method, fmtURL(h, "/v2/upstream.test/team/app/blobs/"+dgst), nil)
				wantCL := strconv.Itoa(len(data))
				if tc.name == "HEAD with the wrong size, GET wins" && method == http.MethodHead {
					wantCL = strconv.Itoa(len(data) + 100) // a HEAD cannot know better than the upstream's HEAD
				}
				if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") != dgst ||
					resp.Header.Get("Content-Length") != wantCL || resp.Header.Get("Content-Type") != "application/octet-stream" {
					t.Errorf("%s: %d Content-Length=%q Docker-Content-Digest=%q Content-Type=%q; want 200, %s, %s",
						method, resp.StatusCode, resp.Header.Get("Content-Length"), resp.Header.Get("Docker-Content-Digest"),
						resp.Header.Get("Content-Type"), wantCL, dgst)
				}
				if method == http.MethodGet && !bytes.Equal(body, data) {
					t.Errorf("GET: %d bytes, not the blob", len(body))
				}
				_ = h.m.WaitIdle(t.Context())
				want := tc.headCost
				if method == http.MethodGet {
					want = tc.getCost
				}
				if heads, gets := counts(up, "/blobs/"); heads != want[0] || gets != want[1] {
					t.Errorf("client %s: upstream saw %d HEAD and %d GET, want %d and %d", method, heads, gets, want[0], want[1])
				}
			}
		})
	}
}

// TestBlobUnknownIsTheGETsWord: a blob the upstream does not have is a 404 BLOB_UNKNOWN for HEAD
// and GET, decided by the GET when the HEAD is refused.
func TestBlobUnknownIsTheGETsWord(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 512)
	answerHeads(up, "/blobs/", headStatus(http.StatusForbidden))
	h := newHarnessFor(t, up)
	missing := "sha256:" + strings.Repeat("ab", 32)
	for _, method := range []string{http.MethodHead, http.MethodGet} {
		resp, body := get(t, method, fmtURL(h, "/v2/upstream.test/team/app/blobs/"+missing), nil)
		if resp.StatusCode != http.StatusNotFound || (method == http.MethodGet && !strings.Contains(string(body), "BLOB_UNKNOWN")) {
			t.Errorf("%s unknown blob: %d %s; want 404 BLOB_UNKNOWN", method, resp.StatusCode, body)
		}
	}
}

// TestBlobWithoutLength: an upstream whose HEAD is refused and whose GET streams without a
// length (chunked): the blob still streams to the client, is verified, and only then stored.
func TestBlobWithoutLength(t *testing.T) {
	t.Parallel()
	f := newBlobFixture(t, 3*mirrortest.MiB, mirror.Options{})
	data, dgst := f.data, f.digest
	f.withoutLength(0)
	url := f.url()
	resp, body := get(t, http.MethodGet, url, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, data) || resp.Header.Get("Docker-Content-Digest") != dgst {
		t.Fatalf("cold GET without upstream length: %d, %d bytes (want %d)", resp.StatusCode, len(body), len(data))
	}
	f.h.waitIdle(t)
	resp, body = get(t, http.MethodGet, url, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, data) || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheHit ||
		resp.Header.Get("Content-Length") != strconv.Itoa(len(data)) {
		t.Fatalf("warm GET: %d %s=%q Content-Length=%q, %d bytes", resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache), resp.Header.Get("Content-Length"), len(body))
	}
}

// manifestUpstream answers every manifest request (team/app:v1, or any other reference) with body
// as Content-Type ct (none when ""); it returns the upstream and the digest of body.
func manifestUpstream(t *testing.T, ct string, body []byte) (*mirrortest.Registry, string) {
	t.Helper()
	sum := sha256.Sum256(body)
	dgst := "sha256:" + hex.EncodeToString(sum[:])
	up := mirrortest.NewRegistry(t)
	up.Intercept("", "/manifests/", func(_ http.Handler, w http.ResponseWriter, r *http.Request) {
		if ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		w.Header().Set("Docker-Content-Digest", dgst)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method == http.MethodGet {
			_, _ = w.Write(body)
		}
	})
	return up, dgst
}

// schema1Manifest is a Docker schema 1 manifest of team/app:v1.
var schema1Manifest = []byte(`{"schemaVersion":1,"name":"team/app","tag":"v1","architecture":"amd64","fsLayers":[],"history":[]}`)

// TestSchema1IsPermanent: a schema 1 manifest, announced as such or only recognisable by its
// bytes, is a 400 MANIFEST_INVALID saying "schema 1 manifests are not supported", every time,
// by tag and by digest, never a 503.
func TestSchema1IsPermanent(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{
		"application/vnd.docker.distribution.manifest.v1+prettyjws",
		"application/vnd.docker.distribution.manifest.v1+json",
		"application/json",
		"text/plain",
		"",
	} {
		t.Run("Content-Type "+ct, func(t *testing.T) {
			t.Parallel()
			up, dgst := manifestUpstream(t, ct, schema1Manifest)
			h := newHarnessFor(t, up)
			for i, ref := range []string{"v1", dgst, "v1"} {
				resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/"+ref), manifestAccept)
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":"MANIFEST_INVALID"`) ||
					!strings.Contains(string(body), "schema 1 manifests are not supported") {
					t.Errorf("request %d (%s): %d %s; want 400 MANIFEST_INVALID saying schema 1 manifests are not supported", i, ref, resp.StatusCode, body)
				}
			}
			// No retries upstream: at most one HEAD and one GET per client request.
			if heads, gets := counts(up, "/manifests/"); heads > 2 || gets > 3 {
				t.Errorf("upstream saw %d HEAD and %d GET for three client requests", heads, gets)
			}
		})
	}
}

// TestManifestTypedByBytes: a manifest whose Content-Type is not a manifest media type is typed
// by its bytes; the client gets the real media type, the digest of the bytes and the bytes.
// Anything else is the upstream's wrong answer: 502 naming it (issue 23; it was a 400
// MANIFEST_INVALID, which says the client's request was at fault).
func TestManifestTypedByBytes(t *testing.T) {
	t.Parallel()
	img := mirrortest.Image(t, 512, 1, "linux/amd64")
	raw, _ := img.RawManifest()
	idx := mirrortest.MultiPlatformIndex(t, 512, 1)
	rawIdx, _ := idx.RawManifest()
	noType := bytes.Replace(raw, []byte(`"mediaType":"application/vnd.oci.image.manifest.v1+json",`), nil, 1)
	if bytes.Equal(noType, raw) {
		t.Fatalf("test manifest has no mediaType to remove: %s", raw)
	}
	noTypeIdx := bytes.Replace(rawIdx, []byte(`"mediaType":"application/vnd.oci.image.index.v1+json",`), nil, 1)
	for _, tc := range []struct {
		name, ct string
		body     []byte
		status   int
		wantType string
	}{
		{"octet-stream with mediaType", "application/octet-stream", raw, 200, "application/vnd.oci.image.manifest.v1+json"},
		{"text/plain index", "text/plain; charset=utf-8", rawIdx, 200, "application/vnd.oci.image.index.v1+json"},
		{"json without mediaType: config and layers", "application/json", noType, 200, "application/vnd.oci.image.manifest.v1+json"},
		{"no Content-Type, no mediaType: manifests", "", noTypeIdx, 200, "application/vnd.oci.image.index.v1+json"},
		{"binary/octet-stream that is no manifest", "binary/octet-stream", []byte(`{"hello":"world"}`), 502, ""},
		{"not JSON", "application/octet-stream", []byte("\x00\x01garbage"), 502, ""},
		{"a manifest media type, a body that is none", "application/vnd.oci.image.manifest.v1+json", []byte(`{"layers":"x"}`), 502, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up, dgst := manifestUpstream(t, tc.ct, tc.body)
			h := newHarnessFor(t, up)
			for _, ref := range []string{"v1", dgst} {
				resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/"+ref), manifestAccept)
				if resp.StatusCode != tc.status {
					t.Fatalf("%s: %d %s; want %d", ref, resp.StatusCode, body, tc.status)
				}
				if tc.status != 200 {
					if !strings.Contains(string(body), "not an OCI or Docker manifest or index") || resp.Header.Get(mirrorapi.HeaderErrorCode) == "" {
						t.Errorf("%s: body %s (error code header %q); want one naming what is wrong", ref, body, resp.Header.Get(mirrorapi.HeaderErrorCode))
					}
					continue
				}
				if ct := resp.Header.Get("Content-Type"); ct != tc.wantType || resp.Header.Get("Docker-Content-Digest") != dgst || !bytes.Equal(body, tc.body) {
					t.Errorf("%s: Content-Type %q digest %q, bytes equal %v; want %q %s", ref, ct, resp.Header.Get("Docker-Content-Digest"), bytes.Equal(body, tc.body), tc.wantType, dgst)
				}
			}
			if _, gets := counts(up, "/manifests/"); gets > 2 {
				t.Errorf("upstream saw %d manifest GETs for two client requests", gets)
			}
		})
	}
}

// TestTagHeadRefused: a tag whose upstream HEAD is refused (401, 403, 404, 405) is resolved by
// the GET: one upstream HEAD and one GET, the right digest for the client.
func TestTagHeadRefused(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 512)
			answerHeads(up, "/manifests/", headStatus(status))
			h := newHarnessFor(t, up)
			up.ResetRequests()
			resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") != digestOf(t, img) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if heads, gets := counts(up, "/manifests/"); heads != 1 || gets != 1 {
				t.Errorf("upstream saw %d HEAD and %d GET, want 1 and 1", heads, gets)
			}
			resp, body = get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/nope"), manifestAccept)
			if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "MANIFEST_UNKNOWN") {
				t.Errorf("unknown tag: %d %s; want 404 MANIFEST_UNKNOWN", resp.StatusCode, body)
			}
		})
	}
}
