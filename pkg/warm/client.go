package warm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Routing says how a request names the upstream registry to the mirror.
type Routing string

const (
	// RoutingNS adds ?ns=<registry> to every request, as containerd does for a mirror:
	// GET /v2/<repository>/manifests/<ref>?ns=<registry>.
	RoutingNS Routing = "ns"
	// RoutingPath puts the registry first in the repository path, as CRI-O does with a mirror
	// location "host:port/<registry>": GET /v2/<registry>/<repository>/manifests/<ref>.
	RoutingPath Routing = "path"
	// routingDirect talks to an upstream registry itself (warm --to): GET
	// /v2/<repository>/manifests/<ref>, nothing added.
	routingDirect Routing = "direct"
)

// ParseRouting accepts "ns" or "path"; "" means RoutingNS.
func ParseRouting(s string) (Routing, error) {
	switch Routing(s) {
	case "", RoutingNS:
		return RoutingNS, nil
	case RoutingPath:
		return RoutingPath, nil
	}
	return "", refusal.Value("--routing", s, "want ns or path")
}

// client talks to the mirror, and only to it; with warm --to, one client talks to one upstream
// registry (routingDirect, auth set).
type client struct {
	base      *url.URL
	routing   Routing
	hc        *http.Client
	auth      *upstreamAuth // per-repository token transports of an upstream; nil for a mirror
	upstream  string        // the upstream's NAME (warm --to); "" for a mirror
	privateCA bool          // --upstream-ca was given for the upstream
	userAgent string
	retries   int
	backoff   time.Duration
	maxDelay  time.Duration
	log       zerolog.Logger
	// mirrorVersion is the mirrorapi.HeaderVersion of the mirror's GET /v2/ answer (waitForMirror):
	// "" when the mirror is not a nodecache serve.
	mirrorVersion string
}

// endpoint returns the mirror URL for kind ("manifests" or "blobs") and id (tag or digest) of
// ref's repository, routed by c.routing.
func (c *client) endpoint(ref Reference, kind, id string) string {
	u := *c.base
	switch c.routing {
	case routingDirect:
		u.Path = "/v2/" + ref.Repository + "/" + kind + "/" + id
	case RoutingPath:
		u.Path = "/v2/" + ref.Registry + "/" + ref.Repository + "/" + kind + "/" + id
	default:
		u.Path = "/v2/" + ref.Repository + "/" + kind + "/" + id
		u.RawQuery = url.Values{"ns": {ref.Registry}}.Encode()
	}
	return u.String()
}

// newRequest builds a GET that carries the warm User-Agent.
func (c *client) newRequest(ctx context.Context, target string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, fmt.Errorf("build request %s: %w", target, err)
	}
	req.Header.Set("User-Agent", c.userAgent)
	return req, nil
}

// do sends req for ref's repository: through c.hc, or, to an upstream, through the
// repository's authenticated transport (created on first use: a /v2/ ping and a token request).
func (c *client) do(req *http.Request, ref Reference) (*http.Response, error) {
	if c.auth == nil {
		return c.hc.Do(req)
	}
	rt, err := c.auth.transport(req.Context(), ref.Repository)
	if err != nil {
		return nil, err
	}
	hc := *c.hc
	hc.Transport = rt
	return hc.Do(req)
}

// explain adds to err, a failed request of warm --to, what fixes it: --upstream-auth when the
// upstream answered 401 or 403 to a client without its credentials (and that it refused them,
// with them), --upstream-ca when its certificate is signed by an authority not trusted (or not
// by the one given), the http:// URL when it answered https with plain http. Other errors, and
// every error of a mirror's client, are returned as they are.
func (c *client) explain(err error) error {
	if c.upstream == "" || err == nil {
		return err
	}
	var se *statusError
	var unknownCA x509.UnknownAuthorityError
	denied := errors.As(err, &se) && (se.Status == http.StatusUnauthorized || se.Status == http.StatusForbidden)
	switch {
	case denied && c.auth.creds == authn.Anonymous:
		return fmt.Errorf("%w (asked anonymously: give the credentials with --upstream-auth %s=FILE, a docker config.json)", err, c.upstream)
	case denied:
		return fmt.Errorf("%w (the --upstream-auth credentials for %s were refused: check them, and that they may pull this repository)", err, c.upstream)
	case errors.As(err, &unknownCA) && c.privateCA:
		return fmt.Errorf("%w (the --upstream-ca given for %s did not sign the certificate it presented)", err, c.upstream)
	case errors.As(err, &unknownCA):
		return fmt.Errorf("%w (trust its certificate authority with --upstream-ca %s=FILE, PEM)", err, c.upstream)
	case errors.Is(err, http.ErrSchemeMismatch):
		return fmt.Errorf("%w (it speaks plain http: give --upstream %s=http://%s)", err, c.upstream, c.base.Host)
	}
	return err
}

// statusError is a response the mirror answered with a status that is not a success.
type statusError struct {
	// Method is the request's method; "" means GET.
	Method     string
	URL        string
	Status     int
	Body       string        // the start of the body (OCI error JSON, usually)
	RetryAfter time.Duration // from Retry-After, 0 when absent
	// WrongAnswer: a nodecache's 502 (it names its error code, mirrorapi.HeaderErrorCode): the
	// upstream's answer was wrong (bytes not matching their digest, a manifest over 4 MiB, a
	// refused redirect), which another attempt does not fix, unlike a failing upstream's 503.
	WrongAnswer bool
}

func (e *statusError) Error() string {
	method := e.Method
	if method == "" {
		method = http.MethodGet
	}
	msg := fmt.Sprintf("%s %s: %d %s", method, e.URL, e.Status, http.StatusText(e.Status))
	if b := strings.TrimSpace(e.Body); b != "" {
		msg += ": " + b
	}
	return msg
}

// newStatusError reads up to 512 bytes of body for the message and closes it.
func newStatusError(resp *http.Response) *statusError {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_ = resp.Body.Close()
	return &statusError{
		URL: resp.Request.URL.String(), Status: resp.StatusCode, Body: string(b),
		RetryAfter:  parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
		WrongAnswer: resp.StatusCode == http.StatusBadGateway && resp.Header.Get(mirrorapi.HeaderErrorCode) != "",
	}
}

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP date (RFC 9110 section 10.2.3).
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// errBrokenStream marks a body that ended early or failed mid-way; it is retried.
var errBrokenStream = errors.New("broken stream")

// retryable reports whether err is worth another attempt while parent is still live: 5xx (but a
// nodecache's 502 for an upstream's wrong answer), 429, 408, network errors, broken streams and
// per-attempt timeouts; not a certificate that is not trusted, nor an https request answered in
// plain http (tlsRefused), which the next attempt meets again.
func retryable(parent context.Context, err error) bool {
	if err == nil || parent.Err() != nil {
		return false
	}
	var se *statusError
	if errors.As(err, &se) {
		return (se.Status >= 500 && !se.WrongAnswer) || se.Status == http.StatusTooManyRequests || se.Status == http.StatusRequestTimeout
	}
	var pe *permanentError
	return !errors.As(err, &pe) && !tlsRefused(err)
}

// tlsRefused reports whether err is a TLS failure another attempt cannot fix: a certificate not
// trusted or not for the host, or an https request answered in plain http.
func tlsRefused(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &invalid) ||
		errors.As(err, &hostname) || errors.Is(err, http.ErrSchemeMismatch)
}

// permanentError is a failure another attempt cannot fix (digest mismatch, bad manifest).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return &permanentError{err: err} }

// retry runs attempt up to 1+c.retries times while its error is retryable, with
// github.com/cenkalti/backoff/v5: exponential backoff with jitter (starting near c.backoff,
// doubling, each wait at most c.maxDelay), or the Retry-After the mirror asked for (at most
// c.maxDelay; the schedule then starts over). what names the operation for logs. The error is the
// last attempt's; when ctx ends first, it wraps the context's cause as well.
func (c *client) retry(ctx context.Context, what string, attempt func(ctx context.Context, n int) error) error {
	n := -1
	var last error
	op := func() (struct{}, error) {
		n++
		err := attempt(ctx, n)
		if err == nil {
			return struct{}{}, nil
		}
		last = err
		if n >= c.retries || !retryable(ctx, err) {
			return struct{}{}, backoff.Permanent(err)
		}
		var se *statusError
		if errors.As(err, &se) && se.RetryAfter > 0 {
			return struct{}{}, &retryAfterError{err: err, wait: &backoff.RetryAfterError{Duration: min(se.RetryAfter, c.maxDelay)}}
		}
		return struct{}{}, err
	}
	exp := backoff.NewExponentialBackOff()
	exp.InitialInterval, exp.Multiplier, exp.RandomizationFactor, exp.MaxInterval = c.backoff, 2, 0.5, c.maxDelay
	_, err := backoff.Retry(ctx, op,
		backoff.WithBackOff(capped{exp, c.maxDelay}),
		backoff.WithMaxElapsedTime(0), // --deadline bounds the run, not the retry loop
		backoff.WithNotify(func(err error, delay time.Duration) {
			c.log.Warn().Err(err).Str("op", what).Int("attempt", n+1).Str("retry_in", clitext.Span(delay)).Msg("retrying")
		}))
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && last != nil && errors.Is(err, cause) && !errors.Is(last, cause) {
		// backoff returns only the cause when ctx ends during a wait.
		return fmt.Errorf("%w (stopped while waiting to retry: %w)", last, cause)
	}
	if ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)) {
		return fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	return err
}

// retryAfterError is a retryable error whose wait the mirror named (Retry-After): backoff/v5
// finds the RetryAfterError in the chain, the log and the caller see the request's error.
type retryAfterError struct {
	err  error
	wait *backoff.RetryAfterError
}

func (e *retryAfterError) Error() string   { return e.err.Error() }
func (e *retryAfterError) Unwrap() []error { return []error{e.err, e.wait} }

// capped keeps every backoff wait at or below max (the exponential schedule's jitter can
// otherwise reach 1.5 times its interval cap).
type capped struct {
	backoff.BackOff
	max time.Duration
}

func (b capped) NextBackOff() time.Duration {
	d := b.BackOff.NextBackOff()
	if d == backoff.Stop {
		return d
	}
	return min(d, b.max)
}
