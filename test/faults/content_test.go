package faults

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// object is one piece of content the upstream holds and clients ask for: a manifest (by its tag
// or digest) or a blob (a config or a layer), with the bytes a right answer carries.
type object struct {
	// manifest: a manifest, asked by tag (and digest); else a blob.
	manifest bool
	repo     string
	// tag is the manifest's tag (tags never move in the suite).
	tag string
	// digest is "sha256:<hex>" of data.
	digest v1.Hash
	data   []byte
	// bigNoRecovery: a blob larger than any bounded spill on a full disk; nodecache may answer
	// it 503 for as long as the disk is full, so no recovery is asked of it.
	bigNoRecovery bool
}

func (o *object) size() int64 { return int64(len(o.data)) }

func (o *object) String() string {
	if o.manifest {
		return fmt.Sprintf("manifest %s:%s", o.repo, o.tag)
	}
	return fmt.Sprintf("blob %s@%s (%d bytes)", o.repo, o.digest.Hex[:12], len(o.data))
}

// randomBytes returns n bytes drawn from rng (replayable from the seed).
func randomBytes(rng *rand.Rand, n int64) []byte {
	var seed [32]byte
	for i := range 4 {
		v := rng.Uint64()
		for j := range 8 {
			seed[i*8+j] = byte(v >> (8 * j))
		}
	}
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(seed).Read(b)
	return b
}

// sizeBetween returns a size in [lo, hi] bytes, log-uniform: as many small blobs as large ones.
func sizeBetween(rng *rand.Rand, lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	// Doubling steps from lo, then a uniform share of the last step.
	steps := 0
	for v := lo; v < hi; v *= 2 {
		steps++
	}
	s := lo << rng.IntN(steps)
	return min(hi, s+rng.Int64N(s))
}

// pushImage builds an OCI image of layers blobs of layerSizes bytes (seeded bytes), pushes it to
// up as repo:tag and returns its objects: the manifest, the config, the layers.
func pushImage(t *testing.T, up *mirrortest.Registry, rng *rand.Rand, repo, tag string, layerSizes []int64) []*object {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	var (
		layers []v1.Layer
		datas  [][]byte
	)
	for _, n := range layerSizes {
		b := randomBytes(rng, n)
		datas = append(datas, b)
		layers = append(layers, static.NewLayer(b, types.OCILayer))
	}
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatalf("build image: %v", err)
	}
	up.PushImage(t, repo, tag, img)

	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	// A static layer's digest is that of its bytes, as the manifest's and the config's are.
	objs := []*object{
		{manifest: true, repo: repo, tag: tag, digest: sha256Of(raw), data: raw},
		{repo: repo, digest: sha256Of(cfg), data: cfg},
	}
	for _, data := range datas {
		objs = append(objs, &object{repo: repo, digest: sha256Of(data), data: data})
	}
	return objs
}

// sha256Of is the digest of data, "sha256:<hex>": an object's digest.
func sha256Of(data []byte) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sha256.Sum256(data))}
}
