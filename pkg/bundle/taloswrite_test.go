package bundle_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/bundle"
)

// TestTalosRegistryDir: the rule of rewriteRegistry in siderolabs/talos
// pkg/imager/cache/cache.go — ":port" as "_port_" (the last colon), everything else as is.
func TestTalosRegistryDir(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"docker.io":            "docker.io",
		"ghcr.io":              "ghcr.io",
		"127.0.0.1:5000":       "127.0.0.1_5000_",
		"registry.local:443":   "registry.local_443_",
		"[::1]:5000":           "[::1]_5000_",
		"registry.example.com": "registry.example.com",
	} {
		if got := bundle.TalosRegistryDir(in); got != want {
			t.Errorf("TalosRegistryDir(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := bundle.TalosDigestName(digest.SHA512.FromString("x")); err == nil {
		t.Error("a sha512 digest named in a Talos tree, which holds sha256 only")
	}
}

// TestTalosFlatTree: blobs go to blob/sha256-<hex>; manifests to
// manifests/<registry>/<repository>/digest/sha256-<hex> and a tag to .../reference/<tag>, the
// same bytes as the digest file it names (what Talos's registryd checks); a registry's port is
// written _port_. manifests/ appears only at Commit, in one piece for a new tree; a second
// bundle into the tree adds its files and keeps the first's.
func TestTalosFlatTree(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w := create(t, dir, bundle.FormatTalosFlat)
	cfg := writeBlob(t, w, []byte(`{"architecture":"arm64","os":"linux"}`))
	layer := writeBlob(t, w, []byte("talos layer"))
	mf := manifest(t, cfg, layer)
	md := desc(t, mf, types.OCIManifestSchema1)
	if err := w.Manifest("127.0.0.1:5000", "siderolabs/kubelet", md, mf); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(bundle.Image{Registry: "127.0.0.1:5000", Repository: "siderolabs/kubelet", Tag: "v1.36.2", Manifest: md}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "manifests")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("manifests/ before Commit: %v", err)
	}
	for _, d := range []v1.Descriptor{cfg, layer} {
		if _, err := os.Stat(filepath.Join(dir, "blob", "sha256-"+d.Digest.Hex)); err != nil {
			t.Errorf("blob %s: %v", d.Digest, err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	repo := filepath.Join(dir, "manifests", "127.0.0.1_5000_", "siderolabs", "kubelet")
	digestFile := filepath.Join(repo, "digest", "sha256-"+md.Digest.Hex)
	refFile := filepath.Join(repo, "reference", "v1.36.2")
	for _, p := range []string{digestFile, refFile} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !bytes.Equal(b, mf) {
			t.Errorf("%s is not the manifest's bytes", p)
		}
	}
	if got := tree(t, dir); strings.Contains(got, bundle.WorkDirName) {
		t.Errorf("work directory left: %s", got)
	}

	// A second bundle into the tree: Docker Hub as docker.io, the first image kept.
	w = create(t, dir, bundle.FormatTalosFlat)
	if !w.Existing() {
		t.Error("a tree with manifests/ not reported as existing")
	}
	mf2 := manifest(t, cfg, writeBlob(t, w, []byte("alpine layer")))
	md2 := desc(t, mf2, types.OCIManifestSchema1)
	if err := w.Manifest("docker.io", "library/alpine", md2, mf2); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(bundle.Image{Registry: "docker.io", Repository: "library/alpine", Tag: "3.20", Manifest: md2}); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(bundle.Image{Registry: "docker.io", Repository: "library/alpine", Manifest: md2}); err != nil { // by digest: no reference file
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{digestFile, refFile,
		filepath.Join(dir, "manifests", "docker.io", "library", "alpine", "digest", "sha256-"+md2.Digest.Hex),
		filepath.Join(dir, "manifests", "docker.io", "library", "alpine", "reference", "3.20"),
	} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("after the second bundle: %v", err)
		}
	}
	refs, _ := os.ReadDir(filepath.Join(dir, "manifests", "docker.io", "library", "alpine", "reference"))
	if len(refs) != 1 {
		t.Errorf("reference files %v, want only 3.20 (an image named by digest has none)", refs)
	}
}

// TestTalosFlatSHA256Only: a blob or manifest with another digest algorithm is an error naming
// the rule, not a file Talos cannot name.
func TestTalosFlatSHA256Only(t *testing.T) {
	t.Parallel()
	w := create(t, t.TempDir(), bundle.FormatTalosFlat)
	b := []byte("sha512 blob")
	d := v1.Descriptor{Digest: v1.Hash{Algorithm: "sha512", Hex: digest.SHA512.FromBytes(b).Encoded()}, Size: int64(len(b))}
	if _, err := w.Blob(d); err == nil || !strings.Contains(err.Error(), "sha256 digests only") {
		t.Errorf("sha512 blob: %v", err)
	}
	if err := w.Manifest("ghcr.io", "a/b", d, b); err == nil || !strings.Contains(err.Error(), "sha256 digests only") {
		t.Errorf("sha512 manifest: %v", err)
	}
}
