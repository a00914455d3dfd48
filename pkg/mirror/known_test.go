package mirror_test

import (
	"net/http"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// TestKnownBlobsWithoutUpstream (issue 23, known content): the empty blob and the OCI empty JSON
// "{}" are answered from their digest, in any repository, with the upstream unreachable: GET,
// HEAD and a Range, as hits. Before, a cold HEAD of the empty blob was 503 when the upstream
// gave no size (its 0-0 probe gets a correct 416), and both were 503 with the upstream down.
func TestKnownBlobsWithoutUpstream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{{Name: "upstream.test", URL: mustURL(t, "http://127.0.0.1:1")}}})
	for _, content := range []string{"", "{}"} {
		d := digest.FromString(content)
		for _, repo := range []string{"team/app", "any/other"} {
			url := fmtURL(h, "/v2/upstream.test/"+repo+"/blobs/"+d.String())
			resp, body := get(t, http.MethodGet, url, nil)
			if resp.StatusCode != http.StatusOK || string(body) != content || resp.Header.Get("Docker-Content-Digest") != d.String() ||
				resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheHit {
				t.Errorf("GET %s in %s: %d %q, digest %q, cache %q; want 200 with its bytes, a hit", d, repo, resp.StatusCode, body,
					resp.Header.Get("Docker-Content-Digest"), resp.Header.Get(mirrorapi.HeaderCache))
			}
			resp, _ = get(t, http.MethodHead, url, nil)
			if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(content)) {
				t.Errorf("HEAD %s in %s: %d, length %d; want 200, %d", d, repo, resp.StatusCode, resp.ContentLength, len(content))
			}
		}
	}
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/blobs/"+digest.FromString("{}").String()), http.Header{"Range": {"bytes=0-0"}})
	if resp.StatusCode != http.StatusPartialContent || string(body) != "{" {
		t.Errorf("Range 0-0 of {}: %d %q; want 206 \"{\"", resp.StatusCode, body)
	}
}
