package mirror_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestPullThrough pulls a multi-platform image (OCI index, linux/amd64 and linux/arm64, two
// attestation manifests, layers of several MiB) from a real upstream registry through nodecache
// with go-containerregistry (path prefix) and containerd's resolver (?ns=, and ?ns= with an
// override_path prefix), then again with the upstream stopped.
//
//nolint:paralleltest // the subtests are steps in order: each pulls what the previous one cached
func TestPullThrough(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	idx := mirrortest.MultiPlatformIndex(t, 3*mirrortest.MiB, 2)
	up.PushIndex(t, "team/app", "v1", idx)
	wantDigest := digestOf(t, idx)

	h := newHarnessFor(t, up)
	up.ResetRequests()

	t.Run("a: go-containerregistry through the path prefix", func(t *testing.T) {
		before := h.registryRequests()
		got := pullIndexGGCR(t, ref(t, h.host+"/upstream.test/team/app:v1"))
		if d := digestOf(t, got); d != wantDigest {
			t.Fatalf("index digest %s, want %s", d, wantDigest)
		}
		served := h.registryRequests() - before
		lines := h.logs.requests(t)
		if int64(len(lines)) != served {
			t.Fatalf("%d access-log lines for %d requests", len(lines), served)
		}
		for _, l := range lines {
			for _, k := range []string{"method", "upstream", "repository", "kind", "reference", "status", "bytes", "duration_ms", "cache", "client", "user_agent"} {
				if _, ok := l[k]; !ok {
					t.Fatalf("access-log line lacks %q: %v", k, l)
				}
			}
			if l["kind"] != "base" && (l["upstream"] != "upstream.test" || l["repository"] != "team/app") {
				t.Fatalf("request routed to %v/%v, want upstream.test/team/app", l["upstream"], l["repository"])
			}
		}
		if n := up.Count(http.MethodGet, "/blobs/"); n == 0 {
			t.Fatal("upstream saw no blob GET: the pull did not go through the cache")
		}
	})

	// pullWithHosts pulls the image with containerd configured by the hosts.toml tree src, which
	// must send its requests with ?ns= to paths under pathPrefix.
	pullWithHosts := func(t *testing.T, src, pathPrefix string) {
		t.Helper()
		desc := pullContainerd(t, hostsDir(t, src, h.host), "upstream.test/team/app:v1")
		if desc.Digest.String() != wantDigest {
			t.Fatalf("resolved %s, want %s", desc.Digest, wantDigest)
		}
		assertNSRequests(t, h, pathPrefix)
	}

	t.Run("b: containerd resolver with ?ns=", func(t *testing.T) {
		h.waitIdle(t)
		blobGETs := up.Count(http.MethodGet, "/blobs/")
		pullWithHosts(t, "testdata/hosts", "/v2/team/app/")
		if n := up.Count(http.MethodGet, "/blobs/"); n != blobGETs {
			t.Fatalf("second pull fetched %d blobs from the upstream again", n-blobGETs)
		}
	})

	t.Run("b: containerd resolver with override_path (prefix and ?ns=)", func(t *testing.T) {
		pullWithHosts(t, "testdata/hosts-override", "/v2/upstream.test/team/app/")
	})

	t.Run("c: served with the upstream stopped", func(t *testing.T) {
		h.waitIdle(t)
		up.Stop()
		up.ResetRequests()
		got := pullIndexGGCR(t, ref(t, h.host+"/upstream.test/team/app:v1"))
		if d := digestOf(t, got); d != wantDigest {
			t.Fatalf("by tag: digest %s, want %s", d, wantDigest)
		}
		pullIndexGGCR(t, ref(t, h.host+"/upstream.test/team/app@"+wantDigest))
		resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
		if c := resp.Header.Get(mirrorapi.HeaderCache); c != mirrorapi.CacheStale {
			t.Fatalf("tag with upstream down: %s = %q, want %q", mirrorapi.HeaderCache, c, mirrorapi.CacheStale)
		}
		resp, _ = get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/"+wantDigest), manifestAccept)
		if c := resp.Header.Get(mirrorapi.HeaderCache); c != mirrorapi.CacheHit {
			t.Fatalf("digest with upstream down: %s = %q, want %q", mirrorapi.HeaderCache, c, mirrorapi.CacheHit)
		}
		dir := hostsDir(t, "testdata/hosts", h.host)
		pullContainerd(t, dir, "upstream.test/team/app:v1")
		if n := len(up.Requests()); n != 0 {
			t.Fatalf("stopped upstream got %d requests", n)
		}
	})
}

func assertNSRequests(t *testing.T, h *harness, pathPrefix string) {
	t.Helper()
	n := 0
	for _, l := range h.logs.requests(t) {
		p, _ := l["path"].(string)
		q, _ := l["query"].(string)
		if strings.HasPrefix(p, pathPrefix) && strings.Contains(q, "ns=upstream.test") {
			n++
			if l["upstream"] != "upstream.test" || l["repository"] != "team/app" {
				t.Fatalf("request %s?%s routed to %v/%v", p, q, l["upstream"], l["repository"])
			}
		}
	}
	if n == 0 {
		t.Fatalf("no request with path %s and ns=upstream.test in the access log", pathPrefix)
	}
}

// TestRefusals: pushes are refused, and an unknown ?ns= is refused without any upstream contact.
func TestRefusals(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	h := newHarnessFor(t, up)

	err := remote.Write(ref(t, h.host+"/upstream.test/pushed:v1"), mirrortest.Image(t, 1024, 1, "linux/amd64"), remote.WithContext(t.Context()))
	var te *transport.Error
	if !errors.As(err, &te) || te.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("push: %v, want HTTP 405", err)
	}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		resp, body := get(t, method, fmtURL(h, "/v2/upstream.test/x/blobs/uploads/"), nil)
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(string(body), `"UNSUPPORTED"`) {
			t.Fatalf("%s: %d %s, want 405 UNSUPPORTED", method, resp.StatusCode, body)
		}
	}

	up.ResetRequests()
	for _, path := range []string{
		"/v2/team/app/manifests/v1?ns=evil.example.com",
		"/v2/team/app/blobs/sha256:" + strings.Repeat("a", 64) + "?ns=169.254.169.254",
		"/v2/unknown.test/team/app/manifests/v1",
	} {
		resp, body := get(t, http.MethodGet, fmtURL(h, path), manifestAccept)
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `"errors"`) {
			t.Fatalf("GET %s: %d %s, want 404 with an OCI error body", path, resp.StatusCode, body)
		}
	}
	// (The refused push above may still have blob HEADs in flight: count only this repository.)
	if n := up.Count("", "team/app"); n != 0 {
		t.Fatalf("upstream got %d requests for refused names", n)
	}
}

// TestUpstreamDownAtStart: nodecache starts while its upstream is down and serves as soon as
// the upstream comes up, without a restart.
func TestUpstreamDownAtStart(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewStoppedRegistry(t, "")
	h := newHarnessFor(t, up)

	resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("upstream down, nothing cached: %d, want 503", resp.StatusCode)
	}
	resp, _ = get(t, http.MethodGet, fmtURL(h, "/readyz"), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz with the upstream down: %d, want 200 (the cache can serve)", resp.StatusCode)
	}

	up.Start(t)
	idx := mirrortest.MultiPlatformIndex(t, 64<<10, 1)
	up.PushIndex(t, "team/app", "v1", idx)
	got := pullIndexGGCR(t, ref(t, h.host+"/upstream.test/team/app:v1"))
	if digestOf(t, got) != digestOf(t, idx) {
		t.Fatal("wrong index after the upstream came up")
	}
}

// TestBlackholedUpstream: an upstream that accepts and never answers costs a cached tag at most
// the upstream timeout; an uncached one fails within it.
func TestBlackholedUpstream(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	const timeout = 2 * time.Second
	h := newHarness(t, mirror.Options{
		Upstreams:       []name.Upstream{upstreamFor(t, "upstream.test", up)},
		UpstreamTimeout: timeout,
	})
	url := fmtURL(h, "/v2/upstream.test/team/app/manifests/v1")
	if resp, _ := get(t, http.MethodGet, url, manifestAccept); resp.StatusCode != http.StatusOK {
		t.Fatalf("warm-up: %d", resp.StatusCode)
	}
	// From now on the upstream accepts requests and never answers them.
	up.Intercept("", "", func(_ http.Handler, _ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	start := time.Now()
	resp, _ := get(t, http.MethodGet, url, manifestAccept)
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheStale {
		t.Fatalf("cached tag with a black-holed upstream: %d %s=%q, want 200 stale", resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache))
	}
	if took > timeout+2*time.Second {
		t.Fatalf("cached tag took %s with --upstream-timeout %s", took, timeout)
	}

	// A TCP-level black hole (connection accepted, not even HTTP answered), uncached.
	hole := mirrortest.Blackhole(t)
	h2 := newHarness(t, mirror.Options{
		Upstreams:       []name.Upstream{{Name: "hole.test", URL: mustURL(t, "http://"+hole)}},
		UpstreamTimeout: timeout,
	})
	start = time.Now()
	resp, _ = get(t, http.MethodGet, fmtURL(h2, "/v2/hole.test/x/manifests/v1"), manifestAccept)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("uncached tag, black-holed upstream: %d, want 503", resp.StatusCode)
	}
	if took := time.Since(start); took > timeout+2*time.Second {
		t.Fatalf("uncached tag took %s with --upstream-timeout %s", took, timeout)
	}
}

// TestSameRepositoryTwoUpstreams: one repository name under two upstreams stays two
// repositories.
func TestSameRepositoryTwoUpstreams(t *testing.T) {
	t.Parallel()
	a, b := mirrortest.NewRegistry(t), mirrortest.NewRegistry(t)
	ia, ib := mirrortest.Image(t, 4096, 1, "linux/amd64"), mirrortest.Image(t, 4096, 1, "linux/amd64")
	a.PushImage(t, "team/app", "v1", ia)
	b.PushImage(t, "team/app", "v1", ib)
	h := newHarness(t, mirror.Options{Upstreams: []name.Upstream{upstreamFor(t, "a.test", a), upstreamFor(t, "b.test", b)}})

	for _, tc := range []struct {
		name, path string
		want       string
	}{
		{"prefix a", "/v2/a.test/team/app/manifests/v1", digestOf(t, ia)},
		{"prefix b", "/v2/b.test/team/app/manifests/v1", digestOf(t, ib)},
		{"ns a", "/v2/team/app/manifests/v1?ns=a.test", digestOf(t, ia)},
		{"ns b", "/v2/team/app/manifests/v1?ns=b.test", digestOf(t, ib)},
	} {
		resp, _ := get(t, http.MethodGet, fmtURL(h, tc.path), manifestAccept)
		if got := resp.Header.Get("Docker-Content-Digest"); resp.StatusCode != http.StatusOK || got != tc.want {
			t.Fatalf("%s: %d %s, want %s", tc.name, resp.StatusCode, got, tc.want)
		}
	}
	// A blob of a's image is not served for b's repository, even though it is cached.
	d := mirrortest.LayerDigests(t, ia)[0]
	if resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/a.test/team/app/blobs/"+d.String()), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("blob from a: %d", resp.StatusCode)
	}
	if resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/b.test/team/app/blobs/"+d.String()), nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a's blob asked under b: %d, want 404", resp.StatusCode)
	}
}
