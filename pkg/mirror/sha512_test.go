package mirror_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestManifestBySHA512Cached (issue 23, known content): a manifest asked by its sha512 digest is
// fetched once, then served from the cache — also with the upstream stopped (before: asked
// upstream on every request, 503 once it was down, as distribution files manifests by sha256).
func TestManifestBySHA512Cached(t *testing.T) {
	t.Parallel()
	up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	d := digest.SHA512.FromBytes(raw)
	var asked atomic.Int64
	up.Intercept(http.MethodGet, "/manifests/sha512:", func(_ http.Handler, w http.ResponseWriter, req *http.Request) {
		if !strings.HasSuffix(req.URL.Path, d.String()) {
			http.NotFound(w, req)
			return
		}
		asked.Add(1)
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Docker-Content-Digest", d.String())
		_, _ = w.Write(raw)
	})
	h := newHarnessFor(t, up)
	url := fmtURL(h, "/v2/upstream.test/team/app/manifests/"+d.String())
	for i, want := range []string{mirrorapi.CacheMiss, mirrorapi.CacheHit, mirrorapi.CacheHit} {
		if i == 2 {
			up.Stop()
		}
		resp, body := get(t, http.MethodGet, url, manifestAccept)
		if resp.StatusCode != http.StatusOK || string(body) != string(raw) || resp.Header.Get("Docker-Content-Digest") != d.String() ||
			resp.Header.Get(mirrorapi.HeaderCache) != want {
			t.Fatalf("request %d: %d, digest %q, cache %q, %d bytes; want 200 with the manifest, %s", i, resp.StatusCode,
				resp.Header.Get("Docker-Content-Digest"), resp.Header.Get(mirrorapi.HeaderCache), len(body), want)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the upstream was asked for the sha512 manifest %d times, want once", n)
	}
}
