package mirror

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// Defaults for Options.
const (
	// DefaultUpstreamTimeout bounds every upstream exchange up to its response headers (and a tag
	// revalidation as a whole). It stays below containerd's 30 s response-header deadline so a
	// client always gets an answer (stale or error) before it gives up.
	DefaultUpstreamTimeout = 10 * time.Second
	// DefaultRoot is where serve keeps its filesystem storage.
	DefaultRoot = "/var/lib/nodecache"
	// ScrubOff is the Options.ScrubInterval of no background scrubbing.
	ScrubOff time.Duration = -1
	// DefaultScrubInterval is --scrub-interval's default (cache.DefaultScrubInterval, a week).
	DefaultScrubInterval = cache.DefaultScrubInterval
)

// Options configures a Mirror. The zero value of every optional field means its default.
type Options struct {
	// Root is the filesystem storage directory. Empty keeps everything in memory (tests). With
	// Storage StorageS3 it holds only fills in flight and the cache index.
	Root string
	// Storage is StorageFilesystem (default) or StorageS3.
	Storage string
	// S3 is the bucket for StorageS3.
	S3 S3Storage
	// Upstreams are the registries pulled through; required, names unique. An Offline one is
	// never asked (offline.go): its URL may be nil.
	Upstreams []name.Upstream
	// DefaultUpstream is the upstream NAME used when a request carries neither ?ns= nor a
	// configured path prefix. Empty means docker.io when docker.io is configured, else none.
	DefaultUpstream string
	// UpstreamTimeout bounds an upstream exchange up to response headers and a whole tag
	// revalidation. Default DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// UpstreamConcurrency bounds, per upstream, the requests waiting for its response headers
	// (--upstream-concurrency); one beyond it waits up to UpstreamTimeout for a slot, then is
	// answered 429 with Retry-After (a cached tag is served stale instead). Default
	// upstream.DefaultConcurrency.
	UpstreamConcurrency int
	// TagTTL is how long a cached tag, and a repository's tag listing (tags/list), is served
	// without asking the upstream. 0 (default) revalidates on every request.
	TagTTL time.Duration
	// Transport is the base transport to upstreams, under authentication and redirects.
	// Default: a transport with dial, TLS and response-header timeouts of UpstreamTimeout.
	Transport http.RoundTripper
	// UpstreamCredentials are the credentials nodecache authenticates with, by upstream NAME
	// (--upstream-auth; upstreamauth.LoadCredentials). Upstreams without an entry are pulled
	// anonymously. Everything the credentials can read becomes readable by every client that
	// may pull (see PullAllow). Keys must be configured upstream names.
	UpstreamCredentials map[string]*upstreamauth.Credentials
	// UpstreamRootCAs are the certificate authorities trusted for an upstream, by NAME
	// (--upstream-ca; upstreamauth.LoadRootCAs). Keys must be configured upstream names.
	UpstreamRootCAs map[string]*x509.CertPool
	// Logger receives the access log and operational messages. Default: disabled.
	Logger zerolog.Logger
	// Registerer receives the mirror's metrics. Default: a private registry, served by
	// (*Mirror).MetricsHandler.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics; it must gather what Registerer registers. Default: the private
	// registry.
	Gatherer prometheus.Gatherer
	// ClientEvidenceAllow lists the networks, besides loopback, that may read
	// /nodecache/v1/clients.
	ClientEvidenceAllow []netip.Prefix
	// PullAllow lists the networks that may send registry requests (/v2/...). Empty (default):
	// every address. Otherwise 127.0.0.1 and ::1 (the node's own runtime) and these networks;
	// anyone else gets 403 DENIED, counted in nodecache_refused_total{reason="pull_allow"}.
	// /healthz, /readyz and /metrics stay open; /nodecache/v1/clients follows
	// ClientEvidenceAllow.
	PullAllow []netip.Prefix
	// UserAgent is sent to upstreams. Default "nodecache/<version>".
	UserAgent string
	// FillTimeout bounds one blob fill from its first upstream request to its commit; uploads
	// of fills older than this are removed every hour. Default upstream.DefaultFillTimeout (2h).
	FillTimeout time.Duration
	// MaxSize caps the cache (bytes of blob and manifest data, uploads excluded): over it, Run
	// evicts least recently pulled images down to 90 % of it. 0 (default): no cap. See
	// ParseMaxSize for --max-size.
	MaxSize int64
	// Clock tells the time for tag freshness (TagTTL) and the cleanup of fill leftovers.
	// Default time.Now.
	Clock func() time.Time
	// Chain is the shared nodecache (--chain, http(s)://HOST[:PORT]) every upstream is reached
	// through first, sent ?ns=<NAME>; upstream credentials then apply only to direct fetches.
	// When it fails (no answer, timeout, 5xx) the upstream is asked directly; after
	// upstream.BreakerFailures failures in a row it is left alone for upstream.BreakerOpen,
	// then probed with one request. 404, 401, 403 and 429 from it are passed on as they are.
	// Nil: upstreams directly (an upstream URL that announces mirrorapi.HeaderVersion on /v2/
	// is still sent ?ns=).
	Chain *url.URL
	// InstanceID names this instance in the Via entries that detect loops of chained caches.
	// Default: random (upstream.NewInstanceID).
	InstanceID string
	// UpstreamAllowPrivate are the networks an upstream's answer (a redirect, a token realm)
	// may send nodecache to although they are loopback, private, link-local, shared (CGNAT),
	// unspecified or multicast (--upstream-allow-private; upstream.Options.AllowPrivate).
	UpstreamAllowPrivate []netip.Prefix
	// UpstreamResolver resolves the hosts an upstream's answer names, before they are
	// checked and dialled. Default net.DefaultResolver.
	UpstreamResolver upstream.Resolver
	// MaxUnknownBlobSize bounds, in bytes, a blob whose size no upstream answer stated
	// (--max-unknown-blob-size). Default upstream.DefaultMaxUnknownBlobSize.
	MaxUnknownBlobSize int64
	// ScrubInterval is how often the background scrubber re-hashes each stored blob
	// (--scrub-interval). 0: the default, cache.DefaultScrubInterval (7 days) on filesystem
	// storage and none with StorageS3 (the replicas share the bucket: each would read all of
	// it); ScrubOff: none. Verify passes (mirrorapi.CacheVerifyPath) run either way.
	ScrubInterval time.Duration
	// ScrubRate bounds what the scrubber and a verify pass read, bytes a second (--scrub-rate).
	// Default cache.DefaultScrubRate (50 MiB/s).
	ScrubRate int64
	// Peers, when set, shares blobs and manifests by digest with the other node caches of the
	// cluster (--peers). Nil: none.
	Peers *PeerOptions
	// Seed is a bundle directory on serve's filesystem (--seed: an OCI image layout that names
	// its images, or a Talos image cache; package bundle) whose images Run stores once the cache
	// index is loaded, pinned, as nodecache cache import does; Ready answers not ready until they
	// are stored, and a bundle refused or damaged ends Run with the error, nothing of it stored.
	// Blobs already stored are not read again. Empty: none.
	Seed string
}

func (o *Options) setDefaults() error {
	var errs []error
	if len(o.Upstreams) == 0 {
		errs = append(errs, errors.New("upstreams: at least one upstream is required"))
	}
	seen := map[string]string{} // canonical name (name.Canonical) -> configured name
	for i, u := range o.Upstreams {
		if u.URL == nil && !u.Offline {
			errs = append(errs, fmt.Errorf("upstreams[%d].url: missing (or offline)", i))
		}
		c := name.Canonical(u.Name)
		if prev, dup := seen[c]; dup {
			errs = append(errs, fmt.Errorf("upstreams[%d].name: %q is configured twice (as %q)", i, u.Name, prev))
		}
		seen[c] = u.Name
	}
	for n := range o.UpstreamCredentials {
		if seen[name.Canonical(n)] != n {
			errs = append(errs, fmt.Errorf("upstream-credentials: %q is not the name of a configured upstream", n))
		}
	}
	for n := range o.UpstreamRootCAs {
		if seen[name.Canonical(n)] != n {
			errs = append(errs, fmt.Errorf("upstream-root-cas: %q is not a configured upstream", n))
		}
	}
	if o.DefaultUpstream == "" {
		if n, ok := seen[name.DockerHub]; ok {
			o.DefaultUpstream = n
		}
	} else {
		n, err := name.ParseRegistry(o.DefaultUpstream)
		switch configured, ok := seen[name.Canonical(n)]; {
		case err != nil:
			errs = append(errs, fmt.Errorf("default-upstream: %w", err))
		case !ok:
			errs = append(errs, fmt.Errorf("default-upstream: %q is not a configured upstream", n))
		default:
			n = configured // an alias selects the upstream configured under another name
		}
		o.DefaultUpstream = n
	}
	if o.UpstreamTimeout < 0 || o.TagTTL < 0 {
		errs = append(errs, errors.New("upstream-timeout and tag-ttl must not be negative"))
	}
	if o.UpstreamTimeout == 0 {
		o.UpstreamTimeout = DefaultUpstreamTimeout
	}
	errs = append(errs, o.setBounds()...)
	if o.Clock == nil {
		o.Clock = time.Now
	}
	switch o.Storage {
	case "":
		o.Storage = StorageFilesystem
	case StorageFilesystem:
	case StorageS3:
		if err := o.S3.validate(); err != nil {
			errs = append(errs, err)
		}
		if o.MaxSize > 0 {
			errs = append(errs, errors.New(maxSizeS3))
		}
	default:
		errs = append(errs, fmt.Errorf("storage: %q is not a storage kind (want filesystem or s3)", o.Storage))
	}
	errs = append(errs, o.setScrubDefaults()) // nil when fine: errors.Join drops it
	return errors.Join(errs...)
}

// setBounds fills in the defaults of the fill timeout and the upstream concurrency, and refuses
// negative bounds.
func (o *Options) setBounds() []error {
	var errs []error
	if o.FillTimeout < 0 {
		errs = append(errs, errors.New("fill-timeout must not be negative"))
	}
	if o.FillTimeout == 0 {
		o.FillTimeout = upstream.DefaultFillTimeout
	}
	if o.UpstreamConcurrency < 0 {
		errs = append(errs, errors.New("upstream-concurrency must not be negative"))
	}
	if o.UpstreamConcurrency == 0 {
		o.UpstreamConcurrency = upstream.DefaultConcurrency
	}
	if o.MaxSize < 0 {
		errs = append(errs, errors.New("max-size must not be negative"))
	}
	return errs
}

// setScrubDefaults sets ScrubInterval (by storage: o.Storage is set) and ScrubRate.
func (o *Options) setScrubDefaults() error {
	switch {
	case o.ScrubInterval < 0:
		o.ScrubInterval = ScrubOff
	case o.ScrubInterval == 0 && o.Storage == StorageS3:
		o.ScrubInterval = ScrubOff
	case o.ScrubInterval == 0:
		o.ScrubInterval = cache.DefaultScrubInterval
	}
	if o.ScrubRate < 0 {
		return errors.New("scrub-rate must not be negative")
	}
	if o.ScrubRate == 0 {
		o.ScrubRate = cache.DefaultScrubRate
	}
	return nil
}
