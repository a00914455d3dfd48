package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/warm"
)

// runAppStdin is runApp with stdin.
func runAppStdin(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := newApp()
	app.Reader, app.Writer, app.ErrWriter = strings.NewReader(stdin), &out, &errOut
	err := app.RunContext(t.Context(), append([]string{"nodecache"}, args...))
	code := report(&errOut, err)
	return code, out.String(), errOut.String()
}

// TestWarmPrint: --print lists what would be warmed and contacts nothing (the mirror, when
// named, sees no request); text is one reference per line, JSON carries the sources; a bad list
// line on stdin is refused as -:LINE with exit 2.
func TestWarmPrint(t *testing.T) {
	t.Parallel()
	mirror := mirrortest.NewRegistry(t)
	t.Cleanup(func() {
		if reqs := mirror.Requests(); len(reqs) != 0 {
			t.Errorf("--print sent %d requests: %+v", len(reqs), reqs)
		}
	})
	set, err := warm.TalosJoinImages("")
	if err != nil {
		t.Fatal(err)
	}
	list := "# site images\n\nnginx:1.27\n  ghcr.io/example/app@sha256:" + strings.Repeat("a", 64) + "  \n"

	t.Run("text", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runAppStdin(t, list, "warm", "--print", "--talos", "--images-from", "-", "--mirror", mirror.URL.String(), "nginx:1.27", "alpine")
		want := strings.Join(append(set.Images, "docker.io/library/nginx:1.27", "ghcr.io/example/app@sha256:"+strings.Repeat("a", 64), "docker.io/library/alpine:latest"), "\n") + "\n"
		if code != 0 || stdout != want {
			t.Fatalf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr: %s", code, stdout, want, stderr)
		}
	})
	t.Run("json without mirror", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runAppStdin(t, list, "warm", "--print", "--output", "json", "--images-from", "-", "nginx:1.27")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var got warm.ImageList
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatalf("%v in %s", err, stdout)
		}
		if len(got.Images) != 2 || got.Images[0].Reference != "docker.io/library/nginx:1.27" ||
			strings.Join(got.Images[0].From, ",") != "-:3,argument 1" || strings.Join(got.Images[1].From, ",") != "-:4" {
			t.Fatalf("image list %+v", got)
		}
	})
	t.Run("bad line", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runAppStdin(t, "nginx\n\nnginx latest\n", "warm", "--print", "--images-from", "-")
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, `-:3: image reference "nginx latest" refused`) {
			t.Fatalf("exit %d, stdout %q, stderr %q; want 2 naming -:3", code, stdout, stderr)
		}
	})
}

// TestWarmPrintTalosVersions: --print --talos-version for the releases the table knows, with
// kubelet, kube-proxy, pause and flannel, then --installer-image; another patch of a known minor
// with a note naming the release used.
func TestWarmPrintTalosVersions(t *testing.T) {
	t.Parallel()
	installer := "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.12.4"
	for _, tc := range []struct {
		talos string
		want  []string
		note  string
	}{
		{"v1.10.6", []string{"ghcr.io/siderolabs/kubelet:v1.33.3", "registry.k8s.io/kube-proxy:v1.33.3", "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.26.7"}, ""},
		{"v1.11.5", []string{"ghcr.io/siderolabs/kubelet:v1.34.1", "registry.k8s.io/kube-proxy:v1.34.1", "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"}, ""},
		{"v1.12.4", []string{"ghcr.io/siderolabs/kubelet:v1.35.0", "registry.k8s.io/kube-proxy:v1.35.0", "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"}, ""},
		{"v1.12.9", []string{"ghcr.io/siderolabs/kubelet:v1.35.0", "registry.k8s.io/kube-proxy:v1.35.0", "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"}, "Talos v1.12.9 is not in this build's table; using the images of v1.12.4"},
		{"v1.13.8", []string{"ghcr.io/siderolabs/kubelet:v1.36.2", "registry.k8s.io/kube-proxy:v1.36.2", "registry.k8s.io/pause:3.10.1", "ghcr.io/siderolabs/flannel:v0.28.8"}, ""},
	} {
		t.Run(tc.talos, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runAppStdin(t, "", "warm", "--print", "--talos-version", tc.talos, "--installer-image", installer)
			want := strings.Join(append(tc.want, installer), "\n") + "\n"
			if code != 0 || stdout != want {
				t.Fatalf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr: %s", code, stdout, want, stderr)
			}
			if hasNote := strings.Contains(stderr, "note: "); hasNote != (tc.note != "") || !strings.Contains(stderr, tc.note) {
				t.Fatalf("stderr %q, want the note %q", stderr, tc.note)
			}
		})
	}
	t.Run("unknown release", func(t *testing.T) {
		t.Parallel()
		code, _, stderr := runAppStdin(t, "", "warm", "--print", "--talos-version", "v1.9.6")
		if code != exitUsage || !strings.Contains(stderr, "known: v1.10.6, v1.11.5, v1.12.4, v1.13.8") {
			t.Fatalf("exit %d, stderr %q; want 2 listing the known releases", code, stderr)
		}
	})
}
