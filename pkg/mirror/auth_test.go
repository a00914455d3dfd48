package mirror_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// hubLike is a Docker-Hub-shaped upstream: the registry (registry.hub.test) demands anonymous
// bearer tokens from a separate realm (auth.hub.test), answers blob HEADs with a relative
// redirect and blob GETs with a 307 to a CDN host (cdn.test). Every *.test name resolves to
// 127.0.0.1 through the test transport.
type hubLike struct {
	registry, auth, cdn, push *httptest.Server
	mu                        sync.Mutex
	tokens                    int
	leaks                     []string // requests that carried credentials to a host other than the registry
	unauthorized              int
	// user and password, when set (private), are required at the token realm (HTTP Basic);
	// tokens are then handed out to those credentials only.
	user, password string
	tokenAuths     []string // the Authorization headers the realm received
	// realmHost is the token realm's host name announced in challenges; default auth.hub.test.
	realmHost string
}

const hubToken = "anonymous-token-1"

func newHubLike(t *testing.T) *hubLike {
	t.Helper()
	inner := mirrortest.NewHandler(t)
	hub := &hubLike{}
	hub.push = httptest.NewServer(inner)
	t.Cleanup(hub.push.Close)
	hub.auth = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hub.mu.Lock()
		hub.tokens++
		user, password := hub.user, hub.password
		hub.tokenAuths = append(hub.tokenAuths, r.Header.Get("Authorization"))
		if user == "" && r.Header.Get("Authorization") != "" {
			hub.leaks = append(hub.leaks, "auth: "+r.Header.Get("Authorization"))
		}
		hub.mu.Unlock()
		if u, p, ok := r.BasicAuth(); user != "" && (!ok || u != user || p != password) {
			w.Header().Set("WWW-Authenticate", `Basic realm="hub"`)
			http.Error(w, `{"details":"incorrect username or password"}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Query().Get("service") != "registry.hub.test" || !strings.HasPrefix(r.URL.Query().Get("scope"), "repository:") {
			http.Error(w, "bad token request "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"token": hubToken})
	}))
	t.Cleanup(hub.auth.Close)
	hub.cdn = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			hub.mu.Lock()
			hub.leaks = append(hub.leaks, "cdn: "+r.Header.Get("Authorization"))
			hub.mu.Unlock()
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/cdn")
		inner.ServeHTTP(w, r2)
	}))
	t.Cleanup(hub.cdn.Close)
	hub.registry = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+hubToken {
			hub.mu.Lock()
			hub.unauthorized++
			realm := hub.realmHost
			hub.mu.Unlock()
			if realm == "" {
				realm = "auth.hub.test"
			}
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s:%s/token",service="registry.hub.test"`, realm, port(hub.auth)))
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
			return
		}
		switch {
		case strings.HasPrefix(r.URL.Path, "/relative/"):
			r2 := r.Clone(r.Context())
			r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/relative")
			inner.ServeHTTP(w, r2)
		case strings.Contains(r.URL.Path, "/blobs/sha256:") && r.Method == http.MethodHead:
			w.Header().Set("Location", "/relative"+r.URL.Path)
			w.WriteHeader(http.StatusTemporaryRedirect)
		case strings.Contains(r.URL.Path, "/blobs/sha256:"):
			w.Header().Set("Location", fmt.Sprintf("http://cdn.test:%s/cdn%s?sig=x", port(hub.cdn), r.URL.Path))
			w.WriteHeader(http.StatusTemporaryRedirect)
		default:
			inner.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(hub.registry.Close)
	return hub
}

// pusher is a Registry whose pushers write to the hub's storage directly (no token, no
// redirect).
func (hub *hubLike) pusher() *mirrortest.Registry {
	return &mirrortest.Registry{Addr: hub.push.Listener.Addr().String()}
}

// upstream is the hub as nodecache's docker.io upstream, by its name registry.hub.test.
func (hub *hubLike) upstream(t *testing.T) name.Upstream {
	t.Helper()
	return parseUpstream(t, "docker.io=http://registry.hub.test:"+port(hub.registry))
}

func port(s *httptest.Server) string {
	_, p, _ := net.SplitHostPort(s.Listener.Addr().String())
	return p
}

// TestBearerTokenAndRedirects (g): pulls work from an upstream that wants anonymous bearer
// tokens from a separate realm and redirects blobs to another host; credentials stay with the
// registry host and the client never sees a redirect.
func TestBearerTokenAndRedirects(t *testing.T) {
	t.Parallel()
	hub := newHubLike(t)
	pushTo := hub.pusher()
	idx := mirrortest.MultiPlatformIndex(t, 1*mirrortest.MiB, 1)
	pushTo.PushIndex(t, "library/alpine", "3.20", idx)

	up := hub.upstream(t)
	h := newHarness(t, mirror.Options{Upstreams: []name.Upstream{up}})

	// docker.io is the default upstream and single-component names get library/.
	got := pullIndexGGCR(t, ref(t, h.host+"/alpine:3.20"))
	if digestOf(t, got) != digestOf(t, idx) {
		t.Fatal("wrong index through the token-protected upstream")
	}
	// HEAD on a cold blob follows the relative redirect.
	_, img := mirrortest.IndexChild(t, idx, 1)
	d := mirrortest.LayerDigests(t, img)[0]
	resp, _ := get(t, http.MethodHead, fmtURL(h, "/v2/library/alpine/blobs/"+d.String()+"?ns=docker.io"), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD through a relative redirect: %d", resp.StatusCode)
	}
	for _, l := range h.logs.requests(t) {
		if s, _ := l["status"].(float64); s >= 300 && s < 400 {
			t.Fatalf("client saw a redirect: %v", l)
		}
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.tokens == 0 || hub.unauthorized == 0 {
		t.Fatalf("token flow not exercised: %d tokens, %d challenges", hub.tokens, hub.unauthorized)
	}
	if len(hub.leaks) > 0 {
		t.Fatalf("credentials crossed hosts: %v", hub.leaks)
	}
}
