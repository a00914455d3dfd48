package upstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Tiers in the metrics' and the access log's tier label: where an upstream answer came from.
const (
	// TierShared is a shared nodecache (--chain, or an upstream URL that announced itself with
	// mirrorapi.HeaderVersion).
	TierShared = "shared"
	// TierUpstream is the upstream registry itself.
	TierUpstream = "upstream"
)

// Breaker tuning for the shared tier (--chain): after BreakerFailures failures in a row
// (no answer, a timeout or a 5xx other than 508), requests go to the upstreams directly for
// BreakerOpen; then one request probes the shared tier again while the others still go direct.
const (
	BreakerFailures = 3
	BreakerOpen     = 30 * time.Second
)

// MaxHops is how many nodecaches a request may already have passed (Via entries) to be served:
// a request with more gets 508 (mirrorapi.ViaProduct).
const MaxHops = 4

// ErrLoop marks a request refused because it went round in a loop of chained caches: it already
// carries this instance's id in its Via header, or more than MaxHops nodecache entries.
var ErrLoop = errors.New("request loop between chained nodecaches")

// NewInstanceID returns a random id for Options.InstanceID: 16 lower-case hex digits.
func NewInstanceID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ViaIDs returns the instance ids of the nodecache entries ("1.1 nodecache/<id>") of the Via
// header values, in order; other entries are skipped.
func ViaIDs(values []string) []string {
	var ids []string
	for _, v := range values {
		for _, e := range strings.Split(v, ",") {
			f := strings.Fields(e)
			if len(f) < 2 {
				continue
			}
			if id, ok := strings.CutPrefix(f[1], mirrorapi.ViaProduct+"/"); ok && id != "" {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// CheckLoop refuses a request whose Via ids (ViaIDs) contain self or number more than MaxHops.
//
// Errors: ErrLoop, naming the hops.
func CheckLoop(ids []string, self string) error {
	for _, id := range ids {
		if id == self {
			return fmt.Errorf("%w: this nodecache (%s) is already among the hops %s", ErrLoop, self, strings.Join(ids, ", "))
		}
	}
	if len(ids) > MaxHops {
		return fmt.Errorf("%w: %d nodecache hops (%s), at most %d", ErrLoop, len(ids), strings.Join(ids, ", "), MaxHops)
	}
	return nil
}

type viaKey struct{}

// WithVia returns a context whose requests to a shared nodecache carry the hops ids (the Via
// entries of the client's request) before this instance's own entry.
func WithVia(ctx context.Context, ids []string) context.Context {
	return context.WithValue(ctx, viaKey{}, ids)
}

func viaFrom(ctx context.Context) []string {
	ids, _ := ctx.Value(viaKey{}).([]string)
	return ids
}

// viaHeader is the Via value of a request this instance (self) sends to a shared nodecache.
func viaHeader(ctx context.Context, self string) string {
	var parts []string
	for _, id := range viaFrom(ctx) {
		parts = append(parts, "1.1 "+mirrorapi.ViaProduct+"/"+id)
	}
	return strings.Join(append(parts, "1.1 "+mirrorapi.ViaProduct+"/"+self), ", ")
}

type tierKey struct{}

// withTier returns a context whose upstream requests report the tier that answered (TierShared
// or TierUpstream) to record.
func withTier(ctx context.Context, record func(tier string)) context.Context {
	return context.WithValue(ctx, tierKey{}, record)
}

// trackTier returns a context that also records the tier for the returned getter (TierUpstream
// until a request reported one), for the metrics of one exchange.
func trackTier(ctx context.Context) (context.Context, func() string) {
	var (
		mu   sync.Mutex
		tier string
	)
	parent, _ := ctx.Value(tierKey{}).(func(string))
	ctx = withTier(ctx, func(t string) {
		mu.Lock()
		tier = t
		mu.Unlock()
		if parent != nil {
			parent(t)
		}
	})
	return ctx, func() string {
		mu.Lock()
		defer mu.Unlock()
		if tier == "" {
			return TierUpstream
		}
		return tier
	}
}

func reportTier(ctx context.Context, tier string) {
	if record, ok := ctx.Value(tierKey{}).(func(string)); ok {
		record(tier)
	}
}

// breaker decides whether a request goes to the shared tier: closed (shared) until
// BreakerFailures failures in a row, then open (direct) for BreakerOpen, then half-open: one
// probe to the shared tier, whose result closes or opens it again.
type breaker struct {
	now      func() time.Time
	mu       sync.Mutex
	failures int
	until    time.Time // open until then
	probing  bool
}

// allow reports whether this request goes to the shared tier, and whether it is the probe.
func (b *breaker) allow() (shared, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < BreakerFailures {
		return true, false
	}
	if b.probing || b.now().Before(b.until) {
		return false, false
	}
	b.probing = true
	return true, true
}

// done records the result of a request to the shared tier; failed: no answer, a timeout or a
// 5xx (not 508).
func (b *breaker) done(probe, failed bool) (opened bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	if !failed {
		b.failures = 0
		return false
	}
	b.failures++
	if b.failures >= BreakerFailures && (probe || b.failures == BreakerFailures) {
		b.until = b.now().Add(BreakerOpen)
		return true
	}
	return false
}

// chain is the shared tier all upstreams are reached through (Options.Chain).
type chain struct {
	url  *url.URL
	base http.RoundTripper
	// own is base when New made it (Options.Transport with SharedTierTimeout for headers), to
	// be closed with the Fetcher; nil when base is Options.Transport itself.
	own     *http.Transport
	breaker *breaker
	log     zerolog.Logger
}

// sharedFailure reports whether err from the shared tier counts against it (and sends the
// request to the upstream directly): no answer (connect error, timeout) or a 5xx other than
// 508. 404, 401, 403, 429 and 508 are answers, passed on as they are.
func sharedFailure(ctx context.Context, err error) bool {
	var ue *Error
	if err == nil || ctx.Err() != nil || !errors.As(err, &ue) {
		return false
	}
	return ue.Status == 0 || (ue.Status >= 500 && ue.Status != http.StatusLoopDetected)
}

// doShared sends the request of do to the shared tier: /v2/<repo>/<kind>/<ref>?ns=<name>, with
// this instance's Via entry, anonymous (credentials apply to direct fetches only), following no
// redirect.
func (c *client) doShared(ctx context.Context, op, method, repo, kind, ref string, hdr http.Header, want []int) (*http.Response, error) {
	u := *c.chain.url
	ref, query, _ := strings.Cut(ref, "?")
	q, _ := url.ParseQuery(query)
	q.Set("ns", c.up.Name)
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v2/" + repo + "/" + kind + "/" + ref
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", c.userAgent)
	req.Header.Set("Via", viaHeader(ctx, c.instanceID))
	hc := &http.Client{Transport: c.chain.base, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, &Error{Upstream: c.up.Name, Op: op + " (shared tier " + c.chain.url.Host + ")", Err: err}
	}
	for _, w := range want {
		if resp.StatusCode == w {
			return resp, nil
		}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	return nil, &Error{Upstream: c.up.Name, Op: op + " (shared tier " + c.chain.url.Host + ")", Status: resp.StatusCode,
		RetryAfter: resp.Header.Get("Retry-After")}
}

// nodecacheDetector watches the upstream's answers: once one carries mirrorapi.HeaderVersion the
// upstream URL is a nodecache, and later requests to its host carry ?ns=<name> and this
// instance's Via entry (checked lazily: nothing is asked at start).
type nodecacheDetector struct {
	name, host, self string
	seen             *atomic.Bool
	next             http.RoundTripper
}

func (d nodecacheDetector) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case d.seen.Load() && req.URL.Host == d.host:
		req = req.Clone(req.Context())
		q := req.URL.Query()
		if q.Get("ns") == "" {
			q.Set("ns", d.name)
			req.URL.RawQuery = q.Encode()
		}
		req.Header.Set("Via", viaHeader(req.Context(), d.self))
	case req.Response != nil || req.URL.Host != d.host:
		// A redirect, or a host an answer named (a token realm): it may lead back into this
		// nodecache (or another), whose loop check (CheckLoop) then answers 508 instead of
		// recursing for as long as the upstream keeps redirecting.
		req = req.Clone(req.Context())
		req.Header.Set("Via", viaHeader(req.Context(), d.self))
	}
	resp, err := d.next.RoundTrip(req)
	if err == nil && req.URL.Host == d.host && resp.Header.Get(mirrorapi.HeaderVersion) != "" {
		d.seen.Store(true)
	}
	return resp, err
}
