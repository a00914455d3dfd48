package mirrorapi

import (
	"strings"
	"time"
)

// CachePath is serve's cache inventory (GET, JSON CacheInventory; same access rule as
// ClientsPath: loopback and the --allow networks). DELETE CachePath + "/<upstream>/<repository>@<digest>"
// (or ":<tag>", a tag of an image's row) evicts one image and is answered to loopback clients
// only (JSON CachedImage of what went, 404 when it is not cached, 409 when a pin holds it or it
// is a child manifest of a cached index, naming the index; 400 for a malformed spec or an
// upstream serve does not have).
const CachePath = "/nodecache/v1/cache"

// CachePinsPath is serve's pins (issue 24), answered to loopback and the --allow networks (the
// rule of ClientsPath; 403 otherwise), 503 while the cache index is loaded or rebuilt:
//
//   - GET CachePinsPath: the pins, JSON PinList.
//   - PUT CachePinsPath + "/<upstream>/<repository>:<tag>" or "…@<digest>": pin what the cache holds
//     of that image now (a pin by tag follows the tag); 200 with the Pin. 404 when the cache holds
//     no such tag or manifest (nothing is fetched: nodecache warm --pin fetches and pins), 409
//     when the pinned bytes would go above 80% of the cap (--max-size; the message names it), 400
//     for a malformed spec or an upstream serve does not have.
//   - DELETE the same path: drop that pin; 200 with the Pin dropped, 404 when there is none.
const CachePinsPath = CachePath + "/pins"

// Pin is one pin: an upstream's repository and a tag or a digest whose image eviction never
// removes.
type Pin struct {
	Upstream   string `json:"upstream"`
	Repository string `json:"repository"`
	// Tag is the tag pinned; "" for a pin by digest.
	Tag string `json:"tag,omitempty"`
	// Digest is the manifest pinned: the digest of a pin by digest; for a pin by tag, the
	// manifest the tag named when it was pinned or when its last move completed.
	Digest string `json:"digest"`
	// Next is, for a pin by tag, the manifest a revalidation moved the tag to: pinned as well
	// until its image is complete (its manifest and, for each platform image the old one held,
	// one stored with every blob), then it becomes Digest and the old image is released.
	Next string `json:"next,omitempty"`
	// Pinned is when the pin was made.
	Pinned time.Time `json:"pinned"`
	// SizeBytes is the data of the images it holds now (each blob once).
	SizeBytes int64 `json:"size_bytes"`
}

// PinList is the JSON document served at CachePinsPath.
type PinList struct {
	// PinnedBytes is the data the pins hold (each blob once); MaxSizeBytes the cap (0: none),
	// of which pins may hold at most 80%.
	PinnedBytes  int64 `json:"pinned_bytes"`
	MaxSizeBytes int64 `json:"max_size_bytes"`
	// Pins are by upstream, repository, tag, then digest.
	Pins []Pin `json:"pins"`
}

// CacheInventory is the JSON document served at CachePath.
type CacheInventory struct {
	// SizeBytes is the bytes of blob and manifest data stored (uploads in progress excluded);
	// MaxSizeBytes the cap (--max-size), 0 when there is none; PinnedBytes the part of SizeBytes
	// pins hold (CachePinsPath).
	SizeBytes    int64 `json:"size_bytes"`
	MaxSizeBytes int64 `json:"max_size_bytes"`
	PinnedBytes  int64 `json:"pinned_bytes"`
	// Blobs is the number of blob data files (manifests included).
	Blobs int `json:"blobs"`
	// UnreferencedBlobs and UnreferencedBytes are the part of Blobs and SizeBytes no stored
	// manifest references (a blob fetched by digest alone, one held for --peers members, a pull
	// whose manifest was never stored): listed under no image, and evicted first.
	UnreferencedBlobs int   `json:"unreferenced_blobs"`
	UnreferencedBytes int64 `json:"unreferenced_bytes"`
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
	// Pinned is true when a pin (CachePinsPath) holds the image: eviction never removes it, and
	// DELETE refuses it (409).
	Pinned bool `json:"pinned"`
}

// CacheVerifyPath starts and follows a verify pass over serve's stored blobs (loopback and the
// --allow networks, as CachePath's GET). POST starts one (optional query rate: its bound in
// bytes a second as nodecache cache verify's --rate takes it, such as 200MiB; default serve's
// --scrub-rate; 400 when it does not parse) and answers it, 202 Accepted with a VerifyPass;
// a pass already running is answered instead of starting another. GET answers the latest pass
// (404 when none was asked for since serve started). Both answer 503 while the cache index is
// loaded or rebuilt.
const CacheVerifyPath = CachePath + "/verify"

// States of a VerifyPass.
const (
	VerifyRunning = "running" // blobs are being read
	VerifyDone    = "done"    // every blob was read
	VerifyStopped = "stopped" // serve stopped before the end
)

// VerifyPass is the progress of one verify pass: every blob the index held when it started is
// read whole and hashed, and one whose data does not match its digest or verified size is evicted
// (the next request for it fetches it again) or, when it cannot be refetched (a pinned blob),
// quarantined and counted unrepairable.
type VerifyPass struct {
	// ID numbers the passes of one serve process, from 1.
	ID int64 `json:"id"`
	// State is VerifyRunning, VerifyDone or VerifyStopped.
	State string `json:"state"`
	// Started and Finished (zero while running) are serve's clock (RFC 3339).
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	// RateBytes is the pass's bound on what it reads, bytes a second.
	RateBytes int64 `json:"rate_bytes_per_second"`
	// Blobs and SizeBytes are what the pass reads: blob data files (manifests included), bytes.
	Blobs     int   `json:"blobs"`
	SizeBytes int64 `json:"size_bytes"`
	// Checked and CheckedBytes are what it has read so far.
	Checked      int   `json:"checked"`
	CheckedBytes int64 `json:"checked_bytes"`
	// Corrupt blobs did not match; Evicted of them were removed, Unrepairable quarantined
	// (meant for pinned content; none yet: damaged pinned blobs are evicted and fetched again).
	// CorruptBlobs are their digests.
	Corrupt      int      `json:"corrupt"`
	Evicted      int      `json:"evicted"`
	Unrepairable int      `json:"unrepairable"`
	CorruptBlobs []string `json:"corrupt_blobs,omitempty"`
	// Missing blobs had no data any more (evicted while the pass ran, or deleted behind serve's
	// back: dropped from the index); Unreadable ones could not be read (an I/O error: see serve's
	// log).
	Missing    int `json:"missing"`
	Unreadable int `json:"unreadable"`
}

// CacheImportPath receives a bundle of images (nodecache cache import): POST, the body a tar
// stream whose first entry is ImportPlanEntry (the ImportPlan, JSON) and whose further entries
// are blobs, each named ImportBlobEntry(digest) and as long as the plan says. serve stages every
// blob and checks its digest and size before anything is stored; a blob the plan lists must be
// in the stream unless serve already stores it (CacheImportCheckPath says which). Then each image
// is stored under its upstream and repository (blobs, then manifests, every child before its
// index, then tags), and pinned. Answered to loopback and the --allow networks only (403
// otherwise), as CachePath's GET: 200 with an ImportResult; 400 for a plan serve refuses (an
// image of a registry that is not one of its upstreams, a manifest that does not parse or match
// its digest); 422 for a blob that does not match its digest or size, or is neither sent nor
// stored, naming it (nothing was stored); 503 while the cache index is loaded; 507 when the disk
// is full while staging.
const CacheImportPath = CachePath + "/import"

// CacheImportCheckPath answers, for an ImportPlan POSTed as JSON, which of its blobs serve does
// not store yet (200, ImportCheck): the ones an import must send. It checks the plan as
// CacheImportPath does (400) and stores nothing. Same access rule as CacheImportPath.
const CacheImportCheckPath = CacheImportPath + "/check"

// ImportPlanEntry is the name of the first entry of an import's tar stream: the ImportPlan.
const ImportPlanEntry = "plan.json"

// ImportBlobEntry is the name of blob d's entry in an import's tar stream:
// "blobs/<algorithm>/<encoded>", as in an OCI image layout.
func ImportBlobEntry(d string) string {
	alg, enc, _ := strings.Cut(d, ":")
	return "blobs/" + alg + "/" + enc
}

// ImportPlan is what an import stores: the images, every manifest they reach that the bundle
// holds, and every config and layer blob those manifests reference.
type ImportPlan struct {
	Images    []ImportImage    `json:"images"`
	Manifests []ImportManifest `json:"manifests"`
	Blobs     []ImportBlob     `json:"blobs"`
}

// ImportImage is one image of an import: the registry (serve's upstream) and repository it is
// stored under, its tag ("" for an image imported by digest alone) and the digest of its
// top-level manifest.
type ImportImage struct {
	Upstream   string `json:"upstream"`
	Repository string `json:"repository"`
	Tag        string `json:"tag,omitempty"`
	Digest     string `json:"digest"`
}

// ImportManifest is one manifest of an import: digest, media type and its exact bytes
// (base64 in JSON).
type ImportManifest struct {
	Digest    string `json:"digest"`
	MediaType string `json:"media_type"`
	Raw       []byte `json:"raw"`
}

// ImportBlob is one blob of an import: digest and size in bytes.
type ImportBlob struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// ImportCheck is CacheImportCheckPath's answer: the blobs of the plan serve does not store.
type ImportCheck struct {
	Missing []ImportBlob `json:"missing"`
}

// ImportResult is CacheImportPath's answer: what the import stored.
type ImportResult struct {
	// Images are the images stored (Upstream as serve names it), in the plan's order.
	Images []ImportImage `json:"images"`
	// Manifests is the number of manifests stored.
	Manifests int `json:"manifests"`
	// BlobsStored and BytesStored are the blobs the import carried and stored; BlobsPresent
	// those serve already stored (linked, not sent again).
	BlobsStored  int   `json:"blobs_stored"`
	BytesStored  int64 `json:"bytes_stored"`
	BlobsPresent int   `json:"blobs_present"`
}
