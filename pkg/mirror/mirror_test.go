package mirror_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// syncBuffer is the mirror's JSON log.
type syncBuffer struct{ mirrortest.LogBuffer }

// requests returns the access-log lines ("message":"request").
func (s *syncBuffer) requests(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range s.JSONLines(t) {
		if m["message"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// harness is a running nodecache in front of upstream registries.
type harness struct {
	m      *mirror.Mirror
	srv    *httptest.Server
	host   string // mirror host:port
	logs   *syncBuffer
	served *int64 // requests that reached the mirror's handler
	mu     sync.Mutex
	// stopRun stops what run started (nil: not running).
	stopRun func()
}

// testDialer resolves every *.test name to 127.0.0.1, so nothing leaves the machine.
func testTransport(timeout time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: timeout}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if strings.HasSuffix(host, ".test") {
				addr = net.JoinHostPort("127.0.0.1", port)
			}
			return d.DialContext(ctx, network, addr)
		},
		ResponseHeaderTimeout: timeout,
	}
}

// testResolver resolves every *.test name to 127.0.0.1, as testTransport dials them, and any
// other name as the system does: the address guard checks redirect targets and token realms by
// the addresses it resolves.
type testResolver struct{}

func (testResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if strings.HasSuffix(strings.TrimSuffix(host, "."), ".test") {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}

func newHarness(t *testing.T, opts mirror.Options) *harness {
	t.Helper()
	h := &harness{logs: &syncBuffer{}, served: new(int64)}
	opts.Logger = zerolog.New(h.logs).With().Timestamp().Logger()
	if opts.UpstreamTimeout == 0 {
		opts.UpstreamTimeout = 3 * time.Second
	}
	if opts.Transport == nil {
		opts.Transport = testTransport(opts.UpstreamTimeout)
	}
	if opts.UpstreamResolver == nil {
		opts.UpstreamResolver = testResolver{}
	}
	mirrortest.QuietLogrus()
	m, err := mirror.New(t.Context(), opts)
	if err != nil {
		t.Fatalf("mirror.New: %v", err)
	}
	h.m = m
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		*h.served++
		h.mu.Unlock()
		m.ServeHTTP(w, r)
	}))
	h.host = h.srv.Listener.Addr().String()
	t.Cleanup(func() {
		h.srv.Close()
		_ = m.Close()
		if t.Failed() {
			t.Logf("nodecache log:\n%s", h.logs.String())
		}
	})
	return h
}

// waitIdle waits (a minute at most) until h's fills are over.
func (h *harness) waitIdle(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := h.m.WaitIdle(ctx); err != nil {
		t.Fatalf("fills did not finish: %v", err)
	}
}

// newHarnessFor is the harness of most tests: nodecache with default options in front of up,
// named upstream.test.
func newHarnessFor(t *testing.T, up *mirrortest.Registry) *harness {
	t.Helper()
	return newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)}})
}

// run runs the mirror's background work (index, eviction) until close or the end of the test,
// before the mirror closes.
func (h *harness) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.m.Run(ctx)
	}()
	var once sync.Once
	h.stopRun = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(h.stopRun)
}

// runReady is run, then a wait until the cache index is loaded (read, or rebuilt from storage):
// the inventory says Ready.
func (h *harness) runReady(t *testing.T) {
	t.Helper()
	h.run(t)
	waitInventory(t, h.host, "the cache index loaded", func(inv mirrorapi.CacheInventory) bool { return inv.Ready })
}

// close stops the mirror's background work and serving, and closes the mirror (a clean
// shutdown, which writes the cache index).
func (h *harness) close(t *testing.T) {
	t.Helper()
	if h.stopRun != nil {
		h.stopRun()
	}
	h.srv.Close()
	if err := h.m.Close(); err != nil {
		t.Fatalf("close the mirror: %v", err)
	}
}

func (h *harness) registryRequests() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return *h.served
}

func upstreamFor(t testing.TB, upstreamName string, r *mirrortest.Registry) regname.Upstream {
	t.Helper()
	return parseUpstream(t, upstreamName+"="+r.URL.String())
}

// parseUpstream parses an upstream as --upstream takes it ("name=URL").
func parseUpstream(t testing.TB, spec string) regname.Upstream {
	t.Helper()
	u, err := regname.ParseUpstream(spec)
	if err != nil {
		t.Fatalf("upstream %q: %v", spec, err)
	}
	return u
}

func ref(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatalf("reference %q: %v", s, err)
	}
	return r
}

// pullIndexGGCR pulls ref as an index with go-containerregistry and validates every image in it
// (every manifest, config and layer is fetched and its digest checked).
func pullIndexGGCR(t *testing.T, r name.Reference) v1.ImageIndex {
	t.Helper()
	idx, err := remote.Index(r, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pull index %s: %v", r, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatalf("index manifest %s: %v", r, err)
	}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatalf("image %s: %v", d.Digest, err)
		}
		if err := validate.Image(img); err != nil {
			t.Fatalf("validate image %s of %s: %v", d.Digest, r, err)
		}
	}
	return idx
}

// poll calls get every 20 ms until ok accepts what it returned, for 10 s at most; past that the
// test fails naming what it waited for, with show's account of the last value.
func poll[T any](t *testing.T, what string, get func() T, ok func(T) bool, show func(T) string) T {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := get()
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s; %s", what, show(v))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func digestOf(t *testing.T, x interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	d, err := x.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// hostsDir copies a testdata hosts.toml tree, pointing it at the mirror.
func hostsDir(t *testing.T, src, mirrorHost string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), bytes.ReplaceAll(b, []byte("MIRROR"), []byte(mirrorHost)), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// pullContainerd resolves and fetches ref (index, every manifest, config and layer) with
// containerd's own resolver configured by the hosts.toml files under dir, verifying every digest.
func pullContainerd(t *testing.T, dir, ref string) ocispec.Descriptor {
	t.Helper()
	ctx := t.Context()
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: config.ConfigureHosts(ctx, config.HostOptions{HostDir: config.HostDirFromRoot(dir)}),
	})
	name, desc, err := resolver.Resolve(ctx, ref)
	if err != nil {
		t.Fatalf("containerd resolve %s: %v", ref, err)
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		t.Fatalf("containerd fetcher: %v", err)
	}
	fetchTree(t, ctx, fetcher, desc)
	return desc
}

func fetchTree(t *testing.T, ctx context.Context, f remotes.Fetcher, d ocispec.Descriptor) {
	t.Helper()
	rc, err := f.Fetch(ctx, d)
	if err != nil {
		t.Fatalf("containerd fetch %s %s: %v", d.MediaType, d.Digest, err)
	}
	body, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil {
		t.Fatalf("containerd read %s: %v", d.Digest, err)
	}
	sum := sha256.Sum256(body)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != d.Digest.String() {
		t.Fatalf("blob %s: got digest %s", d.Digest, got)
	}
	switch d.MediaType {
	case ocispec.MediaTypeImageIndex, "application/vnd.docker.distribution.manifest.list.v2+json":
		var idx ocispec.Index
		if err := json.Unmarshal(body, &idx); err != nil {
			t.Fatal(err)
		}
		for _, m := range idx.Manifests {
			fetchTree(t, ctx, f, m)
		}
	case ocispec.MediaTypeImageManifest, "application/vnd.docker.distribution.manifest.v2+json":
		var man ocispec.Manifest
		if err := json.Unmarshal(body, &man); err != nil {
			t.Fatal(err)
		}
		fetchTree(t, ctx, f, man.Config)
		for _, l := range man.Layers {
			fetchTree(t, ctx, f, l)
		}
	}
}

// get sends a method request for url with the headers hdr and reads the whole answer.
func get(t *testing.T, method, url string, hdr http.Header) (*http.Response, []byte) {
	t.Helper()
	return send(t, http.DefaultClient, newRequest(t, method, url, hdr))
}

// newRequest is a method request for url, with the headers hdr, that ends with the test.
func newRequest(t *testing.T, method, url string, hdr http.Header) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return req
}

// send sends req with client and reads the whole answer.
func send(t *testing.T, client *http.Client, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL, err)
	}
	return resp, body
}

var manifestAccept = http.Header{"Accept": {
	"application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, " +
		"application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json",
}}

func fmtURL(h *harness, path string) string { return fmt.Sprintf("http://%s%s", h.host, path) }

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func mustPlatform(t *testing.T, s string) v1.Platform {
	t.Helper()
	p, err := v1.ParsePlatform(s)
	if err != nil {
		t.Fatal(err)
	}
	return *p
}
