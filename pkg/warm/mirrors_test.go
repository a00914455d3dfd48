package warm_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory" // storage driver
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/warm"
)

// upstreamName is the registry host the test images are referenced by. warm never dials it: it
// only names the upstream to the mirror (?ns= or path prefix), and each mirror maps it to the
// in-process upstream registry.
const upstreamName = "upstream.test"

// seen is one request a mirror received from warm.
type seen struct {
	Method, Path, RawQuery, UserAgent, Range, Accept string
}

// testMirror is a running mirror in front of one upstream, with the requests it received.
type testMirror struct {
	Name    string       // "stock" or "nodecache"
	URL     *url.URL     // base URL for warm
	Routing warm.Routing // routing warm uses with it
	// PullPrefix is what a plain registry client (ggcr) puts before the repository to reach
	// upstreamName's images through this mirror.
	PullPrefix string
	// Idle waits until the mirror has stored everything it fetched.
	Idle func(ctx context.Context) error

	mu   sync.Mutex
	reqs []seen
	wrap func(http.Handler) http.Handler
}

func (m *testMirror) serve(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.reqs = append(m.reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.UserAgent(), r.Header.Get("Range"), r.Header.Get("Accept")})
		wrap := m.wrap
		m.mu.Unlock()
		if wrap != nil {
			wrap(h).ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Requests returns the requests received so far.
func (m *testMirror) Requests() []seen {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]seen(nil), m.reqs...)
}

// Count counts requests with method (any when "") whose path contains substr.
func (m *testMirror) Count(method, substr string) int {
	n := 0
	for _, q := range m.Requests() {
		if (method == "" || q.Method == method) && strings.Contains(q.Path, substr) {
			n++
		}
	}
	return n
}

// Wrap installs fault-injecting middleware between warm and the mirror.
func (m *testMirror) Wrap(w func(http.Handler) http.Handler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.wrap = w
}

// newStockProxy runs distribution's STOCK pull-through proxy (registry:2 with proxy.remoteurl,
// in-memory storage) in front of up. It has exactly one upstream and never looks at ?ns=: warm
// uses ns routing with it, so the request path is the plain repository (which is what a
// registry:2 mirror expects) and the ns parameter is sent but ignored. Path routing cannot work
// with it: it would forward "upstream.test/<repo>" as the repository name.
func newStockProxy(t *testing.T, up *mirrortest.Registry) *testMirror {
	t.Helper()
	mirrortest.QuietLogrus()
	cfg := &configuration.Configuration{}
	cfg.Storage = configuration.Storage{"inmemory": configuration.Parameters{}}
	cfg.Log.Level = "error"
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.Proxy.RemoteURL = up.URL.String()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	app := handlers.NewApp(ctx, cfg)
	m := &testMirror{Name: "stock", Routing: warm.RoutingNS}
	srv := httptest.NewServer(m.serve(app))
	t.Cleanup(srv.Close)
	m.URL, _ = url.Parse(srv.URL)
	m.PullPrefix = m.URL.Host + "/"
	// registry:2 has no way to say it is idle: it commits a blob after its client has every
	// byte. Callers allow for that by retrying what depends on it.
	m.Idle = func(context.Context) error { return nil }
	return m
}

// newNodecache runs nodecache's own mirror (pkg/mirror, in-memory storage) with one upstream
// named upstreamName that is served by up. routing is what warm will use.
func newNodecache(t *testing.T, up *mirrortest.Registry, routing warm.Routing) *testMirror {
	t.Helper()
	mirrortest.QuietLogrus()
	m := &testMirror{Name: "nodecache-" + string(routing), Routing: routing}
	nc := nodecachetest.Start(t, nodecachetest.Options{Upstream: up, Alias: upstreamName, UpstreamTimeout: 5 * time.Second, Wrap: m.serve})
	m.Idle = nc.Mirror.WaitIdle
	m.URL, _ = url.Parse(nc.URL)
	m.PullPrefix = m.URL.Host + "/" + upstreamName + "/"
	return m
}

// mirrorKinds are the mirrors every walk test runs against.
var mirrorKinds = []struct {
	name  string
	start func(t *testing.T, up *mirrortest.Registry) *testMirror
}{
	{"stock-proxy", newStockProxy},
	{"nodecache-ns", func(t *testing.T, up *mirrortest.Registry) *testMirror { return newNodecache(t, up, warm.RoutingNS) }},
	{"nodecache-path", func(t *testing.T, up *mirrortest.Registry) *testMirror {
		return newNodecache(t, up, warm.RoutingPath)
	}},
}

// eachMirror runs test in a parallel subtest for each mirror kind, each on a new upstream
// (made with configure, when given); start puts that kind's mirror in front of the upstream and
// clears the upstream's record of requests, so what the test counts there is the mirror's.
func eachMirror(t *testing.T, test func(t *testing.T, up *mirrortest.Registry, start func() *testMirror), configure ...func(*configuration.Configuration)) {
	t.Helper()
	for _, kind := range mirrorKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, configure)
			test(t, up, func() *testMirror {
				m := kind.start(t, up)
				up.ResetRequests()
				return m
			})
		})
	}
}

// newUpstream starts an upstream registry, with the first of configure when there is one.
func newUpstream(t *testing.T, configure []func(*configuration.Configuration)) *mirrortest.Registry {
	t.Helper()
	if len(configure) > 0 {
		return mirrortest.NewRegistryWithConfig(t, configure[0])
	}
	return mirrortest.NewRegistry(t)
}

// pushAmd64 pushes a linux/amd64 image of the given number of layers to up as repo:v1 and
// returns its config and layer digests.
func pushAmd64(t *testing.T, up *mirrortest.Registry, repo string, layers int) []string {
	t.Helper()
	img := mirrortest.Image(t, layerBytes, layers, "linux/amd64")
	up.PushImage(t, repo, "v1", img)
	return digestsOf(t, img)
}

// digestsOf returns the config and layer digests of img.
func digestsOf(t *testing.T, img v1.Image) []string {
	t.Helper()
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	out := []string{mf.Config.Digest.String()}
	for _, l := range mf.Layers {
		out = append(out, l.Digest.String())
	}
	return out
}

// wantNotFetched fails t for each of digests (what's blobs or manifests: "arm64", "the tag's
// blob") that the upstream was asked for.
func wantNotFetched(t *testing.T, up *mirrortest.Registry, what string, digests []string) {
	t.Helper()
	for _, d := range digests {
		if n := up.Count("", d); n != 0 {
			t.Errorf("upstream got %d requests for %s %s", n, what, d)
		}
	}
}

// childrenOf returns idx's images by platform ("linux/amd64", ..., "unknown/unknown#0", ...).
func childrenOf(t *testing.T, idx v1.ImageIndex) map[string]v1.Image {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1.Image{}
	for i, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		key := d.Platform.OS + "/" + d.Platform.Architecture
		if d.Platform.Variant != "" {
			key += "/" + d.Platform.Variant
		}
		if d.Platform.OS == "unknown" {
			key += fmt.Sprintf("#%d", i)
		}
		out[key] = img
	}
	return out
}

// putManifest uploads raw manifest bytes to repo:ref on up, as a client would push them.
func putManifest(t *testing.T, up *mirrortest.Registry, repo, ref string, mt types.MediaType, body []byte) {
	t.Helper()
	u := up.URL.JoinPath("/v2/", repo, "manifests", ref).String()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", string(mt))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT %s: %v", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("PUT %s: %s %s", u, resp.Status, b)
	}
}

// prettyJSON marshals v with four-space indentation and a trailing newline: bytes that differ
// from any canonical encoding, so a client that re-encodes gets a different digest.
func prettyJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

type staticDoc struct {
	mt   types.MediaType
	body []byte
}

// newStaticMirror answers /v2/ and the given paths with fixed documents, 404 otherwise.
func newStaticMirror(t *testing.T, docs map[string]staticDoc) *testMirror {
	t.Helper()
	m := &testMirror{Name: "static", Routing: warm.RoutingNS}
	srv := httptest.NewServer(m.serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			_, _ = io.WriteString(w, "{}")
			return
		}
		d, ok := docs[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", string(d.mt))
		_, _ = w.Write(d.body)
	})))
	t.Cleanup(srv.Close)
	m.URL, _ = url.Parse(srv.URL)
	return m
}
