// Package bundle is the on-disk form of images carried to a cache without a registry in
// between: `nodecache warm --to DIR` writes one, `nodecache cache import` and `serve --seed`
// read one. Two layouts:
//
//   - FormatOCI: an OCI image layout (image-spec image-layout.md): `oci-layout`, `index.json`
//     with one entry per image whose org.opencontainers.image.ref.name annotation is the image's
//     full reference (registry, repository, tag), and every blob, manifests included, under
//     `blobs/<algorithm>/<hex>`. skopeo (oci:DIR:REF), crane and oras read it.
//   - FormatTalosFlat: the tree `talosctl images cache-create --layout flat` writes
//     (siderolabs/talos pkg/imager/cache/cache.go): configs and layers as `blob/sha256-<hex>`,
//     manifests as `manifests/<registry>/<repository>/digest/sha256-<hex>` and tags as
//     `manifests/<registry>/<repository>/reference/<tag>`, for Talos boot media and
//     `talosctl image cache-serve`.
//
// Writers (Create) never leave a bundle that looks complete but is not: every blob goes through
// a temporary file, checked against its digest and size, fsynced and renamed into place, and
// what makes images visible — index.json, the manifests tree — is written last.
package bundle

import (
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// Format is a bundle layout.
type Format string

const (
	// FormatOCI is an OCI image layout (image-spec v1.1 image-layout.md).
	FormatOCI Format = "oci"
	// FormatTalosFlat is Talos's flat image cache tree (talosctl images cache-create
	// --layout flat).
	FormatTalosFlat Format = "talos-flat"
)

// Formats lists the formats, default first.
func Formats() []Format { return []Format{FormatOCI, FormatTalosFlat} }

// ParseFormat accepts "oci" (also "", the default) or "talos-flat"; anything else is refused
// naming --format and the accepted values.
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case "", FormatOCI:
		return FormatOCI, nil
	case FormatTalosFlat:
		return FormatTalosFlat, nil
	}
	return "", refusal.Value("--format", s, "want oci (an OCI image layout) or talos-flat (the tree of talosctl images cache-create --layout flat)")
}

// TalosRegistryDir is the directory name Talos gives a registry under manifests/: the registry
// as written in references, with a ":port" written as "_port_" (so the tree can live on a vfat
// boot partition) — rewriteRegistry in siderolabs/talos pkg/imager/cache/cache.go. registry is
// normalised by the distribution reference grammar, so Docker Hub is already "docker.io", the
// name Talos gives it too. Talos's registryd undoes the rule (handleRegistryWithPort,
// internal/app/machined/pkg/system/services/registry/registry.go).
func TalosRegistryDir(registry string) string {
	if i := strings.LastIndex(registry, ":"); i > 0 {
		return registry[:i] + "_" + registry[i+1:] + "_"
	}
	return registry
}

// TalosDigestName is the file name Talos gives a blob or manifest: "sha256-<hex>" (the ":" of
// the digest replaced, as in cache.go). Talos stores sha256 digests only; another algorithm is
// an error.
func TalosDigestName(d digest.Digest) (string, error) {
	if d.Algorithm() != digest.SHA256 {
		return "", fmt.Errorf("digest %s: the Talos image cache names files sha256-<hex> and holds sha256 digests only", d)
	}
	return "sha256-" + d.Encoded(), nil
}
