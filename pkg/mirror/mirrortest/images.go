package mirrortest

import (
	"fmt"
	"io"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// MiB is 1<<20 bytes.
const MiB = 1 << 20

// Image builds a random OCI image of layers layers, each layerBytes long (bytes), for platform
// ("linux/amd64"; "" leaves the config's platform unset).
func Image(t testing.TB, layerBytes int64, layers int, platform string) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i := 0; i < layers; i++ {
		l, err := random.Layer(layerBytes, types.OCILayer)
		if err != nil {
			t.Fatalf("random layer: %v", err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatalf("append layer: %v", err)
		}
	}
	if platform != "" {
		p, err := v1.ParsePlatform(platform)
		if err != nil {
			t.Fatalf("platform %q: %v", platform, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatalf("set config: %v", err)
		}
	}
	return img
}

// MultiPlatformIndex builds an OCI image index with a linux/amd64 and a linux/arm64 image (each
// with layers layers of layerBytes bytes) and, as BuildKit writes them, one attestation manifest
// per image with platform unknown/unknown.
func MultiPlatformIndex(t testing.TB, layerBytes int64, layers int) v1.ImageIndex {
	t.Helper()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, p := range []string{"linux/amd64", "linux/arm64"} {
		img := Image(t, layerBytes, layers, p)
		pl, _ := v1.ParsePlatform(p)
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: pl}})
	}
	for i := 0; i < 2; i++ {
		att := Image(t, 512, 1, "")
		d, err := adds[i].Add.(v1.Image).Digest()
		if err != nil {
			t.Fatalf("digest: %v", err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: att, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"},
			Annotations: map[string]string{
				"vnd.docker.reference.type":   "attestation-manifest",
				"vnd.docker.reference.digest": d.String(),
			},
		}})
	}
	return mutate.AppendManifests(idx, adds...)
}

// NewRegistryWithImage starts a registry like NewRegistry that holds a random linux/amd64 image of
// one layer of layerBytes bytes as repo:tag; it returns the registry and the image.
func NewRegistryWithImage(t testing.TB, repo, tag string, layerBytes int64) (*Registry, v1.Image) {
	t.Helper()
	r := NewRegistry(t)
	img := Image(t, layerBytes, 1, "linux/amd64")
	r.PushImage(t, repo, tag, img)
	return r, img
}

// Ref returns a reference to repo:tag (or repo@digest when tag starts with "sha256:") on r.
func (r *Registry) Ref(t testing.TB, repo, tag string) name.Reference {
	t.Helper()
	s := fmt.Sprintf("%s/%s:%s", r.Addr, repo, tag)
	if len(tag) > 7 && tag[:7] == "sha256:" {
		s = fmt.Sprintf("%s/%s@%s", r.Addr, repo, tag)
	}
	ref, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatalf("reference %q: %v", s, err)
	}
	return ref
}

// PushIndex pushes idx to repo:tag on r.
func (r *Registry) PushIndex(t testing.TB, repo, tag string, idx v1.ImageIndex) {
	t.Helper()
	if err := remote.WriteIndex(r.Ref(t, repo, tag), idx, r.pushOptions(t)...); err != nil {
		t.Fatalf("push index %s:%s: %v", repo, tag, err)
	}
}

// PushImage pushes img to repo:tag on r.
func (r *Registry) PushImage(t testing.TB, repo, tag string, img v1.Image) {
	t.Helper()
	if err := remote.Write(r.Ref(t, repo, tag), img, r.pushOptions(t)...); err != nil {
		t.Fatalf("push image %s:%s: %v", repo, tag, err)
	}
}

func (r *Registry) pushOptions(t testing.TB) []remote.Option {
	opts := []remote.Option{remote.WithContext(t.Context())}
	if r.auth != nil {
		opts = append(opts, remote.WithAuth(r.auth))
	}
	return opts
}

// LayerDigests returns the digests of img's layers, in order.
func LayerDigests(t testing.TB, img v1.Image) []v1.Hash {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatalf("layers: %v", err)
	}
	out := make([]v1.Hash, 0, len(ls))
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatalf("layer digest: %v", err)
		}
		out = append(out, d)
	}
	return out
}

// BlobDigests returns the digests of img's config and layers (in that order): every blob a pull
// of img fetches.
func BlobDigests(t testing.TB, img v1.Image) []string {
	t.Helper()
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatalf("config digest: %v", err)
	}
	out := []string{cfg.String()}
	for _, d := range LayerDigests(t, img) {
		out = append(out, d.String())
	}
	return out
}

// LayerBlob returns the digest of img's layer i and its bytes as a registry serves them
// (compressed).
func LayerBlob(t testing.TB, img v1.Image, i int) (v1.Hash, []byte) {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatalf("layers: %v", err)
	}
	d, err := ls[i].Digest()
	if err != nil {
		t.Fatalf("layer digest: %v", err)
	}
	rc, err := ls[i].Compressed()
	if err != nil {
		t.Fatalf("layer %s: %v", d, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read layer %s: %v", d, err)
	}
	return d, b
}

// IndexChild returns the digest and the image of idx's manifest i (in a MultiPlatformIndex, 0 is
// linux/amd64 and 1 linux/arm64).
func IndexChild(t testing.TB, idx v1.ImageIndex, i int) (v1.Hash, v1.Image) {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatalf("index manifest: %v", err)
	}
	d := im.Manifests[i].Digest
	img, err := idx.Image(d)
	if err != nil {
		t.Fatalf("index child %s: %v", d, err)
	}
	return d, img
}

// StoredBytes is what a cache stores of img, in bytes: its manifest, its config and its layers.
func StoredBytes(t testing.TB, img v1.Image) int64 {
	t.Helper()
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n
}
