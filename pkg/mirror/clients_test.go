package mirror_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// Client evidence counts every request per user-agent family, and separately only successful
// content (GET/HEAD of a manifest or blob answered 200/206): pings, errors and refused methods
// are seen but are no proof that a runtime pulls through the mirror.
func TestClientEvidenceContent(t *testing.T) {
	t.Parallel()
	up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	h := newHarness(t, mirror.Options{Root: t.TempDir(), Upstreams: []regname.Upstream{upstreamFor(t, "up.test", up)}})
	blob := mirrortest.LayerDigests(t, img)[0]
	base := "http://" + h.host
	do := func(method, path, ua string, hdr ...string) int {
		t.Helper()
		h := http.Header{}
		h.Set("User-Agent", ua)
		h.Set("Accept", "application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json")
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Set(hdr[i], hdr[i+1])
		}
		resp, _ := get(t, method, base+path, h)
		return resp.StatusCode
	}
	const cd = "containerd/v2.4.2"
	before := time.Now()
	for _, r := range []struct {
		method, path, ua string
		hdr              []string
		code             int
	}{
		{"GET", "/v2/", cd, nil, 200},
		{"GET", "/v2/team/app/manifests/missing?ns=up.test", cd, nil, 404},
		{"PUT", "/v2/team/app/manifests/v1?ns=up.test", cd, nil, 405},
		{"GET", "/v2/team/app/tags/list?ns=up.test", cd, nil, 0},
		{"GET", "/v2/team/app/manifests/v1?ns=up.test", "cri-o/1.31.0", nil, 200},
	} {
		if got := do(r.method, r.path, r.ua, r.hdr...); r.code != 0 && got != r.code {
			t.Fatalf("%s %s: %d, want %d", r.method, r.path, got, r.code)
		}
	}
	doc := evidence(t, base)
	if !doc.Now.After(before) {
		t.Fatalf("evidence now %s, want the mirror's clock (after %s)", doc.Now, before)
	}
	rec := agent(t, doc, "containerd")
	if rec.Count != 4 || rec.ContentCount != 0 || !rec.LastContent.IsZero() {
		t.Fatalf("containerd after pings and errors: %+v, want 4 requests and no content", rec)
	}
	if c := agent(t, doc, "cri-o"); c.ContentCount != 1 {
		t.Fatalf("cri-o manifest GET: %+v, want one content request", c)
	}

	mid := time.Now()
	if got := do("HEAD", "/v2/team/app/manifests/v1?ns=up.test", cd); got != 200 {
		t.Fatalf("HEAD manifest: %d", got)
	}
	if got := do("GET", "/v2/team/app/blobs/"+blob.String()+"?ns=up.test", cd, "Range", "bytes=0-9"); got != 206 && got != 200 {
		t.Fatalf("ranged blob GET: %d", got)
	}
	rec = agent(t, evidence(t, base), "containerd")
	if rec.Count != 6 || rec.ContentCount != 2 || rec.LastContent.Before(mid) {
		t.Fatalf("containerd after a HEAD manifest and a blob GET: %+v, want 6 requests, 2 content, last after %s", rec, mid)
	}
}

func evidence(t *testing.T, base string) mirrorapi.ClientEvidence {
	t.Helper()
	_, body := get(t, http.MethodGet, base+mirrorapi.ClientsPath, nil)
	var doc mirrorapi.ClientEvidence
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

func agent(t *testing.T, doc mirrorapi.ClientEvidence, family string) mirrorapi.AgentRecord {
	t.Helper()
	for _, c := range doc.Clients {
		if r := c.UserAgents[family]; r != nil {
			return *r
		}
	}
	t.Fatalf("no %s in %+v", family, doc)
	return mirrorapi.AgentRecord{}
}
