package cache

import (
	"path"
	"strings"

	"github.com/opencontainers/go-digest"
)

// Storage driver paths of distribution v3's storage layout (the path specs of
// registry/storage/paths.go, pathFor); eviction and the index rebuild walk and delete them
// through the driver. The one write around it: a fill's verified staging file is hard-linked to
// its blob data path under a filesystem root (Store.LinkBlob), where an upload through the
// driver would copy it. Every path is absolute in the driver's namespace, "/"-separated.
const (
	// V2Root is the root of distribution's layout.
	V2Root = "/docker/registry/v2"
	// RepoRoot holds the repositories: <RepoRoot>/<name>/{_manifests,_layers,_uploads}.
	RepoRoot = V2Root + "/repositories"
	// BlobsRoot is the global blob store: <BlobsRoot>/<algorithm>/<first two hex>/<hex>/data.
	BlobsRoot = V2Root + "/blobs"
)

// BlobDirPath is blob d's directory in the global blob store (its data file is "data" in it).
// d must be valid (digest.Validate): its encoded part is at least two characters.
func BlobDirPath(d digest.Digest) string {
	hex := d.Encoded()
	return path.Join(BlobsRoot, d.Algorithm().String(), hex[:2], hex)
}

// BlobDataPath is blob d's data file (distribution's blobDataPathSpec).
func BlobDataPath(d digest.Digest) string { return path.Join(BlobDirPath(d), "data") }

// RevisionPath is the directory of manifest d's revision link in storage repository repo
// (manifestRevisionPathSpec).
func RevisionPath(repo string, d digest.Digest) string {
	return path.Join(RepoRoot, repo, "_manifests/revisions", d.Algorithm().String(), d.Encoded())
}

// TagPath is tag's directory in storage repository repo: its current link and its index
// (manifestTagPathSpec).
func TagPath(repo, tag string) string {
	return path.Join(RepoRoot, repo, "_manifests/tags", tag)
}

// LayerLinkPath is the directory of blob d's link in storage repository repo
// (layerLinkPathSpec without its "link").
func LayerLinkPath(repo string, d digest.Digest) string {
	return path.Join(RepoRoot, repo, "_layers", d.Algorithm().String(), d.Encoded())
}

// LinkDigest parses the tail of a link path below its algorithm directory,
// "<algorithm>/<hex>/link"; ok is false when it is not one or the digest is invalid.
func LinkDigest(rest string) (d digest.Digest, ok bool) {
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", false
	}
	d = digest.NewDigestFromEncoded(digest.Algorithm(parts[0]), parts[1])
	return d, d.Validate() == nil
}
