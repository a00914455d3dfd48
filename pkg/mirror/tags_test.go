package mirror_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

func TestTagSemantics(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	h := newHarnessFor(t, up)
	url := fmtURL(h, "/v2/upstream.test/team/app/manifests/v1")

	expect := func(step string, status int, cache string) *http.Response {
		t.Helper()
		resp, _ := get(t, http.MethodGet, url, manifestAccept)
		if resp.StatusCode != status || resp.Header.Get(mirrorapi.HeaderCache) != cache {
			t.Fatalf("%s: %d %s=%q, want %d %q", step, resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache), status, cache)
		}
		return resp
	}
	expect("first", http.StatusOK, mirrorapi.CacheMiss)
	expect("second", http.StatusOK, mirrorapi.CacheRevalidated)

	// The tag moves upstream: the next request follows it.
	img2 := mirrortest.Image(t, 1024, 1, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img2)
	if resp := expect("moved", http.StatusOK, mirrorapi.CacheMiss); resp.Header.Get("Docker-Content-Digest") != digestOf(t, img2) {
		t.Fatalf("moved tag served %s", resp.Header.Get("Docker-Content-Digest"))
	}

	// 429 with a cached tag: stale; uncached: the 429 and its Retry-After reach the client.
	up.Intercept("", "/manifests/", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "42")
		http.Error(w, `{"errors":[{"code":"TOOMANYREQUESTS"}]}`, http.StatusTooManyRequests)
	})
	expect("429 cached", http.StatusOK, mirrorapi.CacheStale)
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/other/manifests/v1"), manifestAccept)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "42" || resp.Header.Get(mirrorapi.HeaderCache) != "" {
		t.Fatalf("429 uncached: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	// 5xx: stale.
	up.Intercept("", "", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusBadGateway)
	})
	expect("502 cached", http.StatusOK, mirrorapi.CacheStale)

	// A tag the upstream does not have is a 404, not a stale answer.
	up.Wrap(nil)
	resp, _ = get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/nope"), manifestAccept)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown tag: %d, want 404", resp.StatusCode)
	}
}

func TestTagTTL(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	clock := mirrortest.NewClock(time.Now())
	h := newHarness(t, mirror.Options{
		Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)},
		TagTTL:    time.Hour,
		Clock:     clock.Now,
	})
	up.ResetRequests()
	url := fmtURL(h, "/v2/upstream.test/team/app/manifests/v1")
	for _, step := range []struct {
		advance time.Duration // the clock moves on first
		answers []string      // X-Cache of each request
		heads   int           // upstream HEADs in all after the step
		what    string
	}{
		{0, []string{mirrorapi.CacheMiss, mirrorapi.CacheHit, mirrorapi.CacheHit}, 1, "--tag-ttl 1h"},
		// An hour later the tag is no longer fresh: revalidated upstream, then fresh again.
		{time.Hour, []string{mirrorapi.CacheRevalidated, mirrorapi.CacheHit}, 2, "after the TTL"},
	} {
		clock.Advance(step.advance)
		for i, want := range step.answers {
			resp, _ := get(t, http.MethodGet, url, manifestAccept)
			if c := resp.Header.Get(mirrorapi.HeaderCache); c != want {
				t.Fatalf("%s, request %d: %s=%q, want %q", step.what, i, mirrorapi.HeaderCache, c, want)
			}
		}
		if n := up.Count(http.MethodHead, "/manifests/v1"); n != step.heads {
			t.Fatalf("%s: %d upstream HEADs in all, want %d", step.what, n, step.heads)
		}
	}
}

// TestTagHeadWithoutDigest: an upstream whose HEAD names no digest still works; the manifest is
// fetched to learn it, and the answer says so (miss).
func TestTagHeadWithoutDigest(t *testing.T) {
	t.Parallel()
	up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	up.Intercept(http.MethodHead, "/manifests/", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.WriteHeader(http.StatusOK)
	})
	h := newHarnessFor(t, up)
	resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") != digestOf(t, img) || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheMiss {
		t.Fatalf("HEAD without digest: %d %s %s=%q", resp.StatusCode, resp.Header.Get("Docker-Content-Digest"), mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache))
	}
}

// TestManifestCoalesced: concurrent requests for one cold manifest make one upstream fetch; the
// requests that joined it say so.
func TestManifestCoalesced(t *testing.T) {
	t.Parallel()
	up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	up.Intercept(http.MethodGet, "/manifests/sha256:", func(next http.Handler, w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		next.ServeHTTP(w, r)
	})
	h := newHarnessFor(t, up)
	up.ResetRequests()
	url := fmtURL(h, "/v2/upstream.test/team/app/manifests/"+digestOf(t, img))
	caches := make(chan string, 6)
	for i := 0; i < cap(caches); i++ {
		go func() {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header = manifestAccept.Clone()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				caches <- "error: " + err.Error()
				return
			}
			resp.Body.Close()
			caches <- resp.Header.Get(mirrorapi.HeaderCache)
		}()
	}
	count := map[string]int{}
	for i := 0; i < cap(caches); i++ {
		count[<-caches]++
	}
	gets := up.Count(http.MethodGet, "/manifests/sha256:")
	if gets != 1 || count[mirrorapi.CacheMiss] != 1 || count[mirrorapi.CacheCoalesced] != cap(caches)-1 {
		t.Fatalf("%d upstream GETs, answers %v; want 1 GET, one miss, the rest coalesced", gets, count)
	}
}

// TestRetryAfterFromPing: a 429 at the upstream's /v2/ ping (before any manifest request) still
// reaches the client with its Retry-After when nothing is cached.
func TestRetryAfterFromPing(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.Intercept("", "", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "17")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	})
	h := newHarnessFor(t, up)
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "17" {
		t.Fatalf("429 at ping: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}
