package upstream

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testFetcher builds a Fetcher for one upstream "upstream.test" at srv (nil: an unused URL),
// closed when the test ends.
func testFetcher(t *testing.T, srv *httptest.Server, opts Options) *Fetcher {
	t.Helper()
	u := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	tr := &http.Transport{}
	if srv != nil {
		u, _ = url.Parse(srv.URL)
	}
	if opts.StagingDir == "" {
		opts.StagingDir = t.TempDir()
	}
	opts.UserAgent = "nodecache-test"
	opts.Registerer = prometheus.NewRegistry()
	opts.Transport = tr
	f, err := New(t.Context(), []Registry{{Name: "upstream.test", URL: u}}, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		_ = f.Close()
		tr.CloseIdleConnections()
	})
	return f
}

func TestTagFreshness(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		ttl     time.Duration
		advance time.Duration
		want    bool
	}{
		{"ttl 0 is never fresh", 0, 0, false},
		{"within ttl", time.Minute, 59 * time.Second, true},
		{"at ttl", time.Minute, time.Minute, false},
		{"after ttl", time.Minute, time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := mirrortest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			f := testFetcher(t, nil, Options{TagTTL: tc.ttl, Clock: clock.Now})
			if f.TagFresh("upstream.test", "team/app", "v1") {
				t.Fatal("a tag never confirmed is fresh")
			}
			f.MarkTagFresh("upstream.test", "team/app", "v1")
			clock.Advance(tc.advance)
			if got := f.TagFresh("upstream.test", "team/app", "v1"); got != tc.want {
				t.Errorf("fresh after %s with ttl %s = %v, want %v", tc.advance, tc.ttl, got, tc.want)
			}
			if f.TagFresh("upstream.test", "team/app", "v2") || f.TagFresh("other.test", "team/app", "v1") {
				t.Error("another tag or upstream counts as fresh")
			}
			// Confirming again restarts the TTL.
			f.MarkTagFresh("upstream.test", "team/app", "v1")
			if got := f.TagFresh("upstream.test", "team/app", "v1"); got != (tc.ttl > 0) {
				t.Errorf("fresh right after a new confirmation = %v, want %v", got, tc.ttl > 0)
			}
		})
	}
}

func TestFreshTagsBounded(t *testing.T) {
	t.Parallel()
	f := testFetcher(t, nil, Options{TagTTL: time.Hour})
	for i := range MaxFreshTags + 10 {
		f.MarkTagFresh("upstream.test", "team/app", fmt.Sprint("t", i))
	}
	if n := f.fresh.Len(); n != MaxFreshTags {
		t.Errorf("%d fresh tags remembered, want the bound %d", n, MaxFreshTags)
	}
	if f.TagFresh("upstream.test", "team/app", "t0") {
		t.Error("the least recently confirmed tag is still remembered past the bound")
	}
	if !f.TagFresh("upstream.test", "team/app", fmt.Sprint("t", MaxFreshTags+9)) {
		t.Error("the last confirmed tag is not fresh")
	}
}

// pingCounter is an upstream that answers /v2/ and counts the pings (one per new transport),
// listening on what listen makes of its listener (nil: the listener itself).
func pingCounter(t *testing.T, listen func(net.Listener) net.Listener) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var pings atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			pings.Add(1)
			return
		}
		http.NotFound(w, r)
	}))
	if listen != nil {
		srv.Listener = listen(srv.Listener)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &pings
}

func TestTransportsAreLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	srv, pings := pingCounter(t, nil)
	clock := mirrortest.NewClock(time.Now())
	f := testFetcher(t, srv, Options{Clock: clock.Now})
	c := f.Remote("upstream.test").client
	get := func(repo string) {
		t.Helper()
		if _, err := c.transport(t.Context(), repo); err != nil {
			t.Fatalf("transport %s: %v", repo, err)
		}
	}
	for i := range maxRepoTransports {
		get(fmt.Sprint("repo", i))
	}
	if n := pings.Load(); n != maxRepoTransports {
		t.Fatalf("%d pings for %d repositories", n, maxRepoTransports)
	}
	get("repo0") // now the most recently used
	get("new")   // evicts repo1, the least recently used
	if n := pings.Load(); n != maxRepoTransports+1 {
		t.Fatalf("%d pings, want %d (repo0 reused, new created)", n, maxRepoTransports+1)
	}
	get("repo0")
	if n := pings.Load(); n != maxRepoTransports+1 {
		t.Error("repo0 was evicted although it was used recently")
	}
	get("repo1")
	if n := pings.Load(); n != maxRepoTransports+2 {
		t.Error("repo1, the least recently used, was kept past the bound")
	}
	if n := c.repos.Len(); n != maxRepoTransports {
		t.Errorf("%d transports kept, want %d", n, maxRepoTransports)
	}
	clock.Advance(repoTransportTTL)
	before := pings.Load()
	get("repo0")
	if pings.Load() != before+1 {
		t.Error("a transport older than repoTransportTTL was reused")
	}
}

// tlsCountingListener counts the connections whose first byte opens a TLS record (0x16, a
// handshake): what an https attempt sends to a plain-HTTP server.
type tlsCountingListener struct {
	net.Listener
	hellos *atomic.Int64
}

func (l tlsCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstByteConn{Conn: c, hellos: l.hellos}, nil
}

type firstByteConn struct {
	net.Conn
	hellos *atomic.Int64
	seen   bool
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.seen {
		c.seen = true
		if p[0] == 0x16 {
			c.hellos.Add(1)
		}
	}
	return n, err
}

// TestHTTPUpstreamNeverHTTPS (newuser F14): an upstream configured as http:// is pinged and
// authenticated over http only; go-containerregistry's ping tries https first for insecure
// registries, and no TLS handshake may reach the upstream.
func TestHTTPUpstreamNeverHTTPS(t *testing.T) {
	t.Parallel()
	var hellos atomic.Int64
	srv, pings := pingCounter(t, func(l net.Listener) net.Listener { return tlsCountingListener{Listener: l, hellos: &hellos} })
	c := testFetcher(t, srv, Options{}).Remote("upstream.test").client
	for _, repo := range []string{"team/one", "team/two"} {
		if _, err := c.transport(t.Context(), repo); err != nil {
			t.Fatalf("transport %s: %v", repo, err)
		}
	}
	if n := pings.Load(); n != 2 {
		t.Fatalf("%d pings over http, want 2 (one per repository)", n)
	}
	if n := hellos.Load(); n != 0 {
		t.Fatalf("%d TLS handshakes reached the http:// upstream, want none", n)
	}
}

// blobServer serves body as repository team/app's blob dgst (Range honoured) under name "served".
func blobServer(t *testing.T, dgst digest.Digest, body []byte) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var gets atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
		case r.URL.Path == "/v2/team/app/blobs/"+dgst.String():
			if r.Method == http.MethodGet {
				gets.Add(1)
			}
			w.Header().Set("Docker-Content-Digest", dgst.String())
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &gets
}

// randomBlob is size random bytes and their digest.
func randomBlob(size int) ([]byte, digest.Digest) {
	b := make([]byte, size)
	_, _ = rand.Read(b)
	return b, digest.FromBytes(b)
}

func TestFill(t *testing.T) {
	t.Parallel()
	blob, good := randomBlob(3 << 20)
	for _, tc := range []struct {
		name       string
		serve      []byte
		wantCommit bool
	}{
		{"verified blob is served and committed", blob, true},
		{"wrong bytes are neither released whole nor committed", append([]byte{blob[0] ^ 1}, blob[1:]...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, gets := blobServer(t, good, tc.serve)
			f := testFetcher(t, srv, Options{})
			r := f.Remote("upstream.test")
			desc, _, err := r.BlobStat(t.Context(), "team/app", good, true)
			if err != nil || desc.Size != int64(len(blob)) {
				t.Fatalf("BlobStat = %+v, %v; want size %d", desc, err, len(blob))
			}
			var (
				mu        sync.Mutex
				committed []byte
			)
			commit := func(_ context.Context, path string, d v1.Descriptor) error {
				b, err := os.ReadFile(path)
				mu.Lock()
				committed = b
				mu.Unlock()
				return err
			}
			fl, joined, err := r.StartFill(t.Context(), "team/app", desc, commit)
			if err != nil || joined {
				t.Fatalf("StartFill = %v, joined %v", err, joined)
			}
			if again, joined, _ := r.StartFill(t.Context(), "team/app", desc, commit); again != fl && !joined {
				// The first fill may already be over; a new one is then fine.
				t.Log("fill was over before the second StartFill")
			}
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "application/octet-stream") // as the mirror sets it: no sniffing read
			n, serr := fl.Serve(t.Context(), rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if err := f.WaitIdle(t.Context()); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.wantCommit {
				if serr != nil || n != int64(len(blob)) || !bytes.Equal(rec.Body.Bytes(), blob) {
					t.Errorf("Serve = %d bytes, %v; body equal %v", n, serr, bytes.Equal(rec.Body.Bytes(), blob))
				}
				if !bytes.Equal(committed, blob) {
					t.Errorf("committed %d bytes, not the blob", len(committed))
				}
			} else {
				if !errors.Is(serr, ErrBroken) && !errors.Is(serr, ErrDigestMismatch) {
					t.Errorf("Serve error = %v, want a broken response or a digest mismatch", serr)
				}
				if int64(rec.Body.Len()) >= int64(len(blob)) {
					t.Error("the whole wrong blob reached the client")
				}
				if committed != nil {
					t.Error("a blob that failed its digest was committed")
				}
			}
			if g := gets.Load(); g != 1 {
				t.Errorf("%d upstream GETs, want 1", g)
			}
			if strings.Contains(fmt.Sprint(os.ReadDir(f.StagingDir())), "fill-") {
				t.Error("staging file left behind")
			}
		})
	}
}

func TestNextQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		links []string
		want  string
	}{
		{"none", nil, ""},
		{"distribution's form", []string{`</v2/team/app/tags/list?last=b&n=100>; rel="next"`}, "?last=b&n=100"},
		{"absolute, unquoted rel", []string{`<https://cdn.example/v2/x/tags/list?n=2&last=c>; rel=next`}, "?n=2&last=c"},
		{"other rel first, in one value", []string{`</a?x=1>; rel="prev", </b?last=z>; rel="next"`}, "?last=z"},
		{"second header value", []string{`</a?x=1>; rel="prev"`, `</b?last=y>;rel="next"`}, "?last=y"},
		{"next without a query", []string{`</v2/x/tags/list>; rel="next"`}, ""},
		{"not a link", []string{`garbage`}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := nextQuery(tc.links); got != tc.want {
				t.Errorf("nextQuery(%q) = %q, want %q", tc.links, got, tc.want)
			}
		})
	}
}

// TestFillGivesUpWithoutProgress: a fill whose upstream keeps ending the body before its
// Content-Length without adding a byte gives up as a short body (ErrShortBody, a 502 for
// clients): after statusAttempts answers before the first byte (issue 23: before, after
// maxStalledAttempts, by when a client had its 200), after maxStalledAttempts once bytes arrived
// (an upstream that ignores Range and breaks at the same place each time); one that resets the
// connection keeps the full patience of maxStalledAttempts and is no short body.
func TestFillGivesUpWithoutProgress(t *testing.T) {
	t.Parallel()
	blob, dgst := randomBlob(1 << 20)
	for _, tc := range []struct {
		name     string
		cut      int  // bytes each response carries before the connection breaks
		reset    bool // break with a reset (RST) instead of closing the connection (FIN)
		wantGets int64
		short    bool
	}{
		{"ends before the first byte", 0, false, statusAttempts, true},
		{"ignores Range, ends at the same byte", 64 << 10, false, 1 + maxStalledAttempts, true},
		{"resets before the first byte", 0, true, maxStalledAttempts, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var gets atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v2/" {
					return
				}
				gets.Add(1)
				w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
				w.WriteHeader(http.StatusOK) // Range ignored
				_, _ = w.Write(blob[:tc.cut])
				_ = http.NewResponseController(w).Flush()
				if tc.reset {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Error(err)
						return
					}
					_ = conn.(*net.TCPConn).SetLinger(0)
					_ = conn.Close()
					return
				}
				panic(http.ErrAbortHandler)
			}))
			t.Cleanup(srv.Close)
			f := testFetcher(t, srv, Options{})
			committed := false
			fl, _, err := f.Remote("upstream.test").StartFill(t.Context(), "team/app", v1.Descriptor{Digest: dgst, Size: int64(len(blob))},
				func(context.Context, string, v1.Descriptor) error { committed = true; return nil })
			if err != nil {
				t.Fatal(err)
			}
			<-fl.done
			if fl.err == nil || errors.Is(fl.err, ErrShortBody) != tc.short || committed {
				t.Errorf("fill error %v, committed %v; want it to give up, a short body: %v", fl.err, committed, tc.short)
			}
			if g := gets.Load(); g != tc.wantGets {
				t.Errorf("%d upstream GETs, want %d", g, tc.wantGets)
			}
		})
	}
}

// TestFillErrorLevel (newuser F15): a blob the upstream says does not exist is a client's
// question answered 404, logged at debug (the access log has the request); refused access is a
// warning; an unavailable upstream or a broken stream is an error.
func TestFillErrorLevel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want zerolog.Level
	}{
		{&Error{Upstream: "docker.io", Op: "GET blob", Status: http.StatusNotFound}, zerolog.DebugLevel},
		{fmt.Errorf("fill: %w", &Error{Upstream: "docker.io", Op: "GET blob", Status: http.StatusNotFound}), zerolog.DebugLevel},
		{&Error{Upstream: "docker.io", Op: "GET blob", Status: http.StatusUnauthorized}, zerolog.WarnLevel},
		{&Error{Upstream: "docker.io", Op: "GET blob", Status: http.StatusForbidden}, zerolog.WarnLevel},
		{&Error{Upstream: "docker.io", Op: "GET blob", Status: http.StatusTooManyRequests}, zerolog.ErrorLevel},
		{&Error{Upstream: "docker.io", Op: "GET blob", Status: http.StatusBadGateway}, zerolog.ErrorLevel},
		{&Error{Upstream: "docker.io", Op: "GET blob", Err: context.DeadlineExceeded}, zerolog.ErrorLevel},
		{errors.New("digest mismatch"), zerolog.ErrorLevel},
	} {
		if got := fillErrorLevel(tc.err); got != tc.want {
			t.Errorf("fillErrorLevel(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// TestFillWaitsForASlotOnce (issue 23, --upstream-concurrency): a fill whose first request finds
// the upstream's slots taken for the whole upstream timeout fails at once with ErrUpstreamBusy (a
// 429 for its clients), having sent nothing upstream; it is not retried like an upstream's own
// error status, which would keep its clients waiting for headers past the timeout three times.
func TestFillWaitsForASlotOnce(t *testing.T) {
	t.Parallel()
	blob, dgst := randomBlob(64 << 10)
	var gets atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v2/" {
			gets.Add(1)
			_, _ = w.Write(blob)
		}
	}))
	t.Cleanup(srv.Close)
	const timeout = 500 * time.Millisecond
	f := testFetcher(t, srv, Options{Concurrency: 1, Timeout: timeout})
	r := f.Remote("upstream.test")
	r.client.slots <- struct{}{} // the one slot, taken by a request that waits for headers
	start := time.Now()
	fl, _, err := r.StartFill(t.Context(), "team/app", v1.Descriptor{Digest: dgst, Size: int64(len(blob))},
		func(context.Context, string, v1.Descriptor) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	<-fl.done
	took := time.Since(start)
	var ue *Error
	if !errors.Is(fl.err, ErrUpstreamBusy) || !errors.As(fl.err, &ue) || ue.Status != http.StatusTooManyRequests || ue.RetryAfter != "1" {
		t.Errorf("fill error %v; want a 429 wrapping ErrUpstreamBusy with Retry-After 1", fl.err)
	}
	if took < timeout || took >= 2*timeout {
		t.Errorf("the fill failed after %s; want one wait of the upstream timeout (%s)", took, timeout)
	}
	if g := gets.Load(); g != 0 {
		t.Errorf("%d upstream GETs; want none while the slot was taken", g)
	}
	<-r.client.slots
	fl, _, err = r.StartFill(t.Context(), "team/app", v1.Descriptor{Digest: dgst, Size: int64(len(blob))},
		func(context.Context, string, v1.Descriptor) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	<-fl.done
	if fl.err != nil || len(r.client.slots) != 0 {
		t.Errorf("with the slot free: fill error %v, %d slots still taken; want it filled and its slot back", fl.err, len(r.client.slots))
	}
}
