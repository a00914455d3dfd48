package mirror_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	regname "github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

const (
	testUser     = "puller"
	testPassword = "pa55-w0rd-never-logged"
)

// writeDockerConfig writes a docker config.json with auths (key -> entry) to path.
func writeDockerConfig(t *testing.T, path string, auths map[string]map[string]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"auths": auths})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func basicAuth(user, password string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
}

func loadCredentials(t *testing.T, file, registry string) *upstreamauth.Credentials {
	t.Helper()
	c, err := upstreamauth.LoadCredentials(file, registry, upstreamauth.CredentialsOptions{})
	if err != nil {
		t.Fatalf("LoadCredentials %s for %s: %v", file, registry, err)
	}
	return c
}

// checkNoSecret fails when the mirror's log, its metrics or its /nodecache/v1/ answers hold the
// password.
func checkNoSecret(t *testing.T, h *harness, secret string) {
	t.Helper()
	for _, p := range []string{"/metrics", "/nodecache/v1/clients"} {
		resp, body := get(t, http.MethodGet, fmtURL(h, p), nil)
		if resp.StatusCode != http.StatusOK || strings.Contains(string(body), secret) || strings.Contains(string(body), basicAuth(testUser, secret)) {
			t.Errorf("GET %s: %d, or the password is in it:\n%s", p, resp.StatusCode, body)
		}
	}
	if logs := h.logs.String(); strings.Contains(logs, secret) || strings.Contains(logs, basicAuth(testUser, secret)) {
		t.Errorf("the password is in the log:\n%s", logs)
	}
}

// deniedManifest GETs repo:tag through the mirror and wants 403 DENIED.
func deniedManifest(t *testing.T, h *harness, path string, hdr http.Header) {
	t.Helper()
	all := manifestAccept.Clone()
	for k, v := range hdr {
		all[k] = v
	}
	resp, body := get(t, http.MethodGet, fmtURL(h, path), all)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), `"DENIED"`) {
		t.Fatalf("GET %s: %d %s, want 403 DENIED", path, resp.StatusCode, body)
	}
}

// TestUpstreamAuthHtpasswd (issue 13): distribution's registry with htpasswd auth refuses
// anonymous pulls; nodecache pulls from it with the credentials of a docker config.json — an
// "auth" entry keyed by host:port, a username/password entry keyed by a URL (docker normalises
// keys by host name) — and without credentials answers 403 DENIED, so containerd falls back
// to the next host. A client's own Authorization header is never forwarded; the password is in
// no log line.
func TestUpstreamAuthHtpasswd(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// entry returns the config.json auths for an upstream reached as host (nil: no
		// --upstream-auth).
		auths func(host string) map[string]map[string]string
	}{
		{name: "auth entry keyed by host", auths: func(host string) map[string]map[string]string {
			return map[string]map[string]string{host: {"auth": basicAuth(testUser, testPassword)}}
		}},
		{name: "username and password keyed by URL", auths: func(host string) map[string]map[string]string {
			return map[string]map[string]string{
				"https://" + host + "/v1/": {"username": testUser, "password": testPassword},
				"other.example":            {"auth": basicAuth("someone", "else")},
			}
		}},
		{name: "no credentials: 403 DENIED"},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			private := mirrortest.NewPrivateRegistry(t, testUser, testPassword)
			private.PushImage(t, "team/private", "v1", mirrortest.Image(t, 8192, 2, "linux/amd64"))
			// Anonymous access is refused by the upstream itself.
			if _, err := remote.Head(private.Ref(t, "team/private", "v1")); err == nil {
				t.Fatal("the private registry served an anonymous HEAD")
			}
			// NAME (what image references and config.json keys say) is private.test; its API is
			// reached at upstream.test:<port>.
			upName := "private.test"
			up := parseUpstream(t, upName+"=http://upstream.test:"+strings.Split(private.Addr, ":")[1])
			opts := mirror.Options{Upstreams: []regname.Upstream{up}}
			if tc.auths != nil {
				file := filepath.Join(t.TempDir(), "config.json")
				writeDockerConfig(t, file, tc.auths(upName))
				opts.UpstreamCredentials = map[string]*upstreamauth.Credentials{upName: loadCredentials(t, file, upName)}
			}
			h := newHarness(t, opts)
			private.ResetRequests()
			// A client sending its own (valid) credentials: never forwarded upstream.
			clientAuth := http.Header{"Authorization": {"Basic " + basicAuth(testUser, testPassword)}}
			if tc.auths == nil {
				deniedManifest(t, h, "/v2/team/private/manifests/v1?ns="+upName, clientAuth)
				deniedManifest(t, h, "/v2/"+upName+"/team/private/manifests/v1", nil)
			} else {
				img, err := remote.Image(ref(t, h.host+"/"+upName+"/team/private:v1"),
					remote.WithAuth(authn.FromConfig(authn.AuthConfig{Username: "client", Password: "client-secret"})))
				if err != nil {
					t.Fatalf("pull through nodecache: %v", err)
				}
				if _, err := img.RawConfigFile(); err != nil {
					t.Fatalf("config through nodecache: %v", err)
				}
				ls, _ := img.Layers()
				for _, l := range ls {
					rc, err := l.Compressed()
					if err != nil {
						t.Fatalf("layer through nodecache: %v", err)
					}
					_ = rc.Close()
				}
				resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/team/private/manifests/v1?ns="+upName), manifestAccept)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("manifest with ?ns=: %d", resp.StatusCode)
				}
			}
			var authed int
			for _, r := range private.Requests() {
				if strings.Contains(r.Authorization, basicAuth("client", "client-secret")) {
					t.Errorf("a client's Authorization reached the upstream: %s %s", r.Method, r.Path)
				}
				if tc.auths == nil && r.Authorization != "" {
					t.Errorf("nodecache without credentials sent Authorization upstream: %s %s", r.Method, r.Path)
				}
				if r.Authorization == "Basic "+basicAuth(testUser, testPassword) {
					authed++
				}
			}
			if tc.auths != nil && authed == 0 {
				t.Errorf("no upstream request carried the configured credentials: %+v", private.Requests())
			}
			checkNoSecret(t, h, testPassword)
		})
	}
}

// TestUpstreamAuthDockerHubKey (issue 13): a Docker Hub-style upstream (registry.hub.test with
// its token realm auth.hub.test, blobs redirected to cdn.test) configured as docker.io, with
// the credentials `docker login` stores under https://index.docker.io/v1/: the token is fetched
// with them, they never reach the CDN, and without them the realm refuses and the client gets
// 403 DENIED.
func TestUpstreamAuthDockerHubKey(t *testing.T) {
	t.Parallel()
	for _, withCreds := range []bool{true, false} {
		t.Run(map[bool]string{true: "credentials", false: "anonymous_denied"}[withCreds], func(t *testing.T) {
			t.Parallel()
			hub := newHubLike(t)
			pushTo := hub.pusher()
			pushTo.PushIndex(t, "team/private", "v1", mirrortest.MultiPlatformIndex(t, 4096, 1))
			hub.mu.Lock()
			hub.user, hub.password = testUser, testPassword
			hub.mu.Unlock()

			up := hub.upstream(t)
			opts := mirror.Options{Upstreams: []regname.Upstream{up}}
			if withCreds {
				file := filepath.Join(t.TempDir(), "config.json")
				writeDockerConfig(t, file, map[string]map[string]string{
					"https://index.docker.io/v1/": {"auth": basicAuth(testUser, testPassword)},
				})
				opts.UpstreamCredentials = map[string]*upstreamauth.Credentials{"docker.io": loadCredentials(t, file, "docker.io")}
			}
			h := newHarness(t, opts)
			if !withCreds {
				deniedManifest(t, h, "/v2/team/private/manifests/v1?ns=docker.io", nil)
				return
			}
			pullIndexGGCR(t, ref(t, h.host+"/team/private:v1"))
			hub.mu.Lock()
			defer hub.mu.Unlock()
			basic := 0
			for _, a := range hub.tokenAuths {
				if a == "Basic "+basicAuth(testUser, testPassword) {
					basic++
				}
			}
			if basic == 0 {
				t.Errorf("the token realm never got the credentials: %q", hub.tokenAuths)
			}
			for _, l := range hub.leaks {
				if strings.HasPrefix(l, "cdn:") {
					t.Errorf("credentials reached the CDN: %s", l)
				}
			}
			checkNoSecret(t, h, testPassword)
		})
	}
}

// TestUpstreamAuthRealmOnAnotherDomain (issue 13): credentials go only to the upstream and a
// token realm on its registrable domain; a realm elsewhere gets nothing (not even a request).
func TestUpstreamAuthRealmOnAnotherDomain(t *testing.T) {
	t.Parallel()
	hub := newHubLike(t)
	pushTo := hub.pusher()
	pushTo.PushImage(t, "team/private", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
	hub.mu.Lock()
	hub.user, hub.password, hub.realmHost = testUser, testPassword, "auth.elsewhere.test"
	hub.mu.Unlock()
	up := hub.upstream(t)
	file := filepath.Join(t.TempDir(), "config.json")
	writeDockerConfig(t, file, map[string]map[string]string{
		"https://index.docker.io/v1/": {"username": testUser, "password": testPassword},
	})
	h := newHarness(t, mirror.Options{
		Upstreams:           []regname.Upstream{up},
		UpstreamCredentials: map[string]*upstreamauth.Credentials{"docker.io": loadCredentials(t, file, "docker.io")},
	})
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/team/private/manifests/v1?ns=docker.io"), manifestAccept)
	if resp.StatusCode < 400 {
		t.Fatalf("pull with a realm on another domain: %d, want an error", resp.StatusCode)
	}
	if !strings.Contains(string(body), "not on the registrable domain") {
		t.Errorf("error body %s does not say why", body)
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.tokens != 0 {
		t.Errorf("the foreign realm got %d requests (%q)", hub.tokens, hub.tokenAuths)
	}
	checkNoSecret(t, h, testPassword)
}

// TestUpstreamAuthSymlinkSwap (issue 13): the credentials file is a Kubernetes Secret volume —
// config.json -> ..data/config.json, ..data -> a timestamped directory, swapped atomically on an
// update. A swap from a wrong to the right password takes effect at the next pull, without a
// restart.
func TestUpstreamAuthSymlinkSwap(t *testing.T) {
	t.Parallel()
	private := mirrortest.NewPrivateRegistry(t, testUser, testPassword)
	private.PushImage(t, "team/private", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
	upName := "upstream.test:" + strings.Split(private.Addr, ":")[1]
	up := parseUpstream(t, upName+"=http://"+upName)
	vol := t.TempDir()
	writeVersion := func(dir, password string) {
		writeDockerConfig(t, filepath.Join(vol, dir, "config.json"),
			map[string]map[string]string{upName: {"auth": basicAuth(testUser, password)}})
	}
	// Kubernetes' atomic writer: a new ..data symlink renamed over the old one.
	swapTo := func(dir string) {
		tmp := filepath.Join(vol, "..data_tmp")
		if err := os.Symlink(dir, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(vol, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	writeVersion("..2026_01_01_v1", "an-old-password")
	swapTo("..2026_01_01_v1")
	if err := os.Symlink("..data/config.json", filepath.Join(vol, "config.json")); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, mirror.Options{
		Upstreams:           []regname.Upstream{up},
		UpstreamCredentials: map[string]*upstreamauth.Credentials{upName: loadCredentials(t, filepath.Join(vol, "config.json"), upName)},
	})
	path := "/v2/team/private/manifests/v1?ns=" + upName
	deniedManifest(t, h, path, nil)

	writeVersion("..2026_01_02_v2", testPassword)
	swapTo("..2026_01_02_v2")
	resp, body := get(t, http.MethodGet, fmtURL(h, path), manifestAccept)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the swap: %d %s, want 200", resp.StatusCode, body)
	}
	checkNoSecret(t, h, testPassword)
	checkNoSecret(t, h, "an-old-password")
}
