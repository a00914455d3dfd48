package mirrortest

import (
	"encoding/json"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// IndexJSON returns the body of an OCI image index (image-spec, "Image Index") listing children
// as image manifests of 1000 bytes each, compact as a registry serves it: a manifest with many
// references that needs no blob behind it.
func IndexJSON(t testing.TB, children []digest.Digest) []byte {
	t.Helper()
	idx := v1.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: v1.MediaTypeImageIndex}
	for _, c := range children {
		idx.Manifests = append(idx.Manifests, v1.Descriptor{MediaType: v1.MediaTypeImageManifest, Digest: c, Size: 1000})
	}
	b, err := json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
