package mirrorapi

import "time"

// CachePath is serve's cache inventory (GET, JSON CacheInventory; same access rule as
// ClientsPath: loopback and the --allow networks). DELETE CachePath + "/<upstream>/<repository>@<digest>"
// evicts one image and is answered to loopback clients only (JSON CachedImage of what went,
// 404 when it is not cached, 400 for a malformed spec or an upstream serve does not have).
const CachePath = "/nodecache/v1/cache"

// CacheInventory is the JSON document served at CachePath.
type CacheInventory struct {
	// SizeBytes is the bytes of blob and manifest data stored (uploads in progress excluded);
	// MaxSizeBytes the cap (--max-size), 0 when there is none.
	SizeBytes    int64 `json:"size_bytes"`
	MaxSizeBytes int64 `json:"max_size_bytes"`
	// Blobs is the number of blob data files (manifests included).
	Blobs int `json:"blobs"`
	// Ready is false while the index is being rebuilt from storage: Images may then be missing
	// some.
	Ready bool `json:"ready"`
	// Images are the cached images, most recently pulled first.
	Images []CachedImage `json:"images"`
}

// CachedImage is one image: a top-level manifest (an image manifest or an index) in one
// repository, with every child manifest and blob it references.
type CachedImage struct {
	// Upstream is the registry name (docker.io, ghcr.io); Repository is as at that upstream.
	Upstream   string `json:"upstream"`
	Repository string `json:"repository"`
	// Tags are the cached tags that point at Digest.
	Tags []string `json:"tags,omitempty"`
	// ChildTags are the cached tags that point at one of its child manifests (an index's
	// platform image tagged on its own, like alpine:amd64 in the 3.20 index): tag → that
	// child's digest. Such a tag has no row of its own: the image holds the child, a pull through
	// the tag counts as a pull of the image, and evicting the image takes the tag with it.
	ChildTags map[string]string `json:"child_tags,omitempty"`
	Digest    string            `json:"digest"`
	// SizeBytes is the data of its manifests and blobs; a blob shared by images counts in each.
	SizeBytes int64 `json:"size_bytes"`
	// LastPulled is the last GET or HEAD (by tag or digest) of its top-level manifest or of any
	// child manifest it references (or when it was stored).
	LastPulled time.Time `json:"last_pulled"`
}
