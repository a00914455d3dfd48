package warm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/machine"

	"github.com/nodecache/nodecache/pkg/bootstrap/talos"
)

// FuzzImagesFrom: a --images-from list, read from a file and from standard input ("-"), is
// refused (one refusal naming the list's lines) or read into references, never a panic; both
// ways give the same result, reading leaves the file as it was, and every line that names an
// image is listed, as its NAME:LINE, under exactly one reference.
func FuzzImagesFrom(f *testing.F) {
	f.Add([]byte("# images for the edge nodes\n\n  nginx:1.27  \n\tghcr.io/siderolabs/kubelet:v1.35.0\r\n# done\n"))
	f.Add([]byte("nginx\n# fine\nnginx latest\nalpine;id\nbusybox\n"))
	f.Add([]byte("docker.io/library/nginx:latest\nnginx\nregistry.k8s.io/pause:3.10.1@sha256:" + strings.Repeat("0", 64) + "\n"))
	f.Add([]byte("# nothing yet\n\n"))
	f.Add([]byte(strings.Repeat("a", maxListLine+1) + "\n"))
	f.Add([]byte("localhost:5000/a/b\x00\n\xff\n-x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "images.txt")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		before, _ := os.Stat(p)
		c := baseConfig()
		c.ImagesFrom = p
		opts, err := c.Options(nil)
		if after, _ := os.Stat(p); !after.ModTime().Equal(before.ModTime()) {
			t.Fatal("reading the list touched it")
		}
		if got, _ := os.ReadFile(p); !bytes.Equal(got, data) {
			t.Fatal("reading the list changed it")
		}
		s := baseConfig()
		s.ImagesFrom, s.Stdin = "-", bytes.NewReader(data)
		fromStdin, serr := s.Options(nil)
		if (err == nil) != (serr == nil) {
			t.Fatalf("file: %v; stdin: %v", err, serr)
		}
		if err != nil {
			if !errors.Is(err, ErrRefused) || strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("%v: want a refusal with a message", err)
			}
			if !sameRefusal(err.Error(), serr.Error(), p) {
				t.Fatalf("file and stdin refused differently:\n%s\n%s", err, serr)
			}
			return
		}
		if len(opts.Sources) != len(fromStdin.Sources) {
			t.Fatalf("file gives %d references, stdin %d", len(opts.Sources), len(fromStdin.Sources))
		}
		named := 0
		for i, src := range opts.Sources {
			if src.Reference != fromStdin.Sources[i].Reference {
				t.Fatalf("reference %d: file %s, stdin %s", i, src.Reference, fromStdin.Sources[i].Reference)
			}
			if _, err := ParseReference(src.Reference); err != nil {
				t.Fatalf("listed %q, which does not parse: %v", src.Reference, err)
			}
			for _, from := range src.From {
				line, ok := strings.CutPrefix(from, p+":")
				if n, err := strconv.Atoi(line); !ok || err != nil || n < 1 {
					t.Fatalf("source %q of %s is not %s:LINE", from, src.Reference, p)
				}
				named++
			}
		}
		if want := imageLines(data); named != want {
			t.Fatalf("%d lines name an image, %d sources listed", want, named)
		}
	})
}

// sameRefusal reports whether a refusal of the list read from file p and one of the same list
// read from stdin say the same, the list's name aside.
func sameRefusal(file, stdin, p string) bool {
	return strings.ReplaceAll(file, p, "-") == stdin
}

// imageLines counts the lines of an image list that are neither blank nor comments.
func imageLines(data []byte) int {
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.Trim(l, " \t\r")
		if l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	return n
}

// FuzzWarmMachineConfig: `warm --machine-config FILE --print` over any file is refused or lists
// the node's images, never a panic, and leaves the file as it was. A file the machine-config
// parser refuses is refused; one it lists starts with the kubelet, names where each image came
// from, and says whose defaults filled in what the config leaves unset.
func FuzzWarmMachineConfig(f *testing.F) {
	f.Add([]byte(genMachineConfig(f, machine.TypeWorker, "v1.11.5", "1.34.1", "ghcr.io/siderolabs/installer:v1.11.5", "config")))
	f.Add([]byte(genMachineConfig(f, machine.TypeControlPlane, "v1.13.0", "1.35.2", "ghcr.io/siderolabs/installer:v1.13.0", "resource",
		"cluster:\n  proxy:\n    disabled: true\n  coreDNS:\n    disabled: true\n")))
	f.Add([]byte("version: v1alpha1\nmachine:\n  type: worker\n  install:\n    image: ghcr.io/siderolabs/installer:v9.9.9\ncluster:\n  controlPlane:\n    endpoint: https://10.5.0.2:6443\n"))
	f.Add([]byte("version: v1alpha1\nmachine:\n  type: controlplane\n  kubelet:\n    image: kubelet\ncluster:\n  apiServer:\n    image: ''\n  network:\n    cni:\n      name: none\n"))
	f.Add([]byte("apiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: docker.io\nendpoints:\n  - url: http://10.0.0.5:5000\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "node.yaml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c := baseConfig()
		c.MachineConfig, c.Print = p, true
		opts, err := c.Options(nil)
		if got, _ := os.ReadFile(p); !bytes.Equal(got, data) {
			t.Fatal("reading the machine config changed it")
		}
		_, perr := talos.ParseMachineConfig(p, data)
		if err != nil {
			if !errors.Is(err, ErrRefused) || strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("%v: want a refusal with a message", err)
			}
			return
		}
		if perr != nil {
			t.Fatalf("the parser refuses it (%v), warm lists %d images", perr, len(opts.Sources))
		}
		if len(opts.Sources) == 0 || !slices.ContainsFunc(opts.Sources[0].From, func(s string) bool { return strings.Contains(s, "(kubelet)") }) {
			t.Fatalf("first image %+v, want the kubelet", opts.Sources)
		}
		for _, src := range opts.Sources {
			for _, from := range src.From {
				if !strings.HasPrefix(from, "--machine-config "+p) {
					t.Fatalf("%s from %q, want --machine-config %s", src.Reference, from, p)
				}
			}
		}
		if len(opts.Notes) == 0 || !strings.Contains(opts.Notes[0], "defaults of Talos") {
			t.Fatalf("notes %q: want whose defaults were used", opts.Notes)
		}
	})
}
