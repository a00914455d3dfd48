package mirror_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// connCounter is a loopback listener that counts the connections made to it and closes each at
// once: where an offline upstream's URL points, to prove nothing is ever dialled there.
type connCounter struct {
	addr string
	n    atomic.Int64
}

func newConnCounter(t *testing.T) *connCounter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &connCounter{addr: l.Addr().String()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close(); <-done })
	return c
}

// dialCounting is testTransport whose every dial, to any address, is counted in n.
func dialCounting(n *atomic.Int64) *http.Transport {
	t := testTransport(3 * time.Second)
	dial := t.DialContext
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.Add(1)
		return dial(ctx, network, addr)
	}
	return t
}

// offlineFixture is a cache filled while its upstream (upstream.test) was online: an index
// pulled by tag (every platform's image), then the upstream stopped. root is the storage.
type offlineFixture struct {
	root            string
	indexDigest     string
	childDigest     string
	layerDigest     string
	layer           []byte
	soloTag, soloMf string
}

func fillThenStop(t *testing.T) offlineFixture {
	t.Helper()
	up := mirrortest.NewRegistry(t)
	idx := mirrortest.MultiPlatformIndex(t, 2048, 1)
	up.PushIndex(t, "team/app", "v1", idx)
	solo := mirrortest.Image(t, 1024, 1, "linux/amd64")
	up.PushImage(t, "team/solo", "v2", solo)
	f := offlineFixture{root: t.TempDir(), indexDigest: digestOf(t, idx), soloTag: "v2", soloMf: digestOf(t, solo)}
	childHash, child := mirrortest.IndexChild(t, idx, 0)
	f.childDigest = childHash.String()
	lh, lb := mirrortest.LayerBlob(t, child, 0)
	f.layerDigest, f.layer = lh.String(), lb

	online := newHarness(t, mirror.Options{Root: f.root, Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)}})
	pullIndexGGCR(t, ref(t, online.host+"/upstream.test/team/app:v1"))
	img, err := remote.Image(ref(t, online.host+"/upstream.test/team/solo:v2"), remote.WithContext(t.Context()))
	if err == nil {
		err = validate.Image(img) // reads every blob
	}
	if err != nil {
		t.Fatalf("pull team/solo:v2 online: %v", err)
	}
	online.waitIdle(t)
	online.close(t)
	up.Stop()
	return f
}

// offlineGet sends method url with the OCI manifest Accept headers and reads the answer (status,
// headers, body), failing the test when it took half the harness's upstream timeout (3 s) or
// more: an offline upstream is answered from the cache or refused at once, never after an
// upstream timeout. (A quarter of a second failed under CI load at 0.30 s; the dial count the
// tests also check is the exact guard.)
func offlineGet(t *testing.T, method, url string) (int, http.Header, []byte) {
	t.Helper()
	start := time.Now()
	resp, body := get(t, method, url, manifestAccept)
	if took := time.Since(start); took >= 1500*time.Millisecond {
		t.Fatalf("%s %s took %s: want an answer at once", method, url, took)
	}
	return resp.StatusCode, resp.Header, body
}

// wantOfflineMiss checks a 404 with code whose message says the upstream is offline (GET; a
// HEAD has the status and the error code header only).
func wantOfflineMiss(t *testing.T, method, url, code string) {
	t.Helper()
	status, hdr, body := offlineGet(t, method, url)
	if status != http.StatusNotFound || hdr.Get(mirrorapi.HeaderErrorCode) != code {
		t.Fatalf("%s %s: %d %s=%q, want 404 %s\n%s", method, url, status, mirrorapi.HeaderErrorCode, hdr.Get(mirrorapi.HeaderErrorCode), code, body)
	}
	if method == http.MethodHead {
		return
	}
	var doc struct {
		Errors []struct{ Code, Message string }
	}
	if err := json.Unmarshal(body, &doc); err != nil || len(doc.Errors) != 1 || doc.Errors[0].Code != code ||
		!strings.Contains(doc.Errors[0].Message, "upstream upstream.test is offline") {
		t.Fatalf("%s %s: body %s, want one %s error saying upstream upstream.test is offline", method, url, body, code)
	}
}

// checkOfflineServes is the test of an offline mirror h over f's cache: by tag, by digest, blobs,
// the tag listing, the status canary, and misses answered at once.
func checkOfflineServes(t *testing.T, h *harness, f offlineFixture) {
	t.Helper()
	base := "http://" + h.host + "/v2/upstream.test/team/app"
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		status, hdr, _ := offlineGet(t, method, base+"/manifests/v1")
		if status != http.StatusOK || hdr.Get("Docker-Content-Digest") != f.indexDigest || hdr.Get(mirrorapi.HeaderCache) != mirrorapi.CacheHit {
			t.Fatalf("%s by tag: %d %s %s=%q, want 200 %s hit", method, status, hdr.Get("Docker-Content-Digest"), mirrorapi.HeaderCache, hdr.Get(mirrorapi.HeaderCache), f.indexDigest)
		}
		status, hdr, _ = offlineGet(t, method, base+"/manifests/"+f.childDigest)
		if status != http.StatusOK || hdr.Get("Docker-Content-Digest") != f.childDigest {
			t.Fatalf("%s by digest: %d %s", method, status, hdr.Get("Docker-Content-Digest"))
		}
	}
	status, _, body := offlineGet(t, http.MethodGet, base+"/blobs/"+f.layerDigest)
	if status != http.StatusOK || string(body) != string(f.layer) {
		t.Fatalf("layer blob: %d, %d bytes, want 200 and the layer's %d", status, len(body), len(f.layer))
	}
	status, _, body = offlineGet(t, http.MethodGet, base+"/tags/list")
	var list struct{ Tags []string }
	if status != http.StatusOK || json.Unmarshal(body, &list) != nil || !slices.Equal(list.Tags, []string{"v1"}) {
		t.Fatalf("tags/list: %d %s, want 200 [v1]", status, body)
	}
	// A whole pull by a real client: every platform's image of the index, and the other
	// repository's image by tag through containerd's ?ns= routing.
	pullIndexGGCR(t, ref(t, h.host+"/upstream.test/team/app:v1"))
	img, err := remote.Image(ref(t, h.host+"/upstream.test/team/solo:"+f.soloTag), remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pull team/solo:%s offline: %v", f.soloTag, err)
	}
	if err := validate.Image(img); err != nil || digestOf(t, img) != f.soloMf {
		t.Fatalf("team/solo offline: %v, digest %s want %s", err, digestOf(t, img), f.soloMf)
	}
	if status, _, _ = offlineGet(t, http.MethodGet, "http://"+h.host+"/v2/team/solo/manifests/"+f.soloTag+"?ns=upstream.test"); status != http.StatusOK {
		t.Fatalf("?ns= by tag: %d", status)
	}

	// The canary `nodecache status --canary` pulls is answered by serve itself, offline too.
	canary := ref(t, h.host+"/upstream.test/"+mirrorapi.CanaryRepository+":fresh-1")
	if img, err := remote.Image(canary, remote.WithContext(t.Context())); err != nil || validate.Image(img) != nil {
		t.Fatalf("canary through an offline upstream: %v", err)
	}

	// Misses: 404 at once, with the code of what was asked.
	const missing = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		wantOfflineMiss(t, method, base+"/manifests/v9", "MANIFEST_UNKNOWN")
		wantOfflineMiss(t, method, base+"/manifests/"+missing, "MANIFEST_UNKNOWN")
		wantOfflineMiss(t, method, base+"/blobs/"+missing, "BLOB_UNKNOWN")
		wantOfflineMiss(t, method, "http://"+h.host+"/v2/upstream.test/team/never/manifests/latest", "MANIFEST_UNKNOWN")
	}
	wantOfflineMiss(t, http.MethodGet, "http://"+h.host+"/v2/upstream.test/team/never/tags/list", "NAME_UNKNOWN")
	// A blob stored for another repository is not this one's (the per-repository rule holds).
	wantOfflineMiss(t, http.MethodGet, "http://"+h.host+"/v2/upstream.test/team/never/blobs/"+f.layerDigest, "BLOB_UNKNOWN")
}

// TestOfflineUpstream (issue 24): a cache filled while upstream.test was online, served again
// from the same root with --upstream upstream.test=offline and no upstream running: by tag (the
// stored tag, "hit", not revalidated), by digest, blobs, the tag listing, a whole pull by
// go-containerregistry; a miss is 404 MANIFEST_UNKNOWN / BLOB_UNKNOWN / NAME_UNKNOWN at once
// (well under a second; an online upstream that does not answer costs the upstream timeout,
// TestBlackholedUpstream), saying the upstream is offline. Nothing is dialled: every dial of
// the upstream transport is counted. /metrics says the upstream is offline and holds no
// upstream fetch for it, so NodecacheUpstreamFailing cannot fire for it, and the misses are
// 404s, not the 5xx of NodecacheServerErrors. An online upstream next to it is still pulled
// through.
func TestOfflineUpstream(t *testing.T) {
	t.Parallel()
	f := fillThenStop(t)
	live := mirrortest.NewRegistry(t)
	liveImg := mirrortest.Image(t, 1024, 1, "linux/amd64")
	live.PushImage(t, "team/live", "v1", liveImg)

	var dials atomic.Int64
	h := newHarness(t, mirror.Options{Root: f.root, Transport: dialCounting(&dials),
		Upstreams: []regname.Upstream{parseUpstream(t, "upstream.test=offline"), upstreamFor(t, "live.test", live)}})
	checkOfflineServes(t, h, f)
	if n := dials.Load(); n != 0 {
		t.Fatalf("%d dials while serving an offline upstream", n)
	}

	// The online upstream next to it is asked as ever.
	if _, err := remote.Image(ref(t, h.host+"/live.test/team/live:v1"), remote.WithContext(t.Context())); err != nil {
		t.Fatalf("pull through the online upstream: %v", err)
	}
	if dials.Load() == 0 || live.Count(http.MethodGet, "/v2/team/live/") == 0 {
		t.Fatal("the online upstream was not asked: the dial counter proves nothing")
	}
	h.waitIdle(t)

	_, metrics := get(t, http.MethodGet, "http://"+h.host+"/metrics", nil)
	for _, want := range []string{
		`nodecache_upstream_offline{upstream="upstream.test"} 1`,
		`nodecache_upstream_offline{upstream="live.test"} 0`,
		`nodecache_requests_total{cache="",code="404",kind="manifest",method="GET",upstream="upstream.test"}`,
		`nodecache_upstream_fetch_duration_seconds_count{kind="manifest",result="ok",tier="upstream",upstream="live.test"}`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, line := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(line, "nodecache_upstream_") && strings.Contains(line, `upstream="upstream.test"`) && !strings.HasPrefix(line, "nodecache_upstream_offline") {
			t.Errorf("/metrics has an upstream series for the offline upstream: %s", line)
		}
		if strings.HasPrefix(line, "nodecache_requests_total") && strings.Contains(line, `code="5`) {
			t.Errorf("/metrics counts a 5xx: %s", line)
		}
	}
	if !strings.Contains(h.logs.String(), `"offline_upstreams":["upstream.test"]`) {
		t.Errorf("no start line naming the offline upstream:\n%s", h.logs.String())
	}
}

// TestOfflineFlag (issue 24): --offline (Config.Offline) makes every upstream offline, their URLs
// kept and never used: the cache filled online is served with the upstream's URL pointing at a
// listener that counts connections, and it counts none, misses included.
func TestOfflineFlag(t *testing.T) {
	t.Parallel()
	f := fillThenStop(t)
	counter := newConnCounter(t)
	c := mirror.Config{Listen: ":5000", Root: f.root, Offline: true, UpstreamTimeout: 10 * time.Second, FillTimeout: time.Hour,
		Upstreams: []string{"upstream.test=http://" + counter.addr, "docker.io"}}
	opts, err := c.Options(zerolog.Nop())
	if err != nil {
		t.Fatalf("Options: %v", err)
	}
	for _, u := range opts.Upstreams {
		if !u.Offline {
			t.Fatalf("--offline: upstream %s is not offline", u)
		}
	}
	opts.Transport = testTransport(opts.UpstreamTimeout) // resolves upstream.test to loopback, as the real one would be
	h := newHarness(t, opts)
	checkOfflineServes(t, h, f)
	if n := counter.n.Load(); n != 0 {
		t.Fatalf("%d connections to the offline upstream's URL", n)
	}
	// The check of the check: the counter counts a connection when one is made.
	conn, err := net.Dial("tcp", counter.addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, conn) // closed by the counter
	_ = conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for counter.n.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if counter.n.Load() != 1 {
		t.Fatalf("the counter saw %d connections after one dial", counter.n.Load())
	}
}

// TestOfflineRefused: a try at the word is refused with what is accepted, and an offline
// upstream's credentials file is not read (a credential helper could reach out).
func TestOfflineRefused(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"docker.io=ofline", "docker.io=off-line", "docker.io=offline://"} {
		c := mirror.Config{Listen: ":5000", Root: t.TempDir(), UpstreamTimeout: time.Second, FillTimeout: time.Hour, Upstreams: []string{bad}}
		if _, err := c.Options(zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "did you mean offline? want http://HOST[:PORT], https://HOST[:PORT], or offline") {
			t.Errorf("--upstream %s: %v", bad, err)
		}
	}
	c := mirror.Config{Listen: ":5000", Root: t.TempDir(), UpstreamTimeout: time.Second, FillTimeout: time.Hour,
		Upstreams: []string{"ghcr.io=offline"}, UpstreamAuth: []string{"ghcr.io=/nonexistent/config.json"}, UpstreamCA: []string{"ghcr.io=/nonexistent/ca.pem"}}
	opts, err := c.Options(zerolog.Nop())
	if err != nil || len(opts.UpstreamCredentials) != 0 || len(opts.UpstreamRootCAs) != 0 {
		t.Fatalf("an offline upstream's files: %v, %d credentials, %d CAs; want none read", err, len(opts.UpstreamCredentials), len(opts.UpstreamRootCAs))
	}
	c.Upstreams = []string{"ghcr.io"}
	if _, err := c.Options(zerolog.Nop()); err == nil {
		t.Fatal("the check of the check: the same missing files for an online upstream were accepted")
	}
}
