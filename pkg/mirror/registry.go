package mirror

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	registrymiddleware "github.com/distribution/distribution/v3/registry/middleware/registry"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/distribution/v3/registry/storage/driver/factory"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // storage driver
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"   // storage driver
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/upstream"
)

// middlewareName is the distribution registry middleware that puts this package's namespace in
// front of every App's storage. distribution keeps middleware factories in a process-wide
// table, so the factory is registered once and finds the App's namespace (built by newApp, all
// but distribution's storage under it) in the per-App options.
const middlewareName = "nodecache-pull-through"

// storeDriverName is the storage driver through which every App of this package serves from its
// cache.Store's driver: distribution builds an App's driver from its configuration (a factory
// name and parameters, in another process-wide table), so the factory hands back the driver the
// Store built, found in the parameters.
const storeDriverName = "nodecache-store"

var registerOnce sync.Once

// storeDriverFactory returns the driver in the "driver" parameter.
type storeDriverFactory struct{}

func (storeDriverFactory) Create(_ context.Context, params map[string]any) (storagedriver.StorageDriver, error) {
	d, ok := params["driver"].(storagedriver.StorageDriver)
	if !ok {
		return nil, fmt.Errorf("%s: missing driver parameter", storeDriverName)
	}
	return d, nil
}

func registerMiddleware() {
	registerOnce.Do(func() {
		factory.Register(storeDriverName, storeDriverFactory{})
		err := registrymiddleware.Register(middlewareName, func(_ context.Context, inner distribution.Namespace, _ storagedriver.StorageDriver, opts map[string]any) (distribution.Namespace, error) {
			ns, ok := opts["namespace"].(*namespace)
			if !ok {
				return nil, fmt.Errorf("%s: missing namespace option", middlewareName)
			}
			ns.Namespace = inner
			return ns, nil
		})
		if err != nil {
			panic(err) // only a second registration under this name can fail
		}
	})
}

// newApp builds distribution's registry App over the storage driver of m.cache (built from
// storageConfig), read-only, with our namespace in front of its storage.
func (m *Mirror) newApp(ctx context.Context) *handlers.App {
	registerMiddleware()
	ns := &namespace{byKey: m.byKey, fetch: m.fetch, log: m.log, cache: m.cache}
	cfg := &configuration.Configuration{}
	cfg.Storage = configuration.Storage{
		storeDriverName: configuration.Parameters{"driver": m.cache.Driver()},
		"redirect":      storageConfig(m.opts)["redirect"],
	}
	// No blob descriptor cache: distribution's is one per repository for manifests and blobs
	// alike, so once cached a manifest digest answered at /blobs/ (200 instead of 404) and a
	// blob digest at /manifests/ (500): answers then depended on what was cached.
	cfg.Storage["maintenance"] = configuration.Parameters{
		"readonly": map[any]any{"enabled": true},
		// distribution's purger runs in a goroutine that never stops, with a 7-day age; fill
		// leftovers are removed by (*Mirror).Run instead.
		"uploadpurging": map[any]any{"enabled": false},
	}
	cfg.Middleware = map[string][]configuration.Middleware{
		"registry": {{Name: middlewareName, Options: configuration.Parameters{"namespace": ns}}},
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.HTTP.RelativeURLs = true
	cfg.Log.AccessLog.Disabled = true
	cfg.Log.Level = "error"
	app := handlers.NewApp(ctx, cfg)
	m.store = ns.Namespace // distribution's storage, once the middleware was applied
	return app
}

// namespace puts pull-through repositories in front of distribution's storage. Repository names
// in storage are "<upstream storage key>/<repository at the upstream>".
type namespace struct {
	distribution.Namespace
	byKey map[string]*configured // read-only after New
	fetch *upstream.Fetcher
	log   zerolog.Logger
	cache handlerCache
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
	CommitBlob(repo string, d digest.Digest, size int64, commit func() error) error
	CommitManifest(repo string, d digest.Digest, size int64, refs []digest.Digest, put func() error) error
	// Pulled and Tagged record a manifest pull and a tag.
	Pulled(repo string, d digest.Digest)
	Tagged(repo, tag string, d digest.Digest)
}

func (n *namespace) Repository(ctx context.Context, named reference.Named) (distribution.Repository, error) {
	local, err := n.Namespace.Repository(ctx, named)
	if err != nil {
		return nil, err
	}
	key, repo, _ := strings.Cut(named.Name(), "/")
	up := n.byKey[key]
	if up == nil {
		return nil, distribution.ErrRepositoryUnknown{Name: named.Name()}
	}
	var client reference.Named = named
	if c, err := reference.WithName(stateFrom(ctx).clientName); err == nil {
		client = c
	}
	return &repository{Repository: local, store: n.Namespace, up: up, repo: repo, client: client, fetch: n.fetch, log: n.log, cache: n.cache}, nil
}

// Remove refuses: the cache is read-only. (Implementing it tells distribution not to warn that
// repositories cannot be removed.)
func (n *namespace) Remove(context.Context, reference.Named) error {
	return distribution.ErrUnsupported
}

// repository is one repository of one upstream: local storage first, the upstream to fill it.
type repository struct {
	distribution.Repository
	store distribution.Namespace // distribution's storage, to commit fills detached from requests
	up    *configured
	repo  string
	// client is the repository name as the client sent it: distribution's handlers answer with
	// Named() (tags/list "name", NAME_UNKNOWN details); storage keeps its own internal name.
	client reference.Named
	fetch  *upstream.Fetcher
	log    zerolog.Logger
	cache  handlerCache
}

// storageName is the repository's name in storage and in the cache index.
func (r *repository) storageName() string { return r.up.storageKey + "/" + r.repo }

// Named is the repository name the client asked for.
func (r *repository) Named() reference.Named { return r.client }

func (r *repository) Tags(ctx context.Context) distribution.TagService {
	return &tagService{local: r.Repository.Tags(ctx), r: r}
}

func (r *repository) Manifests(ctx context.Context, options ...distribution.ManifestServiceOption) (distribution.ManifestService, error) {
	local, err := r.Repository.Manifests(ctx, options...)
	if err != nil {
		return nil, err
	}
	return &manifestService{local: local, r: r}, nil
}

func (r *repository) Blobs(ctx context.Context) distribution.BlobStore {
	return &blobStore{BlobStore: r.Repository.Blobs(ctx), r: r}
}
