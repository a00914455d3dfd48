package mirror

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/name"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	var ups []name.Upstream
	for _, s := range []string{"docker.io=https://registry-1.docker.io", "ghcr.io=https://ghcr.io", "registry.local:5000=http://10.0.0.9:5000"} {
		u, err := name.ParseUpstream(s)
		if err != nil {
			t.Fatal(err)
		}
		ups = append(ups, u)
	}
	m := &Mirror{upstreams: map[string]*configured{}}
	for _, u := range ups {
		m.upstreams[u.Name] = &configured{Upstream: u, storageKey: storageKey(u.Name)}
	}
	m.defaultUpstream = m.upstreams[name.DockerHub]

	for _, tc := range []struct {
		name, target           string
		upstream, repo, kind   string
		ref                    string
		wantErr, wantErrStatus int
	}{
		{"ns", "/v2/siderolabs/kubelet/manifests/v1.35.0?ns=ghcr.io", "ghcr.io", "siderolabs/kubelet", kindManifest, "v1.35.0", 0, 0},
		{"ns upper case", "/v2/siderolabs/kubelet/manifests/v1?ns=GHCR.IO", "ghcr.io", "siderolabs/kubelet", kindManifest, "v1", 0, 0},
		{"ns and prefix", "/v2/ghcr.io/siderolabs/kubelet/blobs/sha256:ab?ns=ghcr.io", "ghcr.io", "siderolabs/kubelet", kindBlob, "sha256:ab", 0, 0},
		{"prefix", "/v2/ghcr.io/siderolabs/kubelet/tags/list", "ghcr.io", "siderolabs/kubelet", kindTags, "", 0, 0},
		{"prefix with port", "/v2/registry.local:5000/team/app/manifests/v1", "registry.local:5000", "team/app", kindManifest, "v1", 0, 0},
		{"default docker.io library", "/v2/alpine/manifests/3.20", "docker.io", "library/alpine", kindManifest, "3.20", 0, 0},
		{"ns docker.io library", "/v2/alpine/manifests/3.20?ns=docker.io", "docker.io", "library/alpine", kindManifest, "3.20", 0, 0},
		{"prefix docker.io library", "/v2/docker.io/alpine/manifests/3.20", "docker.io", "library/alpine", kindManifest, "3.20", 0, 0},
		{"repository named like a kind", "/v2/ghcr.io/a/manifests/b/manifests/v1", "ghcr.io", "a/manifests/b", kindManifest, "v1", 0, 0},
		{"ns selects, path component is a repo", "/v2/ghcr.io/x/manifests/v1?ns=docker.io", "docker.io", "ghcr.io/x", kindManifest, "v1", 0, 0},
		{"unknown ns", "/v2/a/manifests/v1?ns=evil.example", "", "", kindManifest, "v1", 1, 404},
		{"ns with path", "/v2/a/manifests/v1?ns=evil.example/x", "", "", kindManifest, "v1", 1, 404},
		{"upper-case repository (distribution's router: plain 404)", "/v2/ghcr.io/UPPER/manifests/v1", "", "", kindManifest, "v1", 1, 404},
		{"upper-case repository by ns", "/v2/library/ALPINE/manifests/3.20?ns=docker.io", "", "", kindManifest, "3.20", 1, 404},
		{"repository too long (NAME_INVALID)", "/v2/ghcr.io/x/" + strings.Repeat("a", 260) + "/manifests/v1", "", "", kindManifest, "v1", 1, 400},
		{"not an API path", "/v2/ghcr.io/x/other/v1", "", "", kindOther, "", 1, 404},
		{"base", "/v2/", "", "", kindBase, "", 0, 0},
		{"referrers", "/v2/ghcr.io/x/referrers/sha256:ab", "ghcr.io", "x", kindReferrers, "sha256:ab", 0, 0},
		{"referrers by ns", "/v2/x/referrers/sha256:ab?ns=ghcr.io", "ghcr.io", "x", kindReferrers, "sha256:ab", 0, 0},
		{"referrers not a digest", "/v2/ghcr.io/x/referrers/latest", "", "", kindReferrers, "", 1, 404},
		{"tag too long", "/v2/ghcr.io/x/manifests/" + strings.Repeat("a", 129), "", "", kindManifest, "", 1, 404},
		{"tag longest", "/v2/ghcr.io/x/manifests/" + strings.Repeat("a", 128), "ghcr.io", "x", kindManifest, strings.Repeat("a", 128), 0, 0},
		{"tag bad start", "/v2/ghcr.io/x/manifests/.v1", "", "", kindManifest, "", 1, 404},
		{"blob not a digest", "/v2/ghcr.io/x/blobs/latest", "", "", kindBlob, "", 1, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("GET", tc.target, nil)
			rt, err := m.resolve(r)
			if (err != nil) != (tc.wantErr == 1) {
				t.Fatalf("resolve %s: err %v", tc.target, err)
			}
			if err != nil {
				if err.Status != tc.wantErrStatus {
					t.Fatalf("status %d, want %d", err.Status, tc.wantErrStatus)
				}
				return
			}
			got := ""
			if rt.up != nil {
				got = rt.up.Name
			}
			if got != tc.upstream || rt.repo != tc.repo || rt.kind != tc.kind || rt.ref != tc.ref {
				t.Fatalf("resolve %s = %s %s %s %s, want %s %s %s %s", tc.target, got, rt.repo, rt.kind, rt.ref, tc.upstream, tc.repo, tc.kind, tc.ref)
			}
		})
	}
}

func TestStorageKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"ghcr.io":             "ghcr.io",
		"docker.io":           "docker.io",
		"registry.local:5000": "registry.local-5000",
		"127.0.0.1:5000":      "127.0.0.1-5000",
	} {
		if got := storageKey(in); got != want {
			t.Errorf("storageKey(%q) = %q, want %q", in, got, want)
		}
	}
	if got := storageKey("[::1]:5000"); !componentRe.MatchString(got) {
		t.Errorf("storageKey of an IPv6 name is not a valid component: %q", got)
	}
}

func FuzzAPIPath(f *testing.F) {
	for _, s := range []string{"/v2/", "/v2/a/b/manifests/c", "/v2/a/tags/list", "/v2//blobs/", "/v2/a/blobs/sha256:x?ns=q"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		name, kind, ref, rest, ok := apiPath(p)
		if ok && kind != kindBase && (len(name) == 0 || rest == "") {
			t.Fatalf("apiPath(%q) accepted without a name: %v %s %s %s", p, name, kind, ref, rest)
		}
	})
}
