package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// MaxManifestBytes bounds a manifest body read from an upstream (distribution's own limit).
const MaxManifestBytes = 4 << 20

// Error is an upstream answer other than success: its HTTP status (0 when no answer arrived)
// and, for 429, how long the upstream asked clients to wait.
type Error struct {
	Upstream   string
	Op         string
	Status     int
	RetryAfter string
	Err        error
}

// ErrUpstreamBusy marks a request that found every one of its upstream's concurrency slots
// (Options.Concurrency) taken for as long as the upstream timeout: an *Error of status 429,
// which is nodecache's answer, not the upstream's.
var ErrUpstreamBusy = errors.New("too many requests waiting for this upstream's answer")

func (e *Error) Error() string {
	if errors.Is(e.Err, ErrUpstreamBusy) {
		return fmt.Sprintf("upstream %s: %s: %v", e.Upstream, e.Op, e.Err)
	}
	if e.Status != 0 {
		return fmt.Sprintf("upstream %s: %s: HTTP %d", e.Upstream, e.Op, e.Status)
	}
	return fmt.Sprintf("upstream %s: %s: %v", e.Upstream, e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// NotFound reports an authoritative "does not exist" from the upstream.
func (e *Error) NotFound() bool { return e.Status == http.StatusNotFound }

// Unavailable reports an upstream that did not answer usefully: no answer, timeout, 429 or 5xx.
// A cached copy may then be served ("stale").
func (e *Error) Unavailable() bool {
	return e.Status == 0 || e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// client talks to one upstream registry. Authentication follows the registry's challenge
// (anonymous bearer tokens from the announced realm, as docker.io, ghcr.io, quay.io and
// registry.k8s.io require); redirects are followed (never from https to http), and credentials are only ever sent to the
// upstream host itself. Every connection to a host an answer named (a redirect, a token realm)
// passes the address guard of the Fetcher's transport (netguard.go).
type client struct {
	up        Registry
	reg       name.Registry
	base      http.RoundTripper
	timeout   time.Duration
	userAgent string
	now       func() time.Time
	repos     *lru.Cache[string, repoTransport] // repository -> authenticated transport; safe for concurrent use
	creds     *upstreamauth.Credentials         // nil: anonymous
	// chain, when set, is the shared tier tried before the upstream (--chain).
	chain *chain
	// peers, when set, are the members asked first for blobs and manifests by digest (--peers).
	peers *peerTier
	// instanceID names this nodecache in the Via entries it sends to shared nodecaches.
	instanceID string
	// nodecache is set once the upstream URL answered with mirrorapi.HeaderVersion.
	nodecache *atomic.Bool
	// onRefused, when set, is told of every connection the address guard refused.
	onRefused func(upstream, op string, e *TargetRefusedError)
	// slots holds one token per request waiting for its response headers (Options.Concurrency);
	// nil: unbounded. onBusy, when set, counts the requests that got none in time.
	slots  chan struct{}
	onBusy func()
	// health, when set, is told of the failures of a shared tier or a member that the next
	// tier then answered, and of the upstream's rate limit.
	health *health
}

type repoTransport struct {
	rt      http.RoundTripper
	created time.Time
	gen     uint64 // credentials generation it was built with
}

// repoTransportTTL bounds how long an authenticated transport is reused; a token refresh on 401
// happens inside it anyway, this only lets a changed challenge be seen again.
const repoTransportTTL = 30 * time.Minute

// maxRepoTransports bounds the transport cache per upstream; the least recently used
// repository's transport goes first (a miss only costs a ping and a token request).
const maxRepoTransports = 1024

func newClient(up Registry, base http.RoundTripper, timeout time.Duration, userAgent string, now func() time.Time, ch *chain, instanceID string) (*client, error) {
	opts := []name.Option{name.WeakValidation}
	if up.URL.Scheme == "http" {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(up.URL.Host, opts...)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: url host %q: %w", up.Name, up.URL.Host, err)
	}
	repos, err := lru.New[string, repoTransport](maxRepoTransports)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: transport cache: %w", up.Name, err)
	}
	seen := &atomic.Bool{}
	c := &client{}
	// The upstream's own manifest answers, 429s included, tell its rate limit.
	base = rateLimitRecorder{host: up.URL.Host, next: base, record: func(values []string) {
		if c.health != nil {
			c.health.rateLimit(up.Name, values)
		}
	}}
	base = redirectMark{next: noDowngrade{next: boundedPing{next: base}}}
	base = retryAfterRecorder{nodecacheDetector{name: up.Name, host: up.URL.Host, self: instanceID, seen: seen, next: base}}
	if up.Credentials != nil {
		base = upstreamauth.Guard(up.Name, up.URL, base)
	}
	if up.URL.Scheme == "http" {
		base = plainHTTPOnly{host: up.URL.Host, next: base}
	} else {
		base = tlsOnly{host: up.URL.Host, next: base}
	}
	*c = client{
		up: up, reg: reg, base: base, timeout: timeout, userAgent: userAgent,
		now: now, repos: repos, creds: up.Credentials,
		chain: ch, instanceID: instanceID, nodecache: seen,
	}
	return c, nil
}

// plainHTTPOnly refuses https requests to an http:// upstream's own host. go-containerregistry
// pings an insecure registry over https first and takes https when it answers, http only after
// (transport.Ping); the configured scheme is the contract, so the https attempt fails here, before
// any connection: no TLS handshake reaches a plain-HTTP upstream, and a host that also answers
// https elsewhere (port 443 of an "http://host" upstream) is never used in its place.
type plainHTTPOnly struct {
	host string
	next http.RoundTripper
}

func (t plainHTTPOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "https" && req.URL.Host == t.host {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("upstream is configured as http://%s: https is not used", t.host)
	}
	return t.next.RoundTrip(req)
}

// tlsOnly refuses plain-http requests to an https:// upstream's own host: the mirror image of
// plainHTTPOnly. go-containerregistry's ping also tries http for a registry it takes for local (a
// loopback or private IP address, localhost, *.localhost: name.Registry.Scheme), and when both
// fail reports the http attempt's answer — a TLS port's "400 Bad Request" — in place of the TLS
// failure (issue 25: an untrusted certificate must show as reason tls, its x509 text in the log).
// Refused here, before any connection, the http attempt adds only this error to the TLS one.
type tlsOnly struct {
	host string
	next http.RoundTripper
}

func (t tlsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && req.URL.Host == t.host {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("upstream is configured as https://%s: plain http is not used", t.host)
	}
	return t.next.RoundTrip(req)
}

type retryAfterKey struct{}

// trackRetryAfter returns a context whose upstream requests record a 429's Retry-After value,
// wherever in the exchange it came (ping, token, manifest, blob), for the returned getter: the
// answers of a token realm reach client.do only as an error without headers.
func trackRetryAfter(ctx context.Context) (context.Context, func() string) {
	var (
		mu sync.Mutex
		ra string
	)
	ctx = context.WithValue(ctx, retryAfterKey{}, func(v string) {
		mu.Lock()
		ra = v
		mu.Unlock()
	})
	return ctx, func() string {
		mu.Lock()
		defer mu.Unlock()
		return ra
	}
}

type retryAfterRecorder struct{ next http.RoundTripper }

func (t retryAfterRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			if record, ok := req.Context().Value(retryAfterKey{}).(func(string)); ok {
				record(ra)
			}
		}
	}
	return resp, err
}

// DefaultTransport returns the base transport to upstreams: every phase up to the response
// headers is bounded by timeout, so a black-holed upstream fails instead of hanging. It asks for
// no compression (DisableCompression): a body is stored and verified as the upstream sent it.
func DefaultTransport(timeout time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   16,
		ForceAttemptHTTP2:     true,
		DisableCompression:    true,
	}
}

// transport returns the authenticated transport for repo, creating it (a /v2/ ping and, for
// bearer challenges, a token request with pull scope) when missing, old, or built before the
// credentials file changed.
func (c *client) transport(ctx context.Context, repo string) (http.RoundTripper, error) {
	var (
		auth = authn.Anonymous
		gen  uint64
	)
	if c.creds != nil {
		auth, gen = c.creds, c.creds.Generation()
	}
	if t, ok := c.repos.Get(repo); ok && t.gen == gen && c.now().Sub(t.created) < repoTransportTTL {
		return t.rt, nil
	}

	pctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	base := transport.NewUserAgent(c.base, c.userAgent)
	scope := "repository:" + repo + ":pull"
	rt, err := transport.NewWithContext(pctx, c.reg, auth, base, []string{scope})
	if err != nil {
		return nil, c.classify("authenticate", err)
	}
	c.repos.Add(repo, repoTransport{rt: rt, created: c.now(), gen: gen})
	return rt, nil
}

// forget drops the cached transport of repo, so the next request authenticates again.
func (c *client) forget(repo string) {
	c.repos.Remove(repo)
}

// do sends method to /v2/<repo>/<kind>/<ref>: to the shared tier when one is configured and its
// breaker lets it (see sharedFailure for what sends the request on to the upstream), else to
// the upstream. The tier that answered is reported to the context's tier recorder (trackTier).
// Statuses other than the wanted ones become an *Error (a 429's with the Retry-After of
// whichever answer of the exchange carried one); the caller closes the returned body.
//
// The request holds one of the upstream's concurrency slots until its response headers arrived
// (see acquire).
func (c *client) do(ctx context.Context, method, repo, kind, ref string, hdr http.Header, want ...int) (*http.Response, error) {
	release, err := c.acquire(ctx, method+" "+repo+"/"+kind+"/"+ref)
	if err != nil {
		return nil, err
	}
	defer release()
	ctx, retryAfter := trackRetryAfter(ctx)
	resp, err := c.exchange(ctx, method, repo, kind, ref, hdr, want)
	var ue *Error
	if errors.As(err, &ue) && ue.Status == http.StatusTooManyRequests && ue.RetryAfter == "" {
		ue.RetryAfter = retryAfter()
	}
	return resp, err
}

// acquire takes one of the upstream's concurrency slots for the request op, waiting up to the
// upstream timeout (or ctx's deadline, when sooner) for one, and returns its release.
//
// Errors: an *Error of status 429 wrapping ErrUpstreamBusy, with a Retry-After of the timeout
// in seconds, when no slot came free in time (issue 23: the wait is bounded, and the client is
// told to come back rather than that the upstream failed); an *Error wrapping ctx's error when
// ctx was cancelled.
func (c *client) acquire(ctx context.Context, op string) (release func(), err error) {
	if c.slots == nil {
		return func() {}, nil
	}
	release = func() { <-c.slots }
	select {
	case c.slots <- struct{}{}:
		return release, nil
	default:
	}
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	select {
	case c.slots <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, &Error{Upstream: c.up.Name, Op: op, Err: ctx.Err()}
		}
	case <-timer.C:
	}
	if c.onBusy != nil {
		c.onBusy()
	}
	return nil, &Error{Upstream: c.up.Name, Op: op, Status: http.StatusTooManyRequests,
		RetryAfter: strconv.Itoa(int(math.Ceil(c.timeout.Seconds()))),
		Err: fmt.Errorf("%w: all %d slots (--upstream-concurrency) stayed taken by requests waiting for its response headers for %s",
			ErrUpstreamBusy, cap(c.slots), clitext.Span(c.timeout))}
}

// exchange is do's request, to the shared tier or the upstream.
func (c *client) exchange(ctx context.Context, method, repo, kind, ref string, hdr http.Header, want []int) (*http.Response, error) {
	op := fmt.Sprintf("%s %s/%s/%s", method, repo, kind, ref)
	if c.peers != nil {
		if d, ok := peerDigest(kind, ref); ok {
			if resp, err, done := c.doPeers(ctx, op, method, repo, kind, d, hdr, want); done {
				return resp, err
			}
		}
	}
	if c.chain != nil {
		if shared, probe := c.chain.breaker.allow(); shared {
			resp, err := c.doShared(ctx, op, method, repo, kind, ref, hdr, want)
			failed := sharedFailure(ctx, err)
			if c.chain.breaker.done(probe, failed) {
				c.chain.log.Warn().Err(err).Str("shared", c.chain.url.Host).Str("for", clitext.Span(BreakerOpen)).
					Msg("shared tier failing: pulling from the upstreams directly")
			}
			if !failed {
				reportTier(ctx, TierShared)
				return resp, err
			}
			c.noteFailure(TierShared, err)
		}
	}
	reportTier(ctx, c.directTier())
	return c.doDirect(ctx, op, method, repo, kind, ref, hdr, want)
}

// noteFailure tells health of a failure of tier that the next tier answers in its place.
func (c *client) noteFailure(tier string, err error) {
	if c.health != nil {
		c.health.record(c.up.Name, tier, err)
	}
}

// directTier is the tier of the upstream URL: shared when it announced itself as a nodecache.
func (c *client) directTier() string {
	if c.nodecache.Load() {
		return TierShared
	}
	return TierUpstream
}

// doDirect sends the request of do to the upstream URL, authenticated.
func (c *client) doDirect(ctx context.Context, op, method, repo, kind, ref string, hdr http.Header, want []int) (*http.Response, error) {
	rt, err := c.transport(ctx, repo)
	if err != nil {
		return nil, err
	}
	u := *c.up.URL
	ref, u.RawQuery, _ = strings.Cut(ref, "?")
	u.Path = "/v2/" + repo + "/" + kind + "/" + ref
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	hc := &http.Client{Transport: rt}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, c.classify(op, err)
	}
	for _, w := range want {
		if resp.StatusCode == w {
			return resp, nil
		}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		c.forget(repo)
	}
	return nil, &Error{
		Upstream: c.up.Name, Op: op, Status: resp.StatusCode,
		RetryAfter: resp.Header.Get("Retry-After"),
	}
}

func (c *client) classify(op string, err error) error {
	// http.Client's errors name the URL: an upstream's redirect may carry a signed query (a CDN
	// credential) that clients and logs must not see.
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			ue.URL = redactedURL(u)
		}
	}
	var refused *TargetRefusedError
	if errors.As(err, &refused) && c.onRefused != nil {
		c.onRefused(c.up.Name, op, refused)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return &Error{Upstream: c.up.Name, Op: op, Status: te.StatusCode, Err: err}
	}
	return &Error{Upstream: c.up.Name, Op: op, Err: err}
}
