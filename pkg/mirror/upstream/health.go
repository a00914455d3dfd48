package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Reasons of an upstream failure: the reason label of nodecache_upstream_failures_total and
// mirrorapi.UpstreamFailure.Reason (issue 25). An upstream's 404 (an answer to the client's
// question), a schema 1 manifest (the image's fault), a request that found every concurrency
// slot taken (nodecache_upstream_busy_total) and an exchange nodecache abandoned are not
// failures.
const (
	// FailDNS: the upstream's host name did not resolve.
	FailDNS = "dns"
	// FailConnect: no connection (refused, unreachable, reset), or one that broke.
	FailConnect = "connect"
	// FailTLS: the TLS handshake failed: a certificate not trusted (x509), for another name or
	// expired, or a TLS alert.
	FailTLS = "tls"
	// FailTimeout: no answer within the upstream timeout, or a blob stream that stalled.
	FailTimeout = "timeout"
	// FailHTTP401 and the following: the upstream (or its token realm) answered that status.
	FailHTTP401 = "http_401"
	FailHTTP403 = "http_403"
	FailHTTP429 = "http_429"
	FailHTTP5xx = "http_5xx"
	// FailRedirectHost: a host the upstream redirected to (a CDN) could not be reached (it did
	// not resolve, refused, timed out or failed TLS). It wins over dns, connect, tls and
	// timeout when the failure is on the redirect.
	FailRedirectHost = "redirect_host"
	// FailTooLarge and the following are the upstream's answers nodecache refuses (502 to the
	// client): a manifest over 4 MiB, a blob of unstated size past --max-unknown-blob-size or a
	// tag list past its bounds; a manifest that is not one; bytes that do not match their
	// digest (the same events as nodecache_digest_mismatches_total); a blob body that keeps
	// ending before its stated length; a 206 for another range; a redirect or token realm the
	// address guard refused (nodecache_upstream_refused_targets_total says why).
	FailTooLarge       = "too_large"
	FailNotManifest    = "not_manifest"
	FailDigestMismatch = "digest_mismatch"
	FailShortBody      = "short_body"
	FailBadRange       = "bad_range"
	FailRefusedTarget  = "refused_target"
	// FailOther: any other failure (another HTTP status, a body that does not decode).
	FailOther = "other"
)

// FailureReasons are the reasons in the order the docs list them.
func FailureReasons() []string {
	return []string{FailDNS, FailConnect, FailTLS, FailTimeout, FailHTTP401, FailHTTP403, FailHTTP429, FailHTTP5xx,
		FailRedirectHost, FailTooLarge, FailNotManifest, FailDigestMismatch, FailShortBody, FailBadRange, FailRefusedTarget, FailOther}
}

// HealthLogEvery is how often at most the log says that one upstream fails for one reason: the
// first failure is logged at once, later ones once this long passed since the previous line,
// with the count since it (and at Close, what was not logged yet).
const HealthLogEvery = time.Minute

// maxCause bounds the cause text kept of a failure (bytes).
const maxCause = 1 << 10

// errLocal marks a fill's failure on this node (its staging file), not the upstream's.
var errLocal = errors.New("local staging file")

// localError is a failure on this node during a fill (its staging file): it reads as its
// error and matches errLocal.
type localError struct{ error }

func (e localError) Unwrap() error      { return e.error }
func (localError) Is(target error) bool { return target == errLocal }

// errStalled marks a blob stream that stopped moving for the upstream timeout.
var errStalled = errors.New("stalled")

// redirectError is a request to a host an upstream redirected to that got no answer.
type redirectError struct {
	host string
	err  error
}

func (e *redirectError) Error() string { return "redirect target " + e.host + ": " + e.err.Error() }
func (e *redirectError) Unwrap() error { return e.err }

// redirectMark marks the transport errors of redirected requests (http.Client sets
// Request.Response on the request a redirect creates) with redirectError.
type redirectMark struct{ next http.RoundTripper }

func (t redirectMark) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil && req.Response != nil {
		return nil, &redirectError{host: req.URL.Host, err: err}
	}
	return resp, err
}

// FailureReason is the reason err is counted under (see the Fail* constants), "" when err is not
// an upstream failure.
func FailureReason(err error) string {
	var (
		ue *Error
		re *redirectError
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, errStalled):
		return FailTimeout
	case errors.Is(err, ErrUpstreamBusy), errors.Is(err, ErrSchema1), errors.Is(err, errLocal), errors.Is(err, errSpillNoWindow),
		errors.Is(err, context.Canceled), errors.As(err, &ue) && ue.NotFound():
		return ""
	case errors.Is(err, ErrDigestMismatch):
		return FailDigestMismatch
	case errors.Is(err, ErrManifestTooLarge), errors.Is(err, ErrUnknownSizeTooLarge), errors.Is(err, ErrTagListTooLarge),
		errors.Is(err, ErrReferrersTooLarge):
		return FailTooLarge
	case errors.Is(err, ErrNotManifest):
		return FailNotManifest
	case errors.Is(err, ErrShortBody):
		return FailShortBody
	case errors.Is(err, ErrBadRange):
		return FailBadRange
	case errors.Is(err, ErrUnsafeTarget):
		return FailRefusedTarget
	case errors.As(err, &re):
		return FailRedirectHost
	case errors.As(err, &ue) && ue.Status != 0:
		return statusReason(ue.Status)
	}
	return transportReason(err)
}

// statusReason is the reason of an upstream's error status.
func statusReason(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return FailHTTP401
	case status == http.StatusForbidden:
		return FailHTTP403
	case status == http.StatusTooManyRequests:
		return FailHTTP429
	case status >= 500 && status != http.StatusLoopDetected:
		return FailHTTP5xx
	}
	return FailOther
}

// transportReason is the reason of a failure without an answer.
func transportReason(err error) string {
	var (
		dns     *net.DNSError
		verify  *tls.CertificateVerificationError
		record  tls.RecordHeaderError
		alert   tls.AlertError
		netErr  net.Error
		opErr   *net.OpError
		earlyEO = errors.Is(err, errEarlyEnd)
	)
	switch {
	case errors.As(err, &dns):
		return FailDNS
	case errors.As(err, &verify), errors.As(err, &record), errors.As(err, &alert):
		return FailTLS
	case isTimeout(err):
		return FailTimeout
	case errors.As(err, &opErr), errors.As(err, &netErr), earlyEO, isBrokenStream(err):
		return FailConnect
	}
	return FailOther
}

// isBrokenStream reports a connection that ended mid-answer.
func isBrokenStream(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// tierID names one tier of one upstream.
type tierID struct{ upstream, tier string }

// tierState is what health keeps of one tier of one upstream.
type tierState struct {
	failures    map[string]int64
	last        *mirrorapi.UpstreamFailure
	lastSuccess time.Time
	// failSeq and okSeq order the last failure and the last success (health.seq), which a
	// clock that stands still or goes back cannot.
	failSeq, okSeq uint64
}

// lineKey names one log line's subject: an upstream and a reason.
type lineKey struct{ upstream, reason string }

// lineState is the rate limit of one log line: when it was last written, and the failures
// since (the latest one's tier and cause).
type lineState struct {
	logged      time.Time
	count       int64
	tier, cause string
}

// health keeps what the upstreams' exchanges said (issue 25): failures by upstream, tier and
// reason, the last success, the rate limit an upstream announced; it feeds the metrics, the log
// (rate-limited by HealthLogEvery on the injected clock, without a goroutine) and the document
// of mirrorapi.UpstreamsPath. Its methods are safe for concurrent use.
type health struct {
	now func() time.Time
	log zerolog.Logger
	m   *metrics

	mu        sync.Mutex
	seq       uint64
	upstreams []string // configured, sorted
	tiers     map[tierID]*tierState
	lines     map[lineKey]*lineState
	limits    map[string]mirrorapi.RateLimit
}

func newHealth(now func() time.Time, log zerolog.Logger, m *metrics) *health {
	return &health{now: now, log: log, m: m, tiers: map[tierID]*tierState{}, lines: map[lineKey]*lineState{}, limits: map[string]mirrorapi.RateLimit{}}
}

// add lists upstream, and puts its failure series of tiers on /metrics at 0, so that an alert on
// their increase sees the first failure.
func (h *health) add(upstream string, tiers ...string) {
	h.mu.Lock()
	h.upstreams = append(h.upstreams, upstream)
	sort.Strings(h.upstreams)
	h.mu.Unlock()
	for _, tier := range tiers {
		for _, r := range FailureReasons() {
			h.m.failures.WithLabelValues(upstream, tier, r)
		}
	}
}

func (h *health) tier(upstream, tier string) *tierState {
	k := tierID{upstream, tier}
	s := h.tiers[k]
	if s == nil {
		s = &tierState{failures: map[string]int64{}}
		h.tiers[k] = s
	}
	return s
}

// record notes the end of one exchange with upstream at tier: a success (err nil), a failure
// (counted, kept and logged), or neither (FailureReason "").
func (h *health) record(upstream, tier string, err error) {
	if err == nil {
		h.success(upstream, tier)
		return
	}
	if reason := FailureReason(err); reason != "" {
		h.fail(upstream, tier, reason, err)
	}
}

func (h *health) success(upstream, tier string) {
	now := h.now()
	h.mu.Lock()
	s := h.tier(upstream, tier)
	h.seq++
	s.okSeq, s.lastSuccess = h.seq, now
	h.mu.Unlock()
	h.m.lastSuccess.WithLabelValues(upstream, tier).Set(float64(now.UnixNano()) / 1e9)
}

// fail counts and keeps one failure, and logs it unless a line for upstream and reason went out
// less than HealthLogEvery ago (then the next line carries it in its count).
func (h *health) fail(upstream, tier, reason string, err error) {
	now := h.now()
	cause := err.Error()
	if len(cause) > maxCause {
		cause = cause[:maxCause]
	}
	h.mu.Lock()
	s := h.tier(upstream, tier)
	h.seq++
	s.failSeq = h.seq
	s.failures[reason]++
	s.last = &mirrorapi.UpstreamFailure{Time: now, Reason: reason, Cause: cause}
	l := h.lines[lineKey{upstream, reason}]
	if l == nil {
		l = &lineState{}
		h.lines[lineKey{upstream, reason}] = l
	}
	l.count++
	l.tier, l.cause = tier, cause
	emit := l.logged.IsZero() || now.Sub(l.logged) >= HealthLogEvery || now.Before(l.logged)
	var line lineState
	if emit {
		line = *l
		l.logged, l.count = now, 0
	}
	h.mu.Unlock()
	h.m.failures.WithLabelValues(upstream, tier, reason).Inc()
	if emit {
		h.write(upstream, reason, line)
	}
}

// write logs one line: the failures of upstream for reason since the line before it (at
// l.logged; none before the first).
func (h *health) write(upstream, reason string, l lineState) {
	ev := h.log.Warn().Str("upstream", upstream).Str("tier", l.tier).Str("reason", reason).Int64("count", l.count).Str("cause", l.cause)
	if !l.logged.IsZero() {
		ev = ev.Time("since", l.logged)
	}
	ev.Msg("upstream failures")
}

// flush logs the failures no line has told yet (at Close).
func (h *health) flush() {
	h.mu.Lock()
	type pending struct {
		k lineKey
		l lineState
	}
	var out []pending
	for k, l := range h.lines {
		if l.count > 0 {
			out = append(out, pending{k, *l})
			l.count = 0
		}
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b pending) int {
		if c := strings.Compare(a.k.upstream, b.k.upstream); c != 0 {
			return c
		}
		return strings.Compare(a.k.reason, b.k.reason)
	})
	for _, p := range out {
		h.write(p.k.upstream, p.k.reason, p.l)
	}
}

// HeaderRateLimitRemaining is Docker Hub's rate limit header on manifest answers
// (https://docs.docker.com/docker-hub/usage/pulls/): "N;w=SECONDS", N pulls left in a window
// of SECONDS seconds; absent for accounts without a limit.
const HeaderRateLimitRemaining = "RateLimit-Remaining"

// rateLimitValue is the header's value, strictly: digits, ";w=", digits.
var rateLimitValue = regexp.MustCompile(`^([0-9]{1,18});w=([0-9]{1,18})$`)

// ParseRateLimit reads a ratelimit-remaining value ("76;w=21600"): the pulls remaining and the
// window in seconds; ok is false for anything else (spaces, signs, other parameters, a window
// of 0).
func ParseRateLimit(v string) (remaining, window int64, ok bool) {
	m := rateLimitValue.FindStringSubmatch(v)
	if m == nil {
		return 0, 0, false
	}
	remaining, err1 := strconv.ParseInt(m[1], 10, 64)
	window, err2 := strconv.ParseInt(m[2], 10, 64)
	if err1 != nil || err2 != nil || window == 0 {
		return 0, 0, false
	}
	return remaining, window, true
}

// rateLimit notes the ratelimit-remaining values of one manifest answer of upstream: none
// removes the gauge's series (the upstream announces no limit), one that parses sets it,
// anything else (malformed, repeated) is ignored.
func (h *health) rateLimit(upstream string, values []string) {
	if len(values) == 0 {
		h.mu.Lock()
		delete(h.limits, upstream)
		h.mu.Unlock()
		h.m.rateLimit.DeleteLabelValues(upstream)
		return
	}
	if len(values) != 1 {
		return
	}
	n, w, ok := ParseRateLimit(values[0])
	if !ok {
		return
	}
	h.mu.Lock()
	h.limits[upstream] = mirrorapi.RateLimit{Remaining: n, WindowSeconds: w, At: h.now()}
	h.mu.Unlock()
	h.m.rateLimit.WithLabelValues(upstream).Set(float64(n))
}

// rateLimitRecorder hands the ratelimit-remaining values of the upstream's own manifest answers
// (requests to host, of /v2/<repo>/manifests/<ref>) to record.
type rateLimitRecorder struct {
	host   string
	record func(values []string)
	next   http.RoundTripper
}

var manifestPath = regexp.MustCompile(`^/v2/.+/manifests/[^/]+$`)

func (t rateLimitRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && req.URL.Host == t.host && manifestPath.MatchString(req.URL.Path) {
		t.record(resp.Header.Values(HeaderRateLimitRemaining))
	}
	return resp, err
}

// tierOrder is the order of tiers in the document.
var tierOrder = []string{TierUpstream, TierShared, TierPeer}

// document is what health knows, as mirrorapi.Upstreams.
func (h *health) document() mirrorapi.Upstreams {
	h.mu.Lock()
	defer h.mu.Unlock()
	doc := mirrorapi.Upstreams{Now: h.now(), Upstreams: []mirrorapi.UpstreamHealth{}}
	for _, name := range h.upstreams {
		u := mirrorapi.UpstreamHealth{Name: name, Tiers: []mirrorapi.TierHealth{}}
		if rl, ok := h.limits[name]; ok {
			u.RateLimit = &rl
		}
		for _, tier := range tierOrder {
			s := h.tiers[tierID{name, tier}]
			if s == nil {
				continue
			}
			th := mirrorapi.TierHealth{Tier: tier, Failures: map[string]int64{}, LastSuccess: s.lastSuccess, Failing: s.failSeq > s.okSeq}
			for r, n := range s.failures {
				th.Failures[r] = n
			}
			if s.last != nil {
				f := *s.last
				th.LastFailure = &f
			}
			u.Tiers = append(u.Tiers, th)
		}
		doc.Upstreams = append(doc.Upstreams, u)
	}
	return doc
}

// Health returns what the upstreams' exchanges said since New (mirrorapi.UpstreamsPath).
func (f *Fetcher) Health() mirrorapi.Upstreams { return f.health.document() }
