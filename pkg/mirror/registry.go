package mirror

import (
	"context"
	"fmt"
	"regexp"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/storage"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // storage driver
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"   // storage driver
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
)

// newStorage builds distribution's storage over driver: repositories, their links, the blob store
// and the manifest formats. Its validation is what distribution's registry applies by default
// (configuration "validation" enabled, no URL rules): no foreign-layer URLs in a manifest, and an
// index's manifests must exist unless the put skips dependency checks (keepManifest does, as a
// pull-through cache stores an index before its children). No blob descriptor cache: distribution's
// is one per repository for manifests and blobs alike, so once cached a manifest digest answered
// at /blobs/ and a blob digest at /manifests/, and answers would depend on what was cached.
func newStorage(ctx context.Context, driver storagedriver.StorageDriver) (distribution.Namespace, error) {
	ns, err := storage.NewRegistry(ctx, driver,
		storage.ManifestURLsAllowRegexp(regexp.MustCompile("^$")),
		storage.EnableValidateImageIndexImagesExist)
	if err != nil {
		return nil, fmt.Errorf("open distribution storage: %w", err)
	}
	return ns, nil
}

// handlerCache is what the registry handlers (blobs.go, manifests.go) need of the cache: a
// *cache.Store.
type handlerCache interface {
	// FilesystemRoot is the root blob data files are under ("" : not local files).
	FilesystemRoot() string
	// Acquire keeps eviction off blob d until release.
	Acquire(d digest.Digest) (release func())
	// DiskFull asks eviction for room (lacked bytes; -1: unknown).
	DiskFull(lacked int64)
	// LinkBlob stores a verified staging file by a hard link (cache.ErrNotFilesystem, EXDEV:
	// use an upload).
	LinkBlob(ctx context.Context, repo, staging string, d digest.Digest, size int64) error
	// CommitBlob and CommitManifest run distribution's commit under the store lock and index it.
	CommitBlob(ctx context.Context, repo string, d digest.Digest, size int64, commit func() error) error
	CommitManifest(repo string, d digest.Digest, size int64, refs []digest.Digest, put func() error) error
	// Check is what a serve of blob d checks its data against (verified size, hashed in this
	// process); Verified records a serve that hashed it whole; EvictCorrupt removes a blob whose
	// data does not match and counts it.
	Check(d digest.Digest) cache.BlobCheck
	Verified(repo string, d digest.Digest, size int64, stamp filestamp.Stamp)
	EvictCorrupt(ctx context.Context, d digest.Digest, foundBy string) bool
	// Damaged reports whether blob d's stored data (read up to maxBytes) does not hash to d.
	Damaged(ctx context.Context, d digest.Digest, maxBytes int64) bool
	// Pulled and Tagged record a manifest pull and a tag; ReadByPeer a member's read of a blob.
	Pulled(repo string, d digest.Digest)
	ReadByPeer(d digest.Digest)
	Tagged(repo, tag string, d digest.Digest)
	// PutReferrers stores the referrers list of a cached subject manifest (cache.ErrNoSubject:
	// not cached); Referrers reads it; DropReferrers deletes it.
	PutReferrers(ctx context.Context, repo string, subject digest.Digest, b []byte) error
	Referrers(ctx context.Context, repo string, subject digest.Digest) ([]byte, bool)
	DropReferrers(ctx context.Context, repo string, subject digest.Digest)
}

// repository is one repository of one upstream as one request reads it: what distribution's
// storage holds of it (under "<upstream storage key>/<repository at the upstream>"), and the
// upstream that fills it.
type repository struct {
	local distribution.Repository
	store distribution.Namespace // distribution's storage, to commit fills detached from requests
	up    *configured
	repo  string // at the upstream, e.g. "library/alpine"
	// client is the repository name as the client sent it in the path: tags/list answers with
	// it (and NAME_UNKNOWN names it), as the upstream would.
	client string
	fetch  *upstream.Fetcher
	cache  handlerCache
	log    zerolog.Logger
	// fillJoined is Mirror.fillJoined.
	fillJoined func()
}

// repository opens rt's repository for a request whose path named it client.
//
// Errors: a *readError (NAME_INVALID for a name storage refuses; UNKNOWN otherwise).
func (m *Mirror) repository(ctx context.Context, rt route, client string) (*repository, error) {
	storageName := rt.up.storageKey + "/" + rt.repo
	named, err := reference.WithName(storageName)
	if err != nil {
		return nil, nameInvalid(storageName, err)
	}
	local, err := m.store.Repository(ctx, named)
	if err != nil {
		return nil, asReadError(err)
	}
	if _, err := reference.WithName(client); err != nil {
		client = storageName // as distribution named it before: never a name that is not one
	}
	return &repository{local: local, store: m.store, up: rt.up, repo: rt.repo, client: client,
		fetch: m.fetch, cache: m.cache, log: m.log, fillJoined: m.fillJoined}, nil
}

// storageName is the repository's name in storage and in the cache index.
func (r *repository) storageName() string { return r.up.storageKey + "/" + r.repo }
