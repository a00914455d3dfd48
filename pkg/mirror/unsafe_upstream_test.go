package mirror_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// internalService stands for what an upstream must never make nodecache fetch: a service on
// the node's loopback or inside the network (a kubelet, a metadata service). It listens on
// addr's loopback address, counts every request and answers /big with 135,000 bytes and
// /manifest.json with a JSON document that parses as an OCI image manifest.
type internalService struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests []string
	big      []byte
	manifest []byte
}

func newInternalService(t *testing.T, addr string) *internalService {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s (every 127.0.0.0/8 address is loopback on Linux): %v", addr, err)
	}
	s := &internalService{big: bytes.Repeat([]byte("INTERNAL"), 135000/8)}
	s.manifest, _ = json.Marshal(v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageManifest,
		Config:    v1.Descriptor{MediaType: v1.MediaTypeImageConfig, Digest: digest.FromString("internal-config"), Size: 15},
		Layers:    []v1.Descriptor{},
	})
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, r.Method+" "+r.URL.String())
		s.mu.Unlock()
		switch r.URL.Path {
		case "/manifest.json":
			w.Header().Set("Content-Type", v1.MediaTypeImageManifest)
			_, _ = w.Write(s.manifest)
		case "/token":
			_ = json.NewEncoder(w).Encode(map[string]string{"token": "internal-secret-token"})
		default:
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(s.big))
		}
	}))
	s.srv.Listener = l
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *internalService) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

func (s *internalService) url(path string) string { return s.srv.URL + path }

// redirectingUpstream is a real registry holding library/app:latest whose blob and manifest
// answers (GET and HEAD) are redirects to target(kind) while target returns non-empty, and the
// digest of the image's layer.
func redirectingUpstream(t *testing.T, target func(kind string) string) (*mirrortest.Registry, digest.Digest) {
	t.Helper()
	reg, img := mirrortest.NewRegistryWithImage(t, "library/app", "latest", 4096)
	layer := digest.Digest(mirrortest.LayerDigests(t, img)[0].String())
	reg.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			kind := ""
			switch {
			case strings.Contains(r.URL.Path, "/blobs/"):
				kind = "blob"
			case strings.Contains(r.URL.Path, "/manifests/"):
				kind = "manifest"
			}
			if to := target(kind); kind != "" && to != "" {
				http.Redirect(w, r, to, http.StatusTemporaryRedirect)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	return reg, layer
}

// redirects are the targets of a redirectingUpstream, by kind ("blob", "manifest"), settable while
// it serves: its target func is redirects.to.
type redirects struct {
	mu      sync.Mutex
	targets map[string]string
}

// set makes requests of kind redirect to target ("": no more redirects).
func (r *redirects) set(kind, target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets == nil {
		r.targets = map[string]string{}
	}
	r.targets[kind] = target
}

func (r *redirects) to(kind string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.targets[kind]
}

// TestRedirectInsideRefused: an upstream that redirects a blob (GET, Range, HEAD) or a manifest
// to a loopback address other than its own makes nodecache answer 502 naming the target, with no
// request reaching the internal service, no internal byte reaching the client and nothing
// cached: a later request asks the upstream again. The refusals are counted and logged.
func TestRedirectInsideRefused(t *testing.T) {
	t.Parallel()
	internal := newInternalService(t, "127.0.0.5:0")
	var redirect redirects
	redirect.set("blob", internal.url("/big"))
	redirect.set("manifest", internal.url("/manifest.json"))
	reg, layer := redirectingUpstream(t, redirect.to)
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "docker.io", reg)}})

	blobURL := fmtURL(h, "/v2/library/app/blobs/"+layer.String()+"?ns=docker.io")
	cases := []struct {
		name, method, url string
		hdr               http.Header
	}{
		{"blob GET", http.MethodGet, blobURL, nil},
		{"blob Range", http.MethodGet, blobURL, http.Header{"Range": {"bytes=0-1023"}}},
		{"blob HEAD", http.MethodHead, blobURL, nil},
		{"manifest by tag", http.MethodGet, fmtURL(h, "/v2/library/app/manifests/latest?ns=docker.io"), manifestAccept},
	}
	for round := 0; round < 2; round++ { // the second round: nothing was cached by the first
		for _, c := range cases {
			resp, body := get(t, c.method, c.url, c.hdr)
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("round %d, %s: status %d, want 502; body %q", round, c.name, resp.StatusCode, clip(body))
			}
			if bytes.Contains(body, []byte("INTERNAL")) || bytes.Contains(body, internal.manifest[:20]) {
				t.Fatalf("round %d, %s: the internal service's bytes reached the client: %q", round, c.name, clip(body))
			}
			if c.method == http.MethodGet && !strings.Contains(string(body), "127.0.0.5") {
				t.Errorf("round %d, %s: the 502 does not name the refused target: %q", round, c.name, body)
			}
		}
	}
	if got := internal.seen(); len(got) != 0 {
		t.Fatalf("the internal service was reached: %q", got)
	}
	// Every case of both rounds was refused at least once (the fill and the HEAD each once).
	if n := metricValue(t, h, `nodecache_upstream_refused_targets_total{reason="loopback",upstream="docker.io"}`); n < float64(2*len(cases)) {
		t.Errorf("refusals counted %v times by reason loopback, want at least %d", n, 2*len(cases))
	}
	if !strings.Contains(h.logs.String(), "refused a connection the upstream's answer asked for") {
		t.Errorf("refusal not logged:\n%s", h.logs.String())
	}

	// The upstream mends its ways: the same requests are answered from it, so nothing the
	// refused redirects pointed at was stored in their place.
	redirect.set("blob", "")
	redirect.set("manifest", "")
	resp, body := get(t, http.MethodGet, blobURL, nil)
	if resp.StatusCode != http.StatusOK || digest.FromBytes(body) != layer {
		t.Fatalf("after the upstream stopped redirecting: status %d, digest %s, want 200 %s", resp.StatusCode, digest.FromBytes(body), layer)
	}
	if resp.Header.Get("X-Nodecache-Cache") != "miss" {
		t.Errorf("first good answer is %q, want miss (nothing was cached before)", resp.Header.Get("X-Nodecache-Cache"))
	}
}

// TestRedirectAllowPrivate: --upstream-allow-private admits exactly the networks it lists — a
// redirect to 127.0.0.5 is followed once 127.0.0.5/32 is listed, one to 127.0.0.2 still refused —
// and an upstream redirecting to its own address (127.0.0.1, another port) needs no listing.
func TestRedirectAllowPrivate(t *testing.T) {
	t.Parallel()
	listed := newInternalService(t, "127.0.0.5:0")
	unlisted := newInternalService(t, "127.0.0.2:0")
	own := newInternalService(t, "127.0.0.1:0")
	var redirect redirects
	reg, layer := redirectingUpstream(t, redirect.to)
	h := newHarness(t, mirror.Options{
		Upstreams:            []regname.Upstream{upstreamFor(t, "docker.io", reg)},
		UpstreamAllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.5/32")},
	})
	for _, c := range []struct {
		name        string
		svc         *internalService
		wantReached bool
	}{
		{"listed 127.0.0.5", listed, true},
		{"unlisted 127.0.0.2", unlisted, false},
		{"own address 127.0.0.1", own, true},
	} {
		redirect.set("blob", c.svc.url("/big"))
		resp, body := getLenient(t, fmtURL(h, "/v2/library/app/blobs/"+layer.String()+"?ns=docker.io"))
		// The target's bytes are never the layer: a reached target ends in a digest mismatch
		// (the body cut short, its last byte held back), a refused one in a 502.
		if bytes.Equal(body, c.svc.big) {
			t.Errorf("%s: the whole wrong body reached the client", c.name)
		}
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		if !c.wantReached && status != http.StatusBadGateway {
			t.Errorf("%s: status %d, want 502", c.name, status)
		}
		if reached := len(c.svc.seen()) > 0; reached != c.wantReached {
			t.Errorf("%s: reached %v, want %v (answer %d %q)", c.name, reached, c.wantReached, status, clip(body))
		}
	}
}

// TestRealmOnLocalhostRefused: an upstream (on 127.0.0.2) whose challenge names a token realm on
// localhost gets no request sent there, and so never receives the internal service's token.
func TestRealmOnLocalhostRefused(t *testing.T) {
	t.Parallel()
	internal := newInternalService(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(internal.srv.Listener.Addr().String())
	reg := mirrortest.NewRegistryAt(t, "127.0.0.2:0")
	reg.PushImage(t, "library/app", "latest", mirrortest.Image(t, 1024, 1, "linux/amd64"))
	reg.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") == "" {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://localhost:%s/token",service="evil"`, port))
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	reg.ResetRequests()
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "docker.io", reg)}})
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/library/app/manifests/latest?ns=docker.io"), manifestAccept)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "localhost") {
		t.Fatalf("status %d %q, want 502 naming the realm host", resp.StatusCode, body)
	}
	if got := internal.seen(); len(got) != 0 {
		t.Fatalf("the realm on localhost was fetched: %q", got)
	}
	for _, q := range reg.Requests() {
		if strings.Contains(q.Authorization, "internal-secret-token") {
			t.Fatalf("the internal token went to the upstream: %+v", q)
		}
	}
}

// TestRedirectDowngradeRefused: an https upstream redirecting a blob to http — even to its own
// address — is refused: the redirect would strip TLS from the transfer.
func TestRedirectDowngradeRefused(t *testing.T) {
	t.Parallel()
	plain := newInternalService(t, "127.0.0.1:0")
	inner := mirrortest.NewHandler(t)
	ca := mirrortest.NewCA(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") {
			http.Redirect(w, r, plain.url("/big?X-Amz-Signature=SECRETSIG"), http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	srv.TLS = ca.TLSConfig(t, "127.0.0.1")
	srv.StartTLS()
	t.Cleanup(srv.Close)
	up := parseUpstream(t, "docker.io="+srv.URL)
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{up},
		UpstreamRootCAs: map[string]*x509.CertPool{"docker.io": ca.Pool()}})
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/library/app/blobs/"+digest.FromString("x").String()+"?ns=docker.io"), nil)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "downgrade") {
		t.Fatalf("status %d %q, want 502 naming the downgrade", resp.StatusCode, body)
	}
	if strings.Contains(string(body), "SECRETSIG") || strings.Contains(h.logs.String(), "SECRETSIG") {
		t.Errorf("the redirect's signed query reached the client or the log: %q", body)
	}
	if got := plain.seen(); len(got) != 0 {
		t.Fatalf("the http target was reached: %q", got)
	}
}

// TestGzipBodyNotExpanded: an upstream that answers a blob of unstated size with a
// Content-Encoding: gzip body (1 MiB of compressed zeros that would expand to 1 GiB) is taken as
// the bytes it sent: nodecache never asks for compression, never decompresses, reads no more
// than was sent and stores nothing (the bytes are not the digest).
func TestGzipBodyNotExpanded(t *testing.T) {
	t.Parallel()
	var bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&bomb, gzip.BestCompression)
	zeros := make([]byte, 1<<20)
	for i := 0; i < 1024; i++ {
		_, _ = zw.Write(zeros)
	}
	_ = zw.Close()
	var (
		mu        sync.Mutex
		encodings []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		encodings = append(encodings, r.Header.Get("Accept-Encoding"))
		mu.Unlock()
		switch {
		case r.URL.Path == "/v2/":
			w.WriteHeader(http.StatusOK)
		case r.Method == http.MethodHead:
			w.WriteHeader(http.StatusMethodNotAllowed) // size unstated
		default:
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush() // chunked: no Content-Length
			_, _ = w.Write(bomb.Bytes())
		}
	}))
	t.Cleanup(srv.Close)
	up := parseUpstream(t, "docker.io="+srv.URL)
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{up}, Root: t.TempDir()})
	blob := make([]byte, 4096)
	_, _ = rand.Read(blob)
	resp, body := getLenient(t, fmtURL(h, "/v2/library/app/blobs/"+digest.FromBytes(blob).String()+"?ns=docker.io"))
	if resp != nil && resp.StatusCode == http.StatusOK && int64(len(body)) > int64(bomb.Len()) {
		t.Fatalf("the client got %d bytes from a %d-byte answer", len(body), bomb.Len())
	}
	fetched := metricValue(t, h, `nodecache_upstream_fetched_bytes_total{tier="upstream",upstream="docker.io"}`)
	if fetched > float64(bomb.Len()) || fetched == 0 {
		t.Fatalf("read %v bytes from an upstream that sent %d", fetched, bomb.Len())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range encodings {
		if strings.Contains(e, "gzip") {
			t.Fatalf("nodecache asked the upstream for gzip: %q", encodings)
		}
	}
}

// TestUnknownSizeBounded: a blob whose size the upstream states nowhere stops at
// MaxUnknownBlobSize (--max-unknown-blob-size): the fill fails, the client never gets more than
// the bound, and nothing is stored.
func TestUnknownSizeBounded(t *testing.T) {
	t.Parallel()
	const bound = 1 << 20
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
			w.WriteHeader(http.StatusOK)
		case r.Method == http.MethodHead:
			w.WriteHeader(http.StatusMethodNotAllowed)
		default:
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			chunk := make([]byte, 64<<10)
			for i := 0; i < 64; i++ { // 4 MiB, four times the bound
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(srv.Close)
	up := parseUpstream(t, "docker.io="+srv.URL)
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{up}, Root: t.TempDir(), MaxUnknownBlobSize: bound})
	resp, body := getLenient(t, fmtURL(h, "/v2/library/app/blobs/"+digest.FromString("never").String()+"?ns=docker.io"))
	if len(body) > bound {
		t.Fatalf("the client got %d bytes past the %d-byte bound", len(body), bound)
	}
	if resp != nil && resp.StatusCode == http.StatusOK && len(body) == bound {
		t.Logf("headers were out before the bound was passed: the body was cut (%d bytes)", len(body))
	}
	if fetched := metricValue(t, h, `nodecache_upstream_fetched_bytes_total{tier="upstream",upstream="docker.io"}`); fetched > bound+64<<10 {
		t.Fatalf("read %v bytes, bound %d", fetched, bound)
	}
	if !strings.Contains(h.logs.String(), "larger than the bound") {
		t.Errorf("the fill's failure does not name the bound:\n%s", h.logs.String())
	}
}

// getLenient GETs url and reads what arrives, also from a response cut short (a blob whose fill
// failed after its headers): resp is nil when no answer came.
func getLenient(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// clip shortens a body for a failure message.
func clip(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// TestRedirectToAnotherUpstreamRefused: an upstream's own address is its own, not every
// configured upstream's: docker.io (on 127.0.0.1) redirecting to the address of another
// configured upstream (internal.lan on 127.0.0.5, a registry inside the network), on its port or
// another, is refused, while internal.lan itself is pulled from as configured.
func TestRedirectToAnotherUpstreamRefused(t *testing.T) {
	t.Parallel()
	internal := mirrortest.NewRegistryAt(t, "127.0.0.5:0")
	internal.PushImage(t, "team/app", "v1", mirrortest.Image(t, 1024, 1, "linux/amd64"))
	other := newInternalService(t, "127.0.0.5:0")
	var redirect redirects
	pub, layer := redirectingUpstream(t, redirect.to)
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{
		upstreamFor(t, "docker.io", pub), upstreamFor(t, "internal.lan", internal),
	}})
	resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/internal.lan/team/app/manifests/v1"), manifestAccept)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("internal.lan itself: status %d", resp.StatusCode)
	}
	internal.ResetRequests()
	for _, target := range []string{"http://" + internal.Addr + "/v2/team/app/manifests/v1", other.url("/big")} {
		redirect.set("blob", target)
		resp, body := getLenient(t, fmtURL(h, "/v2/library/app/blobs/"+layer.String()+"?ns=docker.io"))
		if resp == nil || resp.StatusCode != http.StatusBadGateway {
			t.Errorf("docker.io redirected to %s: answer %v %q, want 502", target, resp, clip(body))
		}
	}
	if n := len(internal.Requests()); n != 0 {
		t.Errorf("docker.io's redirect reached internal.lan: %+v", internal.Requests())
	}
	if got := other.seen(); len(got) != 0 {
		t.Errorf("docker.io's redirect reached another port of internal.lan's address: %q", got)
	}
}

// TestRedirectIntoItselfStops: an upstream redirecting a blob back into nodecache's own listener
// (reachable here: the upstream and nodecache share 127.0.0.1) does not make it recurse: the
// redirected request carries this nodecache's Via entry, and its loop check answers 508 at the
// first hop.
func TestRedirectIntoItselfStops(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		self string
		hops int
	)
	reg, layer := redirectingUpstream(t, func(kind string) string {
		mu.Lock()
		defer mu.Unlock()
		if kind != "blob" || self == "" || hops >= 50 { // the upstream's own bound, so a failing test ends
			return ""
		}
		hops++
		// Another repository each hop: no hop joins the fetch of the one before.
		return fmt.Sprintf("http://%s/v2/library/loop%d/blobs/%s?ns=docker.io", self, hops, digest.FromString("loop"))
	})
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "docker.io", reg)}})
	mu.Lock()
	self = h.host
	mu.Unlock()
	start := time.Now()
	resp, body := getLenient(t, fmtURL(h, "/v2/library/app/blobs/"+layer.String()+"?ns=docker.io"))
	if resp == nil || resp.StatusCode < 500 {
		t.Fatalf("answer %v %q, want an error", resp, clip(body))
	}
	if n := h.registryRequests(); n > 4 {
		t.Errorf("nodecache served %d requests for one pull redirected into itself, want at most a hop", n)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the loop took %s to end", d)
	}
}

// TestMethodLabelBounded: a made-up request method is counted as "other", so clients cannot make
// a metric series each.
func TestMethodLabelBounded(t *testing.T) {
	t.Parallel()
	reg := mirrortest.NewRegistry(t)
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "docker.io", reg)}})
	for _, m := range []string{"AAAA1", "ZZZ-19474"} {
		resp, _ := get(t, m, fmtURL(h, "/v2/library/app/manifests/latest"), nil)
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: status %d, want 405", m, resp.StatusCode)
		}
	}
	_, metrics := get(t, http.MethodGet, fmtURL(h, "/metrics"), nil)
	if strings.Contains(string(metrics), "AAAA1") || strings.Contains(string(metrics), "ZZZ-19474") {
		t.Errorf("a made-up method became a label value:\n%s", grepLines(string(metrics), "nodecache_requests_total"))
	}
	if !strings.Contains(string(metrics), `method="other"`) {
		t.Errorf("no method=\"other\" series:\n%s", grepLines(string(metrics), "nodecache_requests_total"))
	}
}
