package bundle_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// desc describes b as a blob of media type mt.
func desc(t *testing.T, b []byte, mt types.MediaType) v1.Descriptor {
	t.Helper()
	h, _, err := v1.SHA256(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return v1.Descriptor{MediaType: mt, Digest: h, Size: int64(len(b))}
}

// writeBlob writes b as a blob through w and commits it.
func writeBlob(t *testing.T, w *bundle.Writer, b []byte) v1.Descriptor {
	t.Helper()
	d := desc(t, b, types.OCILayer)
	f, err := w.Blob(d)
	if err != nil {
		t.Fatalf("Blob: %v", err)
	}
	if f == nil {
		return d
	}
	if _, err := f.Write(b); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := f.Commit(); err != nil {
		t.Fatalf("commit blob: %v", err)
	}
	return d
}

func create(t *testing.T, dir string, f bundle.Format) *bundle.Writer {
	t.Helper()
	w, err := bundle.Create(dir, f)
	if err != nil {
		t.Fatalf("Create(%s, %s): %v", dir, f, err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// TestCreateRefuses: a directory that is neither empty nor a bundle of the format, a file, a
// bundle of the other format, a damaged index.json and a directory another writer holds are
// refused (exit 2), each naming --to and what is wrong; nothing is written into them.
func TestCreateRefuses(t *testing.T) {
	t.Parallel()
	mk := func(t *testing.T, files map[string]string) string {
		dir := t.TempDir()
		for name, c := range files {
			p := filepath.Join(dir, name)
			if strings.HasSuffix(name, "/") {
				if err := os.MkdirAll(p, 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	layout := `{"imageLayoutVersion":"1.0.0"}`
	for _, tc := range []struct {
		name   string
		files  map[string]string
		format bundle.Format
		sub    string // a path under the directory given as --to
		want   string
	}{
		{"other files", map[string]string{"notes.txt": "x", "photos/": ""}, bundle.FormatOCI, "", "is not empty and is not an OCI image layout (no oci-layout file; it holds notes.txt, photos/)"},
		{"other files, talos", map[string]string{"notes.txt": "x"}, bundle.FormatTalosFlat, "", "is not empty and is not a Talos flat image cache"},
		{"a file", map[string]string{"f": "x"}, bundle.FormatOCI, "f", "is not a directory"},
		{"talos tree as oci", map[string]string{"blob/": "", "manifests/": ""}, bundle.FormatOCI, "", "holds a Talos flat image cache (blob/, manifests/), not an OCI image layout: add to it with --format talos-flat"},
		{"oci layout as talos", map[string]string{"oci-layout": layout, "index.json": `{"schemaVersion":2,"manifests":[]}`}, bundle.FormatTalosFlat, "", "holds an OCI image layout (oci-layout), not a Talos flat image cache: add to it with --format oci"},
		{"damaged index.json", map[string]string{"oci-layout": layout, "index.json": `{"schemaVersion":2,`}, bundle.FormatOCI, "", "index.json is not JSON"},
		{"manifests not a list", map[string]string{"oci-layout": layout, "index.json": `{"schemaVersion":2,"manifests":{}}`}, bundle.FormatOCI, "", "has no list of manifests"},
		{"other layout version", map[string]string{"oci-layout": `{"imageLayoutVersion":"2.0.0"}`}, bundle.FormatOCI, "", "is not an OCI image layout version 1.0.0 file"},
		{"unknown format", nil, "tar", "", `--format "tar" refused`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := mk(t, tc.files)
			before := tree(t, dir)
			target := filepath.Join(dir, tc.sub)
			w, err := bundle.Create(target, tc.format)
			if err == nil {
				_ = w.Close()
				t.Fatalf("Create(%s) accepted %v", tc.format, tc.files)
			}
			if !errors.Is(err, refusal.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q (refused: %v), want a refusal containing %q", err, errors.Is(err, refusal.ErrRefused), tc.want)
			}
			if tc.format != "tar" && !strings.Contains(err.Error(), "--to "+target) {
				t.Errorf("error %q does not name --to %s", err, target)
			}
			if after := tree(t, dir); after != before {
				t.Errorf("refused directory changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}

	// index.json is read through internal/inputfile: a FIFO or a device in its place is refused,
	// never read (a FIFO would block, /dev/zero never end).
	for _, special := range []string{"fifo", "/dev/zero"} {
		t.Run("index.json "+special, func(t *testing.T) {
			t.Parallel()
			dir := mk(t, map[string]string{"oci-layout": layout})
			p := filepath.Join(dir, "index.json")
			var err error
			if special == "fifo" {
				err = unix.Mkfifo(p, 0o644)
			} else {
				err = os.Symlink(special, p)
			}
			if err != nil {
				t.Fatal(err)
			}
			w, err := bundle.Create(dir, bundle.FormatOCI)
			if err == nil {
				_ = w.Close()
				t.Fatalf("index.json as %s accepted", special)
			}
			if !errors.Is(err, refusal.ErrRefused) || !strings.Contains(err.Error(), "index.json") {
				t.Errorf("index.json as %s: %v, want a refusal naming it", special, err)
			}
		})
	}

	t.Run("in use", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		create(t, dir, bundle.FormatOCI)
		_, err := bundle.Create(dir, bundle.FormatOCI)
		if !errors.Is(err, bundle.ErrInUse) || !errors.Is(err, refusal.ErrRefused) {
			t.Fatalf("second writer: %v, want ErrInUse (refused)", err)
		}
	})
}

// tree lists every path under dir with its size, for comparisons.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel)
		if !info.IsDir() {
			b.WriteString("=" + strconv.FormatInt(info.Size(), 10))
		}
		b.WriteString(" ")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestBlobFileChecks: a blob whose bytes do not hash to its digest, or are fewer or more than its
// size, is refused at Commit (or Write) naming the blob, and nothing is placed; one that matches
// is placed at blobs/sha256/<hex>, readable by others; no temporary file stays behind.
func TestBlobFileChecks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w := create(t, dir, bundle.FormatOCI)
	good := []byte("layer bytes")
	d := desc(t, good, types.OCILayer)
	final := filepath.Join(dir, "blobs", "sha256", d.Digest.Hex)

	for _, tc := range []struct {
		name  string
		write []byte
		want  string
	}{
		{"flipped byte", []byte("layer bytez"), "digest mismatch"},
		{"short", good[:5], "wrote 5 of its 11 bytes"},
		{"long", append(append([]byte{}, good...), '!'), "more than its 11 bytes"},
	} {
		f, err := w.Blob(d)
		if err != nil || f == nil {
			t.Fatalf("%s: Blob: %v, %v", tc.name, f, err)
		}
		_, werr := f.Write(tc.write)
		err = f.Commit()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), d.Digest.String()) {
			t.Errorf("%s: commit %v (write %v), want an error naming %s with %q", tc.name, err, werr, d.Digest, tc.want)
		}
		if _, err := os.Stat(final); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: blob placed after a failed commit (%v)", tc.name, err)
		}
	}
	writeBlob(t, w, good)
	st, err := os.Stat(final)
	if err != nil {
		t.Fatalf("blob not placed: %v", err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("blob mode %v, want 0644", st.Mode().Perm())
	}
	tmp, _ := filepath.Glob(filepath.Join(dir, bundle.WorkDirName, "*"))
	if len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, bundle.WorkDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("work directory left after Close: %v", err)
	}
}

// TestStoredBlobVerified: a blob already in the directory is hashed again; one that matches is
// not written again (Blob returns nil), a damaged one is removed and written anew.
func TestStoredBlobVerified(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := []byte("stored layer")
	d := desc(t, good, types.OCILayer)
	final := filepath.Join(dir, "blobs", "sha256", d.Digest.Hex)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(final, []byte("stored layez"), 0o644); err != nil { // same size, damaged
		t.Fatal(err)
	}
	w := create(t, dir, bundle.FormatOCI)
	f, err := w.Blob(d)
	if err != nil || f == nil {
		t.Fatalf("damaged stored blob: Blob = %v, %v; want a file to write it anew", f, err)
	}
	if _, err := os.Stat(final); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("damaged blob not removed: %v", err)
	}
	f.Abort()
	writeBlob(t, w, good)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = create(t, dir, bundle.FormatOCI)
	if f, err := w.Blob(d); err != nil || f != nil {
		t.Fatalf("intact stored blob: Blob = %v, %v; want nil (present)", f, err)
	}
}

// index reads dir's index.json.
func index(t *testing.T, dir string) v1.IndexManifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var im v1.IndexManifest
	if err := json.Unmarshal(b, &im); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	return im
}

// manifest returns a small image manifest naming config and layer.
func manifest(t *testing.T, config, layer v1.Descriptor) []byte {
	t.Helper()
	config.MediaType = types.OCIConfigJSON
	b, err := json.Marshal(v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Config: config, Layers: []v1.Descriptor{layer}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOCIIndexLastAndMerged: index.json appears only at Commit (a writer closed without it
// leaves oci-layout and blobs, which the next writer resumes); it lists each image under its
// full reference in org.opencontainers.image.ref.name and io.containerd.image.name; a second
// bundle written into the same directory keeps the images of the first (and foreign entries)
// and replaces the one listed under the same name.
func TestOCIIndexLastAndMerged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w := create(t, dir, bundle.FormatOCI)
	cfg := writeBlob(t, w, []byte(`{"architecture":"amd64","os":"linux"}`))
	layer := writeBlob(t, w, []byte("layer one"))
	mf := manifest(t, cfg, layer)
	md := desc(t, mf, types.OCIManifestSchema1)
	if err := w.Manifest("127.0.0.1:5000", "library/alpine", md, mf); err != nil {
		t.Fatal(err)
	}
	img := bundle.Image{Registry: "127.0.0.1:5000", Repository: "library/alpine", Tag: "3.20", Manifest: md}
	if err := w.Add(img); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil { // no Commit: a run that failed
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("index.json written without Commit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		t.Fatalf("oci-layout missing after an interrupted run: %v", err)
	}

	w = create(t, dir, bundle.FormatOCI) // resumed
	if w.Existing() {
		t.Error("a layout without index.json reported as an existing bundle")
	}
	if f, err := w.Blob(layer); err != nil || f != nil {
		t.Fatalf("blob of the interrupted run: %v, %v; want present", f, err)
	}
	if err := w.Manifest("127.0.0.1:5000", "library/alpine", md, mf); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(img); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(bundle.Image{Registry: "127.0.0.1:5000", Repository: "library/alpine", Tag: "3.20", Manifest: desc(t, []byte("other"), types.OCIManifestSchema1)}); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Errorf("a second manifest under one name: %v, want refused", err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	im := index(t, dir)
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != md.Digest || im.Manifests[0].MediaType != types.OCIManifestSchema1 || im.Manifests[0].Size != md.Size {
		t.Fatalf("index.json manifests %+v, want the one image %v", im.Manifests, md.Digest)
	}
	for _, k := range []string{"org.opencontainers.image.ref.name", "io.containerd.image.name"} {
		if got := im.Manifests[0].Annotations[k]; got != "127.0.0.1:5000/library/alpine:3.20" {
			t.Errorf("annotation %s = %q, want the full reference", k, got)
		}
	}

	// A foreign entry (as skopeo records it: the tag only) is kept; the same name is replaced.
	raw, _ := os.ReadFile(filepath.Join(dir, "index.json"))
	raw = bytes.Replace(raw, []byte(`"manifests": [`), []byte(`"manifests": [{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:`+strings.Repeat("a", 64)+`","size":3,"annotations":{"org.opencontainers.image.ref.name":"v1"}},`), 1)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	w = create(t, dir, bundle.FormatOCI)
	if !w.Existing() {
		t.Error("a layout with index.json not reported as existing")
	}
	layer2 := writeBlob(t, w, []byte("layer two"))
	mf2 := manifest(t, cfg, layer2)
	md2 := desc(t, mf2, types.OCIManifestSchema1)
	if err := w.Manifest("ghcr.io", "siderolabs/kubelet", md2, mf2); err != nil {
		t.Fatal(err)
	}
	for _, im := range []bundle.Image{
		{Registry: "127.0.0.1:5000", Repository: "library/alpine", Tag: "3.20", Manifest: md2},
		{Registry: "ghcr.io", Repository: "siderolabs/kubelet", Manifest: md2},
	} {
		if err := w.Add(im); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	got := map[string]v1.Hash{}
	for _, m := range index(t, dir).Manifests {
		got[m.Annotations["org.opencontainers.image.ref.name"]] = m.Digest
	}
	want := map[string]v1.Hash{
		"v1":                                 {Algorithm: "sha256", Hex: strings.Repeat("a", 64)},
		"127.0.0.1:5000/library/alpine:3.20": md2.Digest,
		"ghcr.io/siderolabs/kubelet@" + md2.Digest.String(): md2.Digest,
	}
	if len(got) != len(want) {
		t.Fatalf("index.json names %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("index.json %s = %v, want %v", k, got[k], v)
		}
	}
}

// TestManifestChecked: a manifest whose bytes do not hash to its digest is refused.
func TestManifestChecked(t *testing.T) {
	t.Parallel()
	w := create(t, t.TempDir(), bundle.FormatOCI)
	d := desc(t, []byte("{}"), types.OCIManifestSchema1)
	if err := w.Manifest("ghcr.io", "a/b", d, []byte("{ }")); err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("Manifest with other bytes: %v, want a digest mismatch", err)
	}
}
