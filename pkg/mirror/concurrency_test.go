package mirror_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// heldUpstream is a registry with the images team/a:v1 and team/b:v1 whose manifest GETs of
// team/a wait, once they arrived (arrived is closed), until the test closes release: a request
// that holds one of nodecache's upstream slots for as long as the test wants.
type heldUpstream struct {
	up               *mirrortest.Registry
	a, b             string // manifest digests
	arrived, release chan struct{}
}

func newHeldUpstream(t *testing.T) *heldUpstream {
	t.Helper()
	up := mirrortest.NewRegistry(t)
	imgA, imgB := mirrortest.Image(t, 512, 1, "linux/amd64"), mirrortest.Image(t, 512, 1, "linux/amd64")
	up.PushImage(t, "team/a", "v1", imgA)
	up.PushImage(t, "team/b", "v1", imgB)
	da, _ := imgA.Digest()
	db, _ := imgB.Digest()
	u := &heldUpstream{up: up, a: da.String(), b: db.String(), arrived: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	up.Intercept(http.MethodGet, "/team/a/manifests/", func(next http.Handler, w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(u.arrived) })
		<-u.release
		next.ServeHTTP(w, r)
	})
	up.ResetRequests()
	return u
}

// longHeaderTransport is the test transport with a response-header timeout far past the
// upstream timeout, so a held upstream answer holds its slot as long as the test wants.
func longHeaderTransport() *http.Transport { return testTransport(time.Minute) }

// oneSlotMirror is nodecache in front of u with --upstream-concurrency 1 and --upstream-timeout
// timeout, whose transport waits for held response headers (longHeaderTransport).
func (u *heldUpstream) oneSlotMirror(t *testing.T, timeout time.Duration) *harness {
	t.Helper()
	return newHarness(t, mirror.Options{
		Upstreams:       []regname.Upstream{upstreamFor(t, "upstream.test", u.up)},
		UpstreamTimeout: timeout, UpstreamConcurrency: 1, Transport: longHeaderTransport(),
	})
}

// TestUpstreamConcurrency (issue 23, connections): with --upstream-concurrency 1, a request for
// an upstream whose one slot is taken by a request still waiting for the upstream's response
// headers waits --upstream-timeout for it, then gets 429 with Retry-After, and is never sent
// upstream; once the headers arrived the slot is free (a body being read holds none). Before,
// every request went upstream at once, however many were already waiting.
func TestUpstreamConcurrency(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	u := newHeldUpstream(t)
	h := u.oneSlotMirror(t, timeout)
	first := make(chan int, 1)
	go func() {
		resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/a/manifests/"+u.a), manifestAccept)
		first <- resp.StatusCode
	}()
	select {
	case <-u.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the upstream")
	}

	start := time.Now()
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/b/manifests/"+u.b), manifestAccept)
	took := time.Since(start)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" ||
		!strings.Contains(string(body), "TOOMANYREQUESTS") || !strings.Contains(errorBody(body), "--upstream-concurrency") {
		t.Errorf("second request: %d Retry-After %q %s; want 429 with Retry-After 1 naming --upstream-concurrency",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if took < timeout*9/10 {
		t.Errorf("second request answered after %s; want it to wait the upstream timeout (%s) for a slot", took, timeout)
	}
	if n := u.up.Count("", "/team/b/"); n != 0 {
		t.Errorf("the upstream saw %d requests for team/b; want none while the slot was taken", n)
	}
	// A blob request waits the same way (its HEAD).
	resp, body = get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/b/blobs/sha256:"+strings.Repeat("ab", 32)), nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("blob request: %d Retry-After %q %s; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := metricValue(t, h, `nodecache_upstream_busy_total{upstream="upstream.test"}`); got != 2 {
		t.Errorf("nodecache_upstream_busy_total = %v, want 2", got)
	}

	close(u.release)
	if code := <-first; code != http.StatusOK {
		t.Errorf("first request: %d, want 200", code)
	}
	if resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/b/manifests/"+u.b), manifestAccept); resp.StatusCode != http.StatusOK {
		t.Errorf("second request once the slot is free: %d %s, want 200", resp.StatusCode, body)
	}
}

// TestChainPassesConcurrency429On: a shared tier (--chain) that answers 429 because its own
// --upstream-concurrency slots are taken does not count as failing: its 429 reaches the client
// with its Retry-After, however many in a row, and the node never goes to the upstream directly
// (three failures would open the chain's bypass).
func TestChainPassesConcurrency429On(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	u := newHeldUpstream(t)
	shared := u.oneSlotMirror(t, timeout)
	direct := mirrortest.NewRegistry(t) // what the node reaches when it goes around the shared tier
	node := newHarness(t, mirror.Options{
		Upstreams:       []regname.Upstream{upstreamFor(t, "upstream.test", direct)},
		UpstreamTimeout: 2 * timeout,
		Chain:           mustURL(t, "http://"+shared.host),
	})
	go func() {
		// Ends with the test (its context), answered or not: not judged.
		if resp, err := http.DefaultClient.Do(newRequest(t, http.MethodGet, fmtURL(shared, "/v2/upstream.test/team/a/manifests/"+u.a), manifestAccept)); err == nil {
			_ = resp.Body.Close()
		}
	}()
	select {
	case <-u.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the request holding the shared tier's slot never reached the upstream")
	}
	t.Cleanup(func() { close(u.release) })
	for i := range 4 {
		resp, body := get(t, http.MethodGet, fmtURL(node, "/v2/upstream.test/team/b/manifests/"+u.b), manifestAccept)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("request %d through the node: %d Retry-After %q %s; want the shared tier's 429 with Retry-After 1",
				i+1, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	if n := len(direct.Requests()); n != 0 {
		t.Errorf("the node went around the shared tier: the upstream saw %d requests from it directly", n)
	}
}
