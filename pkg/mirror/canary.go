package mirror

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// canaryPlatforms are the platforms the canary index covers.
var canaryPlatforms = []string{"linux/amd64", "linux/arm64", "linux/arm/v7", "linux/arm/v6", "linux/386", "linux/ppc64le", "linux/s390x", "linux/riscv64"}

// canary holds the canary image's content by digest.
type canary struct {
	index     []byte
	indexDig  string
	manifests map[string][]byte // digest -> OCI manifest
	blobs     map[string][]byte // digest -> config or layer
}

// newCanary builds the canary: an OCI index with one image per platform, each a single layer
// holding /nodecache-canary (a small text file).
func newCanary() (*canary, error) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	content := []byte("nodecache canary: this image is served by the node's mirror itself\n")
	if err := tw.WriteHeader(&tar.Header{Name: "nodecache-canary", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		return nil, err
	}
	_, _ = tw.Write(content)
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tb.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	layerBytes, err := readLayer(layer)
	if err != nil {
		return nil, err
	}
	c := &canary{manifests: map[string][]byte{}, blobs: map[string][]byte{}}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, ps := range canaryPlatforms {
		p, err := v1.ParsePlatform(ps)
		if err != nil {
			return nil, err
		}
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return nil, err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
		cf.Config.Cmd = []string{"/nodecache-canary"}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return nil, err
		}
		raw, err := img.RawManifest()
		if err != nil {
			return nil, err
		}
		d, _ := img.Digest()
		c.manifests[d.String()] = raw
		rawCfg, _ := img.RawConfigFile()
		cd, _ := img.ConfigName()
		c.blobs[cd.String()] = rawCfg
		ld, _ := layer.Digest()
		c.blobs[ld.String()] = layerBytes
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}
	idx = mutate.AppendManifests(idx, adds...)
	raw, err := idx.RawManifest()
	if err != nil {
		return nil, err
	}
	d, _ := idx.Digest()
	c.index, c.indexDig = raw, d.String()
	return c, nil
}

// serve answers a canary request: a local hit.
func (c *canary) serve(w http.ResponseWriter, r *http.Request, rt route) {
	var (
		body      []byte
		mediaType string
		dig       string
	)
	switch rt.kind {
	case kindManifest:
		switch {
		case rt.ref == c.indexDig || !isDigest(rt.ref):
			body, mediaType, dig = c.index, string(types.OCIImageIndex), c.indexDig
		case c.manifests[rt.ref] != nil:
			body, mediaType, dig = c.manifests[rt.ref], string(types.OCIManifestSchema1), rt.ref
		}
	case kindBlob:
		if b := c.blobs[rt.ref]; b != nil {
			body, mediaType, dig = b, "application/octet-stream", rt.ref
		}
	case kindTags:
		body, mediaType = []byte(`{"name":"`+mirrorapi.CanaryRepository+`","tags":["latest"]}`+"\n"), "application/json"
	case kindReferrers: // nothing refers to the canary image
		body, mediaType = []byte(`{"schemaVersion":2,"mediaType":"`+mirrorapi.MediaTypeOCIIndex+`","manifests":[]}`), mirrorapi.MediaTypeOCIIndex
	}
	if body == nil {
		errNotFound("MANIFEST_UNKNOWN", fmt.Sprintf("%s has no %s %s", mirrorapi.CanaryRepository, rt.kind, rt.ref)).write(w)
		return
	}
	setCacheHeader(w, outcome{cache: mirrorapi.CacheHit})
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if dig != "" {
		w.Header().Set("Docker-Content-Digest", dig)
		w.Header().Set("Etag", `"`+dig+`"`)
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

func readLayer(l v1.Layer) ([]byte, error) {
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func isDigest(ref string) bool { return len(ref) > 7 && ref[:7] == "sha256:" }
