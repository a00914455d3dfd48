package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/warm"
)

// TestWarmPrint: --print lists what would be warmed and contacts nothing (the mirror, when
// named, sees no request); text is one reference per line, JSON carries the sources; a bad list
// line on stdin is refused as -:LINE with exit 2.
func TestWarmPrint(t *testing.T) {
	t.Parallel()
	mirror := newSilentMirror(t, "--print")
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

// TestWarmPrintMachineConfigRelease (newuser2 #3): a hand-written node config naming no kubelet,
// CoreDNS or control-plane image gets the defaults of its installer's Talos release (or of
// --talos-version), not this build's (Talos v1.13.8: kubelet v1.36.2, CoreDNS v1.14.6).
func TestWarmPrintMachineConfigRelease(t *testing.T) {
	t.Parallel()
	const (
		installer1115 = "ghcr.io/siderolabs/installer:v1.11.5"
		factory       = "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:custom"
	)
	node := func(typ, installer string) string {
		return "version: v1alpha1\nmachine:\n  type: " + typ + "\n  install:\n    disk: /dev/sda\n    image: " + installer +
			"\ncluster:\n  controlPlane:\n    endpoint: https://10.5.0.2:6443\n"
	}
	for _, tc := range []struct {
		name, config string
		args         []string
		want         []string
		note         string
	}{
		{"worker of v1.11.5", node("worker", installer1115), nil,
			[]string{"ghcr.io/siderolabs/kubelet:v1.34.1", "registry.k8s.io/kube-proxy:v1.34.1", "registry.k8s.io/coredns/coredns:v1.12.4",
				installer1115, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"},
			"note: defaults of Talos v1.11.5, from the tag of machine.install.image\n"},
		{"control plane of v1.11.5", node("controlplane", installer1115), nil,
			[]string{"ghcr.io/siderolabs/kubelet:v1.34.1", "registry.k8s.io/kube-apiserver:v1.34.1", "registry.k8s.io/kube-controller-manager:v1.34.1",
				"registry.k8s.io/kube-scheduler:v1.34.1", "gcr.io/etcd-development/etcd:v3.6.5", "registry.k8s.io/kube-proxy:v1.34.1",
				"registry.k8s.io/coredns/coredns:v1.12.4", installer1115, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.27.4"},
			"note: defaults of Talos v1.11.5, from the tag of machine.install.image\n"},
		{"worker with --talos-version v1.10.6", node("worker", factory), []string{"--talos-version", "v1.10.6"},
			[]string{"ghcr.io/siderolabs/kubelet:v1.33.3", "registry.k8s.io/kube-proxy:v1.33.3", "registry.k8s.io/coredns/coredns:v1.12.1",
				factory, "registry.k8s.io/pause:3.10", "ghcr.io/siderolabs/flannel:v0.26.7"},
			"note: defaults of Talos v1.10.6, from --talos-version\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, t.TempDir(), "node.yaml", tc.config)
			code, stdout, stderr := runAppStdin(t, "", append([]string{"warm", "--print", "--machine-config", path}, tc.args...)...)
			want := strings.Join(tc.want, "\n") + "\n"
			if code != 0 || stdout != want || stderr != tc.note {
				t.Fatalf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr: %q, want %q", code, stdout, want, stderr, tc.note)
			}
		})
	}
}

// TestWarmEmptyList (newuser2 #19): an image list with no image and nothing else named is
// nothing to warm: exit 2 with the same words with and without --print, and nothing is sent.
func TestWarmEmptyList(t *testing.T) {
	t.Parallel()
	mirror := newSilentMirror(t, "an empty list")
	const want = "nothing to warm: --images-from - lists no image (it is empty, or only blank lines and # comments)"
	for _, tc := range []struct {
		name, list string
		args       []string
	}{
		{"empty", "", nil},
		{"empty, --print", "", []string{"--print"}},
		{"comments only", "# none yet\n\n", nil},
		{"comments only, --print", "# none yet\n\n", []string{"--print"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"warm", "--mirror", mirror.URL.String(), "--images-from", "-", "--wait", "0"}, tc.args...)
			code, stdout, stderr := runAppStdin(t, tc.list, args...)
			if code != exitUsage || stdout != "" || !strings.Contains(stderr, want) || strings.Contains(stderr, `IMAGE ""`) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 2 saying %q", code, stdout, stderr, want)
			}
		})
	}
}
