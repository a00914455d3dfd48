package mirror_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// sharedTier is a shared nodecache behind a front that can be stopped or made to answer with a
// fixed status, counting the registry requests that reach it.
type sharedTier struct {
	h      *harness
	front  *httptest.Server
	status atomic.Int32 // != 0: answer every /v2/ request but the ping with it
	seen   atomic.Int64 // requests that reached the front
	auth   atomic.Int64 // of them, with an Authorization header
}

func newSharedTier(t *testing.T, up *mirrortest.Registry) *sharedTier {
	t.Helper()
	s := &sharedTier{h: newHarnessFor(t, up)}
	s.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.seen.Add(1)
		if r.Header.Get("Authorization") != "" {
			s.auth.Add(1)
		}
		if code := int(s.status.Load()); code != 0 && r.URL.Path != "/v2/" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = fmt.Fprintf(w, `{"errors":[{"code":"UNKNOWN","message":"injected %d"}]}`, code)
			return
		}
		s.h.m.ServeHTTP(w, r)
	}))
	t.Cleanup(s.front.Close)
	return s
}

// pullImageErr pulls ref's image with go-containerregistry and validates it (every blob fetched
// and its digest checked).
func pullImageErr(ctx context.Context, s string) error {
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		return err
	}
	img, err := remote.Image(r, remote.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("pull %s: %w", s, err)
	}
	if err := validate.Image(img); err != nil {
		return fmt.Errorf("validate %s: %w", s, err)
	}
	return nil
}

// imageBlobs returns the digests of the config and layers of repo:tag on up.
func imageBlobs(t *testing.T, up *mirrortest.Registry, repo, tag string) []string {
	t.Helper()
	img, err := remote.Image(up.Ref(t, repo, tag), remote.WithContext(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	return mirrortest.BlobDigests(t, img)
}

// TestChain: 10 node caches chained (--chain) to one shared nodecache in front of a real
// upstream registry pull the same image at once; the upstream sees one GET per blob, the shared
// cache sees the forwarded ?ns=, node logs say tier "shared". Then the shared tier stops and
// the nodes pull a new image directly (tier "upstream").
func TestChain(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/app", "v1", mirrortest.Image(t, 2*mirrortest.MiB, 3, "linux/amd64"))
	up.PushImage(t, "team/app", "v2", mirrortest.Image(t, mirrortest.MiB, 2, "linux/amd64"))
	blobs := imageBlobs(t, up, "team/app", "v1")
	shared := newSharedTier(t, up)
	up.ResetRequests()

	nodes := make([]*harness, 10)
	for i := range nodes {
		nodes[i] = newHarness(t, mirror.Options{
			Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)},
			Chain:     mustURL(t, shared.front.URL),
		})
	}
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Go(func() { errs[i] = pullImageErr(t.Context(), n.host+"/upstream.test/team/app:v1") })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	for _, b := range blobs {
		if n := up.Count(http.MethodGet, "/blobs/"+b); n != 1 {
			t.Errorf("upstream saw %d GETs of blob %s, want exactly 1", n, b)
		}
	}
	nsSeen := 0
	for _, l := range shared.h.logs.requests(t) {
		if l["kind"] == "blob" && strings.Contains(fmt.Sprint(l["query"]), "ns=upstream.test") {
			nsSeen++
			if l["method"] == http.MethodGet && l["cache"] == mirrorapi.CacheMiss && l["tier"] != "upstream" {
				t.Errorf("shared cache's miss has tier %v, want upstream: %v", l["tier"], l)
			}
		}
	}
	if nsSeen == 0 {
		t.Fatal("the shared cache's log shows no blob request with ?ns=upstream.test")
	}
	for i, n := range nodes {
		for _, l := range n.logs.requests(t) {
			if l["kind"] == "blob" && l["cache"] != mirrorapi.CacheHit && l["tier"] != "shared" {
				t.Fatalf("node %d: blob answered from tier %v, want shared: %v", i, l["tier"], l)
			}
		}
	}
	if series := `nodecache_upstream_fetched_bytes_total{tier="shared",upstream="upstream.test"}`; metricValue(t, nodes[0], series) < 0 {
		t.Fatalf("node metrics lack %s", series)
	}

	t.Run("shared tier stopped: nodes pull directly", func(t *testing.T) {
		shared.front.Close()
		up.ResetRequests()
		for i, n := range nodes[:3] {
			if err := pullImageErr(t.Context(), n.host+"/upstream.test/team/app:v2"); err != nil {
				t.Fatalf("node %d with the shared tier down: %v", i, err)
			}
		}
		if up.Count(http.MethodGet, "/blobs/") == 0 {
			t.Fatal("the upstream saw no blob GET: nodes did not pull directly")
		}
		direct := 0
		for _, l := range nodes[0].logs.requests(t) {
			if l["tier"] == "upstream" {
				direct++
			}
		}
		if direct == 0 {
			t.Fatal("node 0's log shows no request answered from tier upstream")
		}
	})
}

// TestChainWaitsForSharedTier: with the upstream black-holed, the shared tier answers a cached
// tag as stale after its own upstream timeout; a node with the same timeout waits for that answer
// (SharedTierTimeout, 6 s here) instead of giving up when its own timeout ends, getting
// nothing and counting the shared tier as failed. Three such requests leave the breaker closed.
func TestChainWaitsForSharedTier(t *testing.T) {
	t.Parallel()
	const timeout = 4 * time.Second // the margin SharedTierTimeout leaves is half of it: 2 s, for loaded CI machines (1 s was missed once at load 13)
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	ups := []regname.Upstream{upstreamFor(t, "upstream.test", up)}
	shared := newHarness(t, mirror.Options{Upstreams: ups, UpstreamTimeout: timeout})
	pullImage(t, shared.host+"/upstream.test/team/app:v1")
	// Black hole: no answer until the client leaves.
	up.Intercept("", "", func(_ http.Handler, _ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	node := newHarness(t, mirror.Options{Upstreams: ups, UpstreamTimeout: timeout, Chain: mustURL(t, "http://"+shared.host)})
	for i := range 3 {
		start := time.Now()
		resp, body := get(t, http.MethodGet, fmtURL(node, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d after %s: %d %s, want 200: the shared tier's stale answer", i, time.Since(start).Round(time.Millisecond), resp.StatusCode, body)
		}
	}
	for _, l := range node.logs.requests(t) {
		if l["kind"] == "manifest" && l["tier"] != upstream.TierShared {
			t.Errorf("node answered from tier %v, want shared: %v", l["tier"], l)
		}
	}
	if strings.Contains(node.logs.String(), "shared tier failing") {
		t.Errorf("the breaker opened:\n%s", node.logs.String())
	}
}

// TestChainPassesAnswersOn: 404, 401, 403 and 429 from the shared tier reach the client as
// they are, and the upstream is not asked; a 5xx sends the request to the upstream directly.
//
//nolint:paralleltest // the subtests share the shared tier's injected status
func TestChainPassesAnswersOn(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	shared := newSharedTier(t, up)
	for _, tc := range []struct {
		name       string
		status     int
		wantStatus int
		wantDirect bool
	}{
		{"404", http.StatusNotFound, http.StatusNotFound, false},
		{"401", http.StatusUnauthorized, http.StatusForbidden, false}, // DENIED, as from an upstream
		{"403", http.StatusForbidden, http.StatusForbidden, false},
		{"429", http.StatusTooManyRequests, http.StatusTooManyRequests, false},
		{"503", http.StatusServiceUnavailable, http.StatusOK, true},
		{"500", http.StatusInternalServerError, http.StatusOK, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not parallel: they share the shared tier's injected status.
			node := newHarness(t, mirror.Options{
				Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)},
				Chain:     mustURL(t, shared.front.URL),
			})
			shared.status.Store(int32(tc.status))
			defer shared.status.Store(0)
			up.ResetRequests()
			resp, body := get(t, http.MethodGet, fmtURL(node, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.wantStatus)
			}
			if direct := up.Count(http.MethodGet, "/manifests/") > 0; direct != tc.wantDirect {
				t.Fatalf("upstream asked directly: %v, want %v", direct, tc.wantDirect)
			}
		})
	}
}

// TestChainBreaker: after 3 failures of the shared tier the node leaves it alone (requests go
// directly without touching it) until 30 s passed; then one request probes it: a failed probe
// opens it for another 30 s, a successful one closes it.
func TestChainBreaker(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	shared := newSharedTier(t, up)
	clock := mirrortest.NewClock(time.Now())
	node := newHarness(t, mirror.Options{
		Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)},
		Chain:     mustURL(t, shared.front.URL),
		Clock:     clock.Now,
		TagTTL:    0,
	})
	shared.status.Store(http.StatusBadGateway)
	ask := func() {
		t.Helper()
		resp, body := get(t, http.MethodGet, fmtURL(node, "/v2/upstream.test/team/app/manifests/v1"), manifestAccept)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d (%s), want 200 from the upstream directly", resp.StatusCode, body)
		}
	}
	for _, step := range []struct {
		advance time.Duration // the clock moves on first
		healed  bool          // the shared tier answers again from this step on
		asks    int
		seen    int64 // requests the shared tier saw in all after the step
		what    string
	}{
		{0, false, 3, 3, "3 manifest GETs"},
		{0, false, 5, 3, "breaker open: 5 more"},
		{31 * time.Second, false, 4, 4, "after 30 s with the shared tier still failing: one probe, which opens it again"},
		{31 * time.Second, true, 1, 5, "after another 30 s: one probe, which closes it"},
		{0, false, 1, 6, "breaker closed again"},
	} {
		clock.Advance(step.advance)
		if step.healed {
			shared.status.Store(0)
		}
		for range step.asks {
			ask()
		}
		if n := shared.seen.Load(); n != step.seen {
			t.Fatalf("%s: shared tier saw %d requests, want %d", step.what, n, step.seen)
		}
	}
}

// TestChainLoop: a cache chained to itself answers 508 with an OCI error body after one hop;
// a request with more than 4 nodecache hops is refused the same way.
func TestChainLoop(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	m, err := mirror.New(t.Context(), mirror.Options{
		Upstreams:       []regname.Upstream{upstreamFor(t, "upstream.test", up)},
		Chain:           mustURL(t, "http://"+l.Addr().String()),
		Logger:          zerolog.New(logs),
		UpstreamTimeout: 3 * time.Second,
		Transport:       testTransport(3 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		m.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close(); _ = m.Close() })

	base := "http://" + l.Addr().String()
	up.ResetRequests()
	resp, body := get(t, http.MethodGet, base+"/v2/upstream.test/team/app/manifests/v1", manifestAccept)
	if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(string(body), `"errors"`) {
		t.Fatalf("chained to itself: %d %s, want 508 with an OCI error body", resp.StatusCode, body)
	}
	if n := served.Load(); n != 2 {
		t.Fatalf("%d requests reached the cache, want 2 (the client's and one hop)", n)
	}
	if n := len(up.Requests()); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}

	hops := []string{"1.1 nodecache/a", "1.1 nodecache/b, 1.1 nodecache/c", "1.0 other-proxy, 1.1 nodecache/d, 1.1 nodecache/e"}
	resp, body = get(t, http.MethodGet, base+"/v2/upstream.test/team/app/manifests/v1", http.Header{"Via": hops})
	if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(string(body), "5 nodecache hops") {
		t.Fatalf("5 hops: %d %s, want 508 naming the hops", resp.StatusCode, body)
	}
	if n := metricAt(t, base+"/metrics", `nodecache_refused_total{reason="loop"}`); n != 2 {
		t.Fatalf(`nodecache_refused_total{reason="loop"} = %v, want the two refused loops`, n)
	}
}

// TestUpstreamAnnouncesNodecache: an upstream URL that is a nodecache (Nodecache-Version on
// /v2/) is sent ?ns= without --chain.
func TestUpstreamAnnouncesNodecache(t *testing.T) {
	t.Parallel()
	up, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
	shared := newSharedTier(t, up)
	u := parseUpstream(t, "upstream.test="+shared.front.URL)
	node := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{u}, DefaultUpstream: "upstream.test"})
	pullImage(t, node.host+"/upstream.test/team/app:v1")
	for _, l := range shared.h.logs.requests(t) {
		if l["kind"] != "base" && !strings.Contains(fmt.Sprint(l["query"]), "ns=upstream.test") {
			t.Fatalf("the shared cache got a request without ?ns=: %v", l)
		}
	}
	for _, l := range node.logs.requests(t) {
		if l["kind"] == "manifest" && l["tier"] != "shared" {
			t.Fatalf("node's manifest answer has tier %v, want shared: %v", l["tier"], l)
		}
	}
}

// TestChainCredentialsOnlyDirect: with --chain, --upstream-auth credentials never reach the
// shared tier (its 403 for a private repository is passed on); once the shared tier is down the
// node pulls directly, with them.
func TestChainCredentialsOnlyDirect(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewPrivateRegistry(t, testUser, testPassword)
	up.PushImage(t, "team/private", "v1", mirrortest.Image(t, 1024, 1, "linux/amd64"))
	shared := newSharedTier(t, up) // no credentials of its own
	file := filepath.Join(t.TempDir(), "config.json")
	writeDockerConfig(t, file, map[string]map[string]string{
		up.Addr: {"auth": basicAuth(testUser, testPassword)},
	})
	node := newHarness(t, mirror.Options{
		Upstreams:           []regname.Upstream{upstreamFor(t, "upstream.test", up)},
		UpstreamCredentials: map[string]*upstreamauth.Credentials{"upstream.test": loadCredentials(t, file, up.Addr)},
		Chain:               mustURL(t, shared.front.URL),
	})
	url := fmtURL(node, "/v2/upstream.test/team/private/manifests/v1")
	if resp, body := get(t, http.MethodGet, url, manifestAccept); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("through the shared tier without its own credentials: %d %s, want its 403 passed on", resp.StatusCode, body)
	}
	if n := shared.auth.Load(); n != 0 || shared.seen.Load() == 0 {
		t.Fatalf("shared tier saw %d requests, %d with Authorization; want some, none", shared.seen.Load(), n)
	}
	shared.front.Close()
	if resp, body := get(t, http.MethodGet, url, manifestAccept); resp.StatusCode != http.StatusOK {
		t.Fatalf("direct with the node's credentials: %d %s, want 200", resp.StatusCode, body)
	}
}
