package bundle_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/refusal"
)

const refName = "org.opencontainers.image.ref.name"

// writeLayout writes an OCI image layout with go-containerregistry's layout package: each image
// or index with the ref.name annotation given ("" for none).
func writeLayout(t *testing.T, entries ...any) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(entries); i += 2 {
		var opts []layout.Option
		if n := entries[i+1].(string); n != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{refName: n}))
		}
		switch e := entries[i].(type) {
		case v1.Image:
			err = p.AppendImage(e, opts...)
		case v1.ImageIndex:
			err = p.AppendIndex(e, opts...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func digestOf(t *testing.T, x interface{ Digest() (v1.Hash, error) }) digest.Digest {
	t.Helper()
	h, err := x.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest.Digest(h.String())
}

func names(r *bundle.Reader) []string {
	var out []string
	for _, n := range r.Images {
		out = append(out, n.String())
	}
	return out
}

// TestOpenOCILayout: a layout whose index.json names each image by its full reference (as warm
// --to and crane pull --annotate-ref write it) opens without --ref: an index with every
// platform (attestations included), an image of Docker Hub under index.docker.io (crane's name
// for it, the library/ prefix added for a single-component name); every blob reads back whole.
func TestOpenOCILayout(t *testing.T) {
	t.Parallel()
	idx := mirrortest.MultiPlatformIndex(t, 1024, 2)
	img := mirrortest.Image(t, 2048, 1, "linux/amd64")
	dir := writeLayout(t, idx, "upstream.test:5000/team/app:v1", img, "index.docker.io/alpine:3.20")
	r, err := bundle.Open(t.Context(), dir, bundle.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"upstream.test:5000/team/app:v1@" + digestOf(t, idx).String(),
		"docker.io/library/alpine:3.20@" + digestOf(t, img).String(),
	}
	if r.Kind != bundle.KindOCILayout || !slices.Equal(names(r), want) {
		t.Fatalf("Open = %s %q, want oci-layout %q", r.Kind, names(r), want)
	}
	// The index, 2 images, 2 attestations and the single image; 2×(config+2 layers),
	// 2×(config+1 layer), config+1 layer.
	if len(r.Manifests) != 6 || len(r.Blobs) != 12 || len(r.Absent) != 0 {
		t.Fatalf("Open: %d manifests, %d blobs, %d absent; want 6, 12, 0", len(r.Manifests), len(r.Blobs), len(r.Absent))
	}
	if r.Manifests[len(r.Manifests)-1].Digest != digestOf(t, img) {
		t.Errorf("manifests are not children first: last is %s", r.Manifests[len(r.Manifests)-1].Digest)
	}
	var n int
	err = r.Each(t.Context(), nil, func(b bundle.Blob, data io.Reader) error {
		got, err := io.ReadAll(data)
		if err == nil && int64(len(got)) != b.Size {
			t.Errorf("blob %s: read %d bytes, want %d", b.Digest, len(got), b.Size)
		}
		n++
		return err
	})
	if err != nil || n != 12 {
		t.Fatalf("Each: %d blobs, %v", n, err)
	}
}

// TestOpenOCINames: skopeo's layout (a tag alone in ref.name) and crane's (no ref.name) take
// --ref and are refused without it, naming --ref; --ref is refused where nothing needs it or
// with a digest, and a name that is neither a full reference nor a tag is refused saying which
// forms are.
func TestOpenOCINames(t *testing.T) {
	t.Parallel()
	img := mirrortest.Image(t, 1024, 1, "linux/amd64")
	img2 := mirrortest.Image(t, 1024, 1, "linux/amd64")
	d := digestOf(t, img).String()
	skopeo := writeLayout(t, img, "v1")
	crane := writeLayout(t, img, "")
	crane2 := writeLayout(t, img, "", img2, "")
	full := writeLayout(t, img, "upstream.test/team/app:v1")
	odd := writeLayout(t, img, "team/app:v1")
	for _, tc := range []struct {
		name, dir, ref string
		want           []string // images; nil: refused
		says           string
	}{
		{"skopeo with --ref", skopeo, "upstream.test/team/app", []string{"upstream.test/team/app:v1@" + d}, ""},
		{"skopeo, Docker Hub", skopeo, "docker.io/alpine", []string{"docker.io/library/alpine:v1@" + d}, ""},
		{"skopeo, --ref with its tag", skopeo, "upstream.test/team/app:v1", []string{"upstream.test/team/app:v1@" + d}, ""},
		{"skopeo without --ref", skopeo, "", nil, `is named by the tag "v1" alone (as skopeo copy … oci:DIR:TAG writes it): give its registry and repository with --ref REGISTRY/REPOSITORY`},
		{"skopeo, --ref with another tag", skopeo, "upstream.test/team/app:v2", nil, `is named by the tag "v1"; give --ref without a tag or with that one`},
		{"crane with --ref and tag", crane, "upstream.test:5000/team/app:v1", []string{"upstream.test:5000/team/app:v1@" + d}, ""},
		{"crane with --ref, no tag", crane, "upstream.test/team/app", []string{"upstream.test/team/app@" + d}, ""},
		{"crane without --ref", crane, "", nil, "has no org.opencontainers.image.ref.name (as crane pull --format oci writes it without --annotate-ref): name it with --ref REGISTRY/REPOSITORY[:TAG]"},
		{"two unnamed, one tag", crane2, "upstream.test/team/app:v1", nil, "2 images in " + crane2 + " have no name, and one tag cannot name them all"},
		{"full names, --ref", full, "upstream.test/team/app", nil, "is named by a full reference in index.json"},
		{"--ref without registry", skopeo, "team/app", nil, `--ref "team/app" refused: want REGISTRY/REPOSITORY[:TAG]`},
		{"--ref with digest", skopeo, "upstream.test/team/app@" + d, nil, "a digest: the layout's index.json gives each image's digest"},
		{"neither full nor tag", odd, "", nil, `is named "team/app:v1": want a full reference REGISTRY/REPOSITORY:TAG`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := bundle.Open(t.Context(), tc.dir, bundle.ReadOptions{Ref: tc.ref})
			if tc.want == nil {
				if err == nil || !errors.Is(err, refusal.ErrRefused) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("Open(--ref %q) = %v, want a refusal saying %q", tc.ref, err, tc.says)
				}
				if needs := strings.HasSuffix(tc.name, "without --ref"); errors.Is(err, bundle.ErrNeedsRef) != needs {
					t.Errorf("Open(--ref %q): errors.Is(ErrNeedsRef) = %v, want %v", tc.ref, !needs, needs)
				}
				return
			}
			if err != nil || !slices.Equal(names(r), tc.want) {
				t.Fatalf("Open(--ref %q) = %v, %v; want %q", tc.ref, r, err, tc.want)
			}
		})
	}
}

// talosImages are the fixtures' images (testdata/talos/README.md).
var talosImages = []string{
	"docker.io/library/busybox:1.36@sha256:ce71abdeebf478604dcd3bfc37d2dcc9408bccfb240bd01c05a22d6b1b9d92cb",
	"upstream.test:5000/team/app:v1@sha256:c181f9599c32a5f37fb675ddc7fa732d1f5d3962bc1e0940e64b091746115b93",
	"upstream.test:5000/team/tool@sha256:f2ec797664ce11219716623977cb1f3bda91c333f51803b52e1f9bc534048a36",
}

// TestOpenTalos: both Talos image cache fixtures, written by hand from talosctl's rules, open as
// the same three images, detected not flagged: the registry directory's _5000_ read as :5000, an
// image cached by digest alone found as the manifest no other lists, the left-out arm64
// platform absent (not missing), the amd64 manifest's media type sniffed; every blob reads back
// and matches.
func TestOpenTalos(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dir  string
		kind bundle.Kind
	}{{"testdata/talos/flat", bundle.KindTalosFlat}, {"testdata/talos/oci", bundle.KindTalosOCI}} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			r, err := bundle.Open(t.Context(), tc.dir, bundle.ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Kind != tc.kind || !slices.Equal(names(r), talosImages) {
				t.Fatalf("Open = %s %q, want %s %q", r.Kind, names(r), tc.kind, talosImages)
			}
			if len(r.Manifests) != 4 || len(r.Blobs) != 4 || len(r.Absent) != 1 || r.Absent[0] != "sha256:86b7828b95ff65914bc243b1fa822dbd7eba968c55cb3510782f7f58f91b865d" {
				t.Fatalf("Open: %d manifests, %d blobs, absent %v; want 4, 4 and the arm64 manifest", len(r.Manifests), len(r.Blobs), r.Absent)
			}
			for _, m := range r.Manifests {
				if m.Digest == "sha256:b5dc9737980544583ff1bd03ed1b1c1bda8e090d5d7b31835fc31d4a73968343" && m.MediaType != "application/vnd.oci.image.manifest.v1+json" {
					t.Errorf("amd64 manifest sniffed as %q", m.MediaType)
				}
			}
			if err := r.Check(t.Context(), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := bundle.Open(t.Context(), tc.dir, bundle.ReadOptions{Ref: "docker.io/library/x"}); err == nil || !strings.Contains(err.Error(), "names its images itself") || !strings.Contains(err.Error(), "drop --ref") {
				t.Errorf("Open with --ref = %v, want a refusal", err)
			}
		})
	}
}

// copyTree copies the directory src to a new temporary directory.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if de.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// flip flips the last byte of file p.
func flip(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDamaged: a blob with a byte flipped is found by Check (and Each), named with its path; a
// missing blob is refused by Open, named with the image that needs it; both are ErrDamaged, in
// every layout. A flipped byte in the Talos OCI form's layer is found by Open.
func TestDamaged(t *testing.T) {
	t.Parallel()
	const appLayer = "sha256:ffa38f83ff1fc33819c723cd940fbbf74f05929360da22b9ddd948114ceb43c8" // layer 2 of the amd64 manifest of team/app:v1
	img := mirrortest.Image(t, 4096, 2, "linux/amd64")
	layers, _ := img.Layers()
	ld := digestOf(t, layers[1])
	oci := writeLayout(t, img, "upstream.test/team/app:v1")
	for _, tc := range []struct {
		name, dir, file string
		d               digest.Digest
	}{
		{"oci-layout", oci, filepath.Join("blobs", "sha256", ld.Encoded()), ld},
		{"talos-flat", "testdata/talos/flat", filepath.Join("blob", "sha256-"+digest.Digest(appLayer).Encoded()), appLayer},
	} {
		t.Run(tc.name+" flipped", func(t *testing.T) {
			t.Parallel()
			dir := copyTree(t, tc.dir)
			flip(t, filepath.Join(dir, tc.file))
			r, err := bundle.Open(t.Context(), dir, bundle.ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			err = r.Check(t.Context(), nil)
			if !errors.Is(err, bundle.ErrDamaged) || !strings.Contains(err.Error(), "blob "+tc.d.String()+" does not match its digest") || !strings.Contains(err.Error(), tc.file) {
				t.Fatalf("Check = %v, want blob %s named damaged at %s", err, tc.d, tc.file)
			}
		})
		t.Run(tc.name+" missing", func(t *testing.T) {
			t.Parallel()
			dir := copyTree(t, tc.dir)
			if err := os.Remove(filepath.Join(dir, tc.file)); err != nil {
				t.Fatal(err)
			}
			_, err := bundle.Open(t.Context(), dir, bundle.ReadOptions{})
			if !errors.Is(err, bundle.ErrDamaged) || !strings.Contains(err.Error(), "blob "+tc.d.String()+" (layer 2 of manifest") || !strings.Contains(err.Error(), "is missing (want "+tc.file+")") {
				t.Fatalf("Open = %v, want blob %s named missing", err, tc.d)
			}
		})
	}
	t.Run("talos-oci layer flipped", func(t *testing.T) {
		t.Parallel()
		dir := copyTree(t, "testdata/talos/oci")
		const layer = "2143bff71f703583f0b756f7c70d73adc1fdeca066886e34125e9e87a42809e5"
		flip(t, filepath.Join(dir, "blobs", "sha256", layer))
		_, err := bundle.Open(t.Context(), dir, bundle.ReadOptions{})
		if !errors.Is(err, bundle.ErrDamaged) || !strings.Contains(err.Error(), "sha256:"+layer) {
			t.Fatalf("Open = %v, want the damaged layer named", err)
		}
	})
}

// TestNotABundle: a directory that is neither layout, and a file, are refused saying what is
// accepted.
func TestNotABundle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, file, filepath.Join(dir, "none")} {
		_, err := bundle.Open(t.Context(), p, bundle.ReadOptions{})
		if !errors.Is(err, refusal.ErrRefused) || !strings.Contains(err.Error(), p) {
			t.Errorf("Open(%s) = %v, want a refusal naming it", p, err)
		}
	}
	if _, err := bundle.Open(t.Context(), dir, bundle.ReadOptions{}); !strings.Contains(err.Error(), "want an OCI image layout") {
		t.Errorf("Open(empty dir) = %v, want the accepted layouts", err)
	}
}

// TestOpenFIFO: a named pipe in place of a file of an OCI image layout (index.json, oci-layout,
// an image's manifest) is refused naming it, at once: opening a FIFO for reading waits for a
// writer, and before this fix Open (cache import, serve --seed) blocked there for good, deaf to
// Ctrl-C and SIGTERM. Each case gives Open 5 seconds; on a timeout it opens the pipe for
// writing to let Open go.
func TestOpenFIFO(t *testing.T) {
	t.Parallel()
	img := mirrortest.Image(t, 512, 1, "linux/amd64")
	md, _ := img.Digest()
	for _, file := range []string{"index.json", "oci-layout", "blobs/sha256/" + md.Hex} {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			dir := writeLayout(t, img, "docker.io/library/app:v1")
			p := filepath.Join(dir, file)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := bundle.Open(t.Context(), dir, bundle.ReadOptions{})
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, refusal.ErrRefused) || !strings.Contains(err.Error(), "named pipe") || !strings.Contains(err.Error(), p) {
					t.Errorf("Open with %s a named pipe = %v, want a refusal naming %s as a named pipe", file, err, p)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("Open with %s a named pipe still blocked after 5s: want a refusal at once", file)
				if w, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					w.Close()
				}
				<-done
			}
		})
	}
}
