// Package upstream is the mirror's upstream side: one client per configured registry
// (anonymous bearer tokens, redirects, per-repository transports), blob fills (one upstream
// download per blob however many clients ask, resumed when the stream breaks, verified before
// the last byte is released), manifest and tag lookups shared by concurrent requests, tag
// freshness for --tag-ttl, and the upstream metrics.
//
// It knows nothing of distribution's storage: what a fill or a manifest fetch produced is handed
// to a function of the caller (CommitFunc, KeepFunc) that stores it.
package upstream

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"

	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// Defaults for Options.
const (
	// DefaultTimeout bounds every upstream exchange up to its response headers (and a tag
	// revalidation as a whole); below containerd's 30 s response-header deadline.
	DefaultTimeout = 10 * time.Second
	// DefaultFillTimeout bounds one blob fill from its first request to its commit.
	DefaultFillTimeout = 2 * time.Hour
	// MaxFreshTags bounds how many tags Options.TagTTL remembers as fresh; the least recently
	// used goes first (it is then revalidated on its next request).
	MaxFreshTags = 65536
	// DefaultMaxUnknownBlobSize (16 GiB) bounds a blob whose size the upstream did not state.
	// Registries state it (a blob HEAD's Content-Length, or the GET's), so the bound matters
	// only for an upstream that states neither; it is well above the largest layers of real
	// images (GPU and ML framework images carry layers of a few GiB) and keeps a body that
	// never ends, or one that expands, from filling the disk.
	DefaultMaxUnknownBlobSize = 16 << 30
	// DefaultConcurrency is how many requests to one upstream may wait for its response headers
	// at once (--upstream-concurrency): more than containerd's default of 3 concurrent layer
	// downloads times the nodes of a busy shared tier's burst, few enough that an upstream that
	// stopped answering does not gather every client's request.
	DefaultConcurrency = 32
)

// Registry is one upstream registry: the name clients use for it and where its API is.
type Registry struct {
	// Name is the registry host as written in image references, e.g. "ghcr.io".
	Name string
	// URL is scheme://host[:port] of its API.
	URL *url.URL
	// Credentials, when set, authenticate nodecache to this upstream (and only to it and its
	// token realm: see upstreamauth.RealmAllowed). Nil: anonymous, with the anonymous tokens real registries
	// hand out.
	Credentials *upstreamauth.Credentials
	// RootCAs, when set, are the certificate authorities trusted for TLS to this upstream, its
	// token realm and its redirects (the system's plus a private CA: upstreamauth.LoadRootCAs). Needs an
	// *http.Transport as Options.Transport. Nil: the system's.
	RootCAs *x509.CertPool
}

// Options configures a Fetcher. The zero value of every optional field means its default.
type Options struct {
	// StagingDir holds blobs being filled (required): files "fill-*" in it belong to fills; the
	// cache that owns the directory removes what an interrupted run left (cache.Store.Take).
	StagingDir string
	// Timeout bounds an upstream exchange up to response headers, a whole tag revalidation and
	// a stall of a blob stream. Default DefaultTimeout. With Chain, the shared tier's answer
	// is waited for SharedTierTimeout(Timeout) (when Transport is an *http.Transport), and an
	// exchange may take that plus Timeout for the direct attempt after it.
	Timeout time.Duration
	// TagTTL is how long a tag confirmed upstream counts as fresh, and how long a tag listing
	// is kept (Remote.Tags). 0 (default): never.
	TagTTL time.Duration
	// FillTimeout bounds one blob fill. Default DefaultFillTimeout.
	FillTimeout time.Duration
	// Transport is the base transport, under authentication and redirects. Default
	// DefaultTransport(Timeout).
	Transport http.RoundTripper
	// UserAgent is sent upstream (required).
	UserAgent string
	// Logger receives fill failures and resumes. Default: disabled.
	Logger zerolog.Logger
	// Registerer receives the upstream metrics (required).
	Registerer prometheus.Registerer
	// Clock tells the time for tag freshness and transport age. Default time.Now.
	Clock func() time.Time
	// Chain is the URL (scheme://host[:port]) of a shared nodecache every upstream is reached
	// through first (--chain), with ?ns=<name>, anonymously; when it fails (no answer, timeout,
	// 5xx other than 508) the upstream is asked directly, and after BreakerFailures failures
	// in a row it is left alone for BreakerOpen. Nil: upstreams directly.
	Chain *url.URL
	// InstanceID names this nodecache in the Via entries of requests to shared nodecaches
	// ("1.1 nodecache/<id>"). Default NewInstanceID().
	InstanceID string
	// AllowPrivate are the networks (--upstream-allow-private) an upstream's answer may send
	// nodecache to although they are loopback, private, link-local, shared (CGNAT),
	// unspecified, multicast, cloud metadata or otherwise not globally reachable addresses
	// (addressClass). Without them such an address is reached on an upstream's word (a
	// redirect's Location, a token realm) only when it is a loopback or private address the
	// same upstream's configured endpoint was reached at (see addressGuard), so a malicious or
	// intercepted upstream cannot make nodecache fetch from inside the network. Configured
	// endpoints (upstream URLs, Chain, proxies from the environment) are reached wherever they
	// are, except a name that resolves to a link-local or metadata address. See
	// TargetRefusedError.
	AllowPrivate []netip.Prefix
	// Resolver resolves the hosts an upstream's answer names, to check them before dialling.
	// Default net.DefaultResolver.
	Resolver Resolver
	// MaxUnknownBlobSize bounds a blob whose size no upstream answer stated (HEAD refused, GET
	// without Content-Length): past it the fill fails. Default DefaultMaxUnknownBlobSize.
	MaxUnknownBlobSize int64
	// Peers, when set, are the other node caches of the cluster: blobs and manifests by digest
	// are asked of their owner first (see Peers). Nil: no peers.
	Peers *Peers
	// Concurrency bounds the requests to one upstream (whichever tier answers them: the
	// registry, a shared tier, a member) from their start until their response headers
	// arrive; a body being read holds no slot. A request beyond it waits up to Timeout for a
	// slot, then fails with an *Error of status 429 wrapping ErrUpstreamBusy (issue 23). Default
	// DefaultConcurrency.
	Concurrency int
	// OnDiskFull, when set, is called (from the fill's goroutine) when a fill's staging file
	// hits ENOSPC: the fill then streams through memory (SpillWindow), is served and verified,
	// but not stored. lacked is how many more bytes (beyond what its staging file held, which is
	// freed once the fill is over) the blob needed; -1 when its size is unknown.
	OnDiskFull func(lacked int64)
	// SpillWindow is how many bytes (at most) a fill that cannot be stored keeps in memory for
	// the clients reading it, once its staging file hit ENOSPC. Default DefaultSpillWindow.
	SpillWindow int64
	// SpillMemory bounds the bytes all fills that cannot be stored, and the clients' own
	// streams of them, keep in memory together (nodecache_fill_spill_bytes). Default
	// DefaultSpillMemory.
	SpillMemory int64
}

// Fetcher reaches every configured upstream for the mirror. Its methods are safe for
// concurrent use. It starts no goroutine until a fill starts.
type Fetcher struct {
	opts    Options
	log     zerolog.Logger
	remotes map[string]*Remote
	fills   *fillSet
	spill   *spillBudget // the memory of fills that cannot be stored (spill.go)
	flight  singleflight.Group
	metrics *metrics
	fresh   *lru.Cache[string, time.Time] // nil when TagTTL is 0
	chain   *chain                        // nil without Options.Chain
	peers   *peerTier                     // nil without Options.Peers
	health  *health                       // failures, successes, rate limits (health.go)
	owned   []*http.Transport             // the guarded transports New made, one per upstream

	// tagLists keeps tag listings for TagTTL (taglist.go).
	tagLists tagListCache

	// fillCtx is the parent of every fill, detached from the requests that start them;
	// abandon cancels it.
	fillCtx context.Context
	abandon context.CancelFunc
}

// New builds a Fetcher for regs. It contacts no upstream. Each registry's resume and digest
// mismatch counters are on /metrics from the start, at 0. ctx's values (not its cancellation)
// reach the fills; Close abandons them.
//
// Errors: a missing StagingDir, UserAgent or Registerer, a registry URL host that is not a
// host, metrics already registered.
func New(ctx context.Context, regs []Registry, opts Options) (*Fetcher, error) {
	switch {
	case opts.StagingDir == "":
		return nil, errors.New("upstream: staging dir is required")
	case opts.UserAgent == "":
		return nil, errors.New("upstream: user agent is required")
	case opts.Registerer == nil:
		return nil, errors.New("upstream: metrics registerer is required")
	}
	opts.setDefaults()
	dialer := &net.Dialer{Timeout: opts.Timeout, KeepAlive: 30 * time.Second}
	ch, err := newChain(opts, dialer)
	if err != nil {
		return nil, err
	}
	met, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register upstream metrics: %w", err)
	}
	f := &Fetcher{
		opts:    opts,
		log:     opts.Logger,
		remotes: map[string]*Remote{},
		fills:   newFillSet(opts.StagingDir),
		spill:   &spillBudget{limit: opts.SpillMemory, gauge: met.spillBytes},
		metrics: met,
		chain:   ch,
		peers:   newPeerTier(opts.Peers, opts.Timeout, opts.Chain != nil, opts.Clock),
		health:  newHealth(opts.Clock, opts.Logger, met),
	}
	if opts.TagTTL > 0 {
		// A plain LRU bounds the memory and starts no goroutine (golang-lru's expirable LRU
		// runs a cleanup goroutine that nothing stops); an entry's age is judged against
		// opts.Clock in TagFresh, and an expired one stays until it is confirmed again or is
		// the least recently confirmed past MaxFreshTags.
		var err error
		if f.fresh, err = lru.New[string, time.Time](MaxFreshTags); err != nil {
			return nil, fmt.Errorf("upstream: fresh-tag cache: %w", err)
		}
	}
	for _, reg := range regs {
		if err := f.addRemote(reg, dialer); err != nil {
			return nil, err
		}
	}
	f.fillCtx, f.abandon = context.WithCancel(context.WithoutCancel(ctx))
	return f, nil
}

// setDefaults fills in the defaults of the options left unset.
func (o *Options) setDefaults() {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.FillTimeout <= 0 {
		o.FillTimeout = DefaultFillTimeout
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Transport == nil {
		o.Transport = DefaultTransport(o.Timeout)
	}
	if o.InstanceID == "" {
		o.InstanceID = NewInstanceID()
	}
	if o.MaxUnknownBlobSize <= 0 {
		o.MaxUnknownBlobSize = DefaultMaxUnknownBlobSize
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.SpillWindow <= 0 {
		o.SpillWindow = DefaultSpillWindow
	}
	if o.SpillMemory <= 0 {
		o.SpillMemory = DefaultSpillMemory
	}
}

// newChain is the shared tier at opts.Chain (nil when none): its own guarded transport, with
// the shared tier's response header timeout.
func newChain(opts Options, dialer *net.Dialer) (*chain, error) {
	if opts.Chain == nil {
		return nil, nil
	}
	if opts.Chain.Scheme != "http" && opts.Chain.Scheme != "https" || opts.Chain.Host == "" {
		return nil, fmt.Errorf("upstream: chain URL %q: want http:// or https://HOST[:PORT]", opts.Chain)
	}
	base := opts.Transport
	if t, ok := base.(*http.Transport); ok {
		t = t.Clone()
		t.ResponseHeaderTimeout = SharedTierTimeout(opts.Timeout)
		base = t
	}
	base = newAddressGuard(opts.Chain, opts.AllowPrivate, opts.Resolver).guardTransport(base, dialer)
	ch := &chain{url: opts.Chain, base: base, breaker: &breaker{now: opts.Clock}, log: opts.Logger}
	if t, ok := base.(*http.Transport); ok {
		ch.own = t
	}
	return ch, nil
}

// addRemote adds the upstream reg, with its own guarded transport, and its metrics at 0.
func (f *Fetcher) addRemote(reg Registry, dialer *net.Dialer) error {
	opts := f.opts
	base, err := transportFor(reg, opts.Transport)
	if err != nil {
		return err
	}
	// Each upstream has its own guard and connection pool: its own address is its own, not
	// another upstream's.
	base = newAddressGuard(reg.URL, opts.AllowPrivate, opts.Resolver).guardTransport(base, dialer)
	if t, ok := base.(*http.Transport); ok {
		f.owned = append(f.owned, t)
	}
	c, err := newClient(reg, base, opts.Timeout, opts.UserAgent, opts.Clock, f.chain, opts.InstanceID)
	if err != nil {
		return err
	}
	c.onRefused = f.noteRefused
	c.peers = f.peers
	c.slots = make(chan struct{}, opts.Concurrency)
	c.onBusy = f.metrics.busy.WithLabelValues(reg.Name).Inc
	c.health = f.health
	f.remotes[reg.Name] = &Remote{Registry: reg, f: f, client: c}
	f.metrics.initUpstream(reg.Name, f.peers != nil)
	tiers := []string{TierUpstream}
	if f.chain != nil {
		tiers = append(tiers, TierShared)
	}
	if f.peers != nil {
		tiers = append(tiers, TierPeer)
	}
	f.health.add(reg.Name, tiers...)
	return nil
}

// transportFor is base with reg's RootCAs.
func transportFor(reg Registry, base http.RoundTripper) (http.RoundTripper, error) {
	t, err := upstreamauth.WithRootCAs(base, reg.RootCAs)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", reg.Name, err)
	}
	return t, nil
}

// noteRefused counts and logs a connection the address guard refused (TargetRefusedError).
func (f *Fetcher) noteRefused(upstream, op string, e *TargetRefusedError) {
	f.metrics.refusedTargets.WithLabelValues(upstream, e.Reason).Inc()
	ev := f.log.Warn().Str("upstream", upstream).Str("op", op).Str("target", e.Target).Str("reason", e.Reason)
	if e.Addr.IsValid() {
		ev = ev.Str("address", e.Addr.String())
	}
	ev.Msg("refused a connection the upstream's answer asked for")
}

// Remote returns the upstream called name, nil when none is configured.
func (f *Fetcher) Remote(name string) *Remote { return f.remotes[name] }

// InstanceID is Options.InstanceID after defaults.
func (f *Fetcher) InstanceID() string { return f.opts.InstanceID }

// Timeout is Options.Timeout after defaults.
func (f *Fetcher) Timeout() time.Duration { return f.opts.Timeout }

// FillTimeout is Options.FillTimeout after defaults.
func (f *Fetcher) FillTimeout() time.Duration { return f.opts.FillTimeout }

// StagingDir is Options.StagingDir.
func (f *Fetcher) StagingDir() string { return f.opts.StagingDir }

func tagKey(upstream, repo, tag string) string { return upstream + "/" + repo + ":" + tag }

// TagFresh reports whether repo:tag of upstream was confirmed upstream less than TagTTL ago.
func (f *Fetcher) TagFresh(upstream, repo, tag string) bool {
	if f.fresh == nil {
		return false
	}
	at, ok := f.fresh.Get(tagKey(upstream, repo, tag))
	return ok && f.opts.Clock().Sub(at) < f.opts.TagTTL
}

// MarkTagFresh records that repo:tag of upstream was confirmed upstream now (a no-op when
// TagTTL is 0).
func (f *Fetcher) MarkTagFresh(upstream, repo, tag string) {
	if f.fresh == nil {
		return
	}
	f.fresh.Add(tagKey(upstream, repo, tag), f.opts.Clock())
}

// WaitIdle blocks until no blob fill is in flight, or ctx ends.
func (f *Fetcher) WaitIdle(ctx context.Context) error { return f.fills.wait(ctx) }

// Drain lets fills in flight finish until ctx ends, then abandons the rest and waits for them
// to stop. It returns how many were abandoned.
func (f *Fetcher) Drain(ctx context.Context) int {
	if f.fills.wait(ctx) == nil {
		return 0
	}
	n := f.fills.count()
	f.abandon()
	_ = f.fills.wait(context.Background())
	return n
}

// Close abandons the fills in flight and waits until they stopped, and logs the upstream
// failures the rate-limited log has not told yet.
func (f *Fetcher) Close() error {
	f.abandon()
	err := f.fills.wait(context.Background())
	f.health.flush()
	if f.chain != nil && f.chain.own != nil {
		f.chain.own.CloseIdleConnections()
	}
	if f.peers != nil {
		f.peers.transport.CloseIdleConnections()
	}
	for _, t := range f.owned {
		t.CloseIdleConnections()
	}
	return err
}

// SharedTierTimeout is how long a node waits for a shared nodecache's response headers (--chain)
// when its upstream timeout is timeout: one and a half of them. A shared tier with the same
// timeout answers a tag within it, authentication included, and from its cache (stale) when its
// upstream did not answer in time; a node that gave up after one timeout would miss that answer
// at the same moment and go around the tier that exists for slow upstreams. With the direct
// attempt after it, a manifest exchange stays within 2.5 timeouts (25 s at the default), below
// containerd's 30 s wait for response headers.
func SharedTierTimeout(timeout time.Duration) time.Duration { return timeout + timeout/2 }

// exchangeTimeout bounds one upstream exchange (a tag, a blob HEAD, a tags/list page): the
// upstream timeout, plus SharedTierTimeout for the shared tier's attempt when there is one, plus
// a member's answer (PeerHeaderTimeout) and a probe with peers.
func (f *Fetcher) exchangeTimeout() time.Duration {
	t := f.opts.Timeout
	if f.chain != nil {
		t += SharedTierTimeout(f.opts.Timeout)
	}
	if f.peers != nil {
		t += PeerHeaderTimeout(f.opts.Timeout, f.peers.DialTimeout, f.chain != nil) + f.peers.probeTimeout
	}
	return t
}

// Remote is one configured upstream.
type Remote struct {
	Registry
	f      *Fetcher
	client *client
}
