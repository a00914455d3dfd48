package mirror

import (
	"path"

	"github.com/opencontainers/go-digest"
)

// Storage driver paths of distribution v3's layout (registry/storage/paths.go); eviction and the
// index rebuild walk and delete them through the driver. The one write around it: a fill's
// verified staging file is hard-linked to its blob data path under a filesystem root
// (repository.linkBlob), where an upload through the driver would copy it.
const (
	storageV2Root    = "/docker/registry/v2"
	storageRepoRoot  = storageV2Root + "/repositories"
	storageBlobsRoot = storageV2Root + "/blobs"
)

// blobDirPath is a blob's directory in the global blob store (its data file is "data" in it).
func blobDirPath(d digest.Digest) string {
	hex := d.Encoded()
	return path.Join(storageBlobsRoot, d.Algorithm().String(), hex[:2], hex)
}

func blobDataPath(d digest.Digest) string { return path.Join(blobDirPath(d), "data") }

// revisionPath is the directory of manifest d's revision link in repo.
func revisionPath(repo string, d digest.Digest) string {
	return path.Join(storageRepoRoot, repo, "_manifests/revisions", d.Algorithm().String(), d.Encoded())
}

// tagPath is tag's directory in repo (current link and index).
func tagPath(repo, tag string) string {
	return path.Join(storageRepoRoot, repo, "_manifests/tags", tag)
}

// layerLinkPath is the directory of blob d's link in repo.
func layerLinkPath(repo string, d digest.Digest) string {
	return path.Join(storageRepoRoot, repo, "_layers", d.Algorithm().String(), d.Encoded())
}
