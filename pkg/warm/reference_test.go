package warm_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/gendata"

	"github.com/nodecache/nodecache/pkg/refusal"
	"github.com/nodecache/nodecache/pkg/warm"
)

const dgst = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParseReferenceAccepted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, registry, repo, tag, digest, str string
	}{
		{"nginx", "docker.io", "library/nginx", "latest", "", "docker.io/library/nginx:latest"},
		{"nginx:1.27", "docker.io", "library/nginx", "1.27", "", "docker.io/library/nginx:1.27"},
		{"bitnami/redis:7", "docker.io", "bitnami/redis", "7", "", "docker.io/bitnami/redis:7"},
		{"ghcr.io/siderolabs/kubelet:v1.36.2", "ghcr.io", "siderolabs/kubelet", "v1.36.2", "", "ghcr.io/siderolabs/kubelet:v1.36.2"},
		{"localhost:5000/a/b@" + dgst, "localhost:5000", "a/b", "", dgst, "localhost:5000/a/b@" + dgst},
		{"registry.k8s.io/pause:3.10.1@" + dgst, "registry.k8s.io", "pause", "3.10.1", dgst, "registry.k8s.io/pause:3.10.1@" + dgst},
		{"Upstream.Test:5000/x_y/z-1.2:T_ag-1", "Upstream.Test:5000", "x_y/z-1.2", "T_ag-1", "", "Upstream.Test:5000/x_y/z-1.2:T_ag-1"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			r, err := warm.ParseReference(tc.in)
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if r.Registry != tc.registry || r.Repository != tc.repo || r.Tag != tc.tag || r.Digest.String() != tc.digest || r.String() != tc.str || r.Input != tc.in {
				t.Fatalf("got %+v (%s), want registry %s repo %s tag %s digest %s string %s", r, r, tc.registry, tc.repo, tc.tag, tc.digest, tc.str)
			}
		})
	}
}

// refusedReferences are inputs that must be refused before anything is sent (exit 2).
var refusedReferences = []struct{ name, in, says string }{
	{"newline after tag", "ghcr.io/siderolabs/kubelet:v1.35.6\nid", "control character"},
	{"newline alone", "\n", "control character"},
	{"carriage return", "nginx:1\r", "control character"},
	{"tab", "nginx\t:1", "control character"},
	{"NUL", "nginx\x00", "control character"},
	{"DEL", "nginx\x7f", "control character"},
	{"escape", "nginx\x1b[2J", "control character"},
	{"space", "nginx :1", "whitespace"},
	{"leading space", " nginx", "whitespace"},
	{"non-breaking space", "nginx\u00a0", "whitespace"},
	{"semicolon", "nginx;id", "shell metacharacter"},
	{"pipe", "nginx|sh", "shell metacharacter"},
	{"ampersand", "nginx&", "shell metacharacter"},
	{"dollar", "nginx:$TAG", "shell metacharacter"},
	{"command substitution", "nginx:$(id)", "shell metacharacter"},
	{"backtick", "nginx:`id`", "shell metacharacter"},
	{"redirect", "nginx>out", "shell metacharacter"},
	{"quote", "nginx'", "shell metacharacter"},
	{"glob", "nginx:*", "shell metacharacter"},
	{"backslash", `nginx\:1`, "shell metacharacter"},
	{"non-ASCII", "nginx:ü", "non-ASCII"},
	{"invalid UTF-8", "nginx:\xff", "invalid UTF-8"},
	{"empty", "", "empty"},
	{"too long", "a/" + strings.Repeat("b", 700), "bytes long"},
	{"upper-case repository", "docker.io/Library/nginx", "lowercase"},
	{"double colon", "nginx::1", "grammar"},
	{"empty tag", "nginx:", "grammar"},
	{"tag too long", "nginx:" + strings.Repeat("t", 129), "grammar"},
	{"leading dash tag", "nginx:-x", "grammar"},
	{"bad digest", "nginx@sha256:1234", "grammar"},
	{"unknown digest algorithm", "nginx@md5:0123456789abcdef0123456789abcdef", "grammar"},
	{"bare digest-like name", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "grammar"},
	{"trailing slash", "nginx/", "grammar"},
	{"double slash", "a//b", "grammar"},
	{"at without digest", "nginx@", "grammar"},
}

func TestParseReferenceRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range refusedReferences {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := warm.ParseReference(tc.in)
			if err == nil {
				t.Fatalf("accepted %q as %s", tc.in, r)
			}
			if !errors.Is(err, warm.ErrRefused) {
				t.Fatalf("error %v does not match ErrRefused", err)
			}
			var re *refusal.Error
			if !errors.As(err, &re) || re.Source != "image reference "+strconv.Quote(tc.in) {
				t.Fatalf("error %v does not name the value %q", err, tc.in)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

func FuzzParseReference(f *testing.F) {
	for _, tc := range refusedReferences {
		f.Add(tc.in)
	}
	f.Add("ghcr.io/siderolabs/kubelet:v1.36.2@" + dgst)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := warm.ParseReference(s)
		if err != nil {
			return
		}
		for _, c := range s {
			if c <= ' ' || c >= 0x7f || strings.ContainsRune(";|&$`<>()'\"\\*?[]{}!#~=%^,", c) {
				t.Fatalf("accepted %q with %q", s, c)
			}
		}
		again, err := warm.ParseReference(r.String())
		if err != nil || again.String() != r.String() {
			t.Fatalf("normalised %q -> %q does not parse to itself: %v %v", s, r, again, err)
		}
	})
}

func TestTalosJoinImages(t *testing.T) {
	t.Parallel()
	set, err := warm.TalosJoinImages("")
	if err != nil {
		t.Fatal(err)
	}
	k8s := "v" + strings.TrimPrefix(constants.DefaultKubernetesVersion, "v")
	if set.TalosVersion != strings.TrimSpace(gendata.VersionTag) || !strings.HasPrefix(set.TalosVersion, "v1.") {
		t.Errorf("talos version %q, want machinery's %q", set.TalosVersion, gendata.VersionTag)
	}
	if set.KubernetesVersion != k8s {
		t.Errorf("kubernetes version %q, want %q", set.KubernetesVersion, k8s)
	}
	want := []string{
		constants.KubeletImage + ":" + k8s,
		constants.KubeProxyImage + ":" + k8s,
		"registry.k8s.io/pause:",
		"ghcr.io/siderolabs/flannel:v" + strings.TrimPrefix(constants.FlannelVersion, "v"),
	}
	if len(set.Images) != len(want) {
		t.Fatalf("images %v, want 4", set.Images)
	}
	for i, img := range set.Images {
		if !strings.HasPrefix(img, want[i]) {
			t.Errorf("image %d = %q, want %q", i, img, want[i])
		}
		if _, err := warm.ParseReference(img); err != nil {
			t.Errorf("join image %q does not parse: %v", img, err)
		}
	}

	over, err := warm.TalosJoinImages("1.35.6")
	if err != nil {
		t.Fatal(err)
	}
	if over.KubernetesVersion != "v1.35.6" || over.Images[0] != constants.KubeletImage+":v1.35.6" || over.Images[1] != constants.KubeProxyImage+":v1.35.6" {
		t.Errorf("override 1.35.6 -> %+v", over)
	}
	for _, bad := range []string{"v1.35.6\nid", "v1.35", "latest", "v1.35.6;id", " v1.35.6", "v1.35.6 "} {
		if _, err := warm.TalosJoinImages(bad); !errors.Is(err, warm.ErrRefused) {
			t.Errorf("--kubernetes-version %q: %v, want refused", bad, err)
		}
	}
}
