package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// manifestAccept is sent on every manifest request: every manifest and index media type the
// cache stores (OCI image-spec v1.1, Docker image manifest v2 schema 2).
var manifestAccept = strings.Join([]string{
	"application/vnd.oci.image.index.v1+json",
	"application/vnd.docker.distribution.manifest.list.v2+json",
	"application/vnd.oci.image.manifest.v1+json",
	"application/vnd.docker.distribution.manifest.v2+json",
}, ", ")

// maxManifestBytes bounds a manifest body read from an upstream (distribution's own limit).
const maxManifestBytes = 4 << 20

// upstreamError is an upstream answer other than success: its HTTP status (0 when no answer
// arrived) and, for 429, how long the upstream asked clients to wait.
type upstreamError struct {
	Upstream   string
	Op         string
	Status     int
	RetryAfter string
	Err        error
}

func (e *upstreamError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("upstream %s: %s: HTTP %d", e.Upstream, e.Op, e.Status)
	}
	return fmt.Sprintf("upstream %s: %s: %v", e.Upstream, e.Op, e.Err)
}

func (e *upstreamError) Unwrap() error { return e.Err }

// notFound reports an authoritative "does not exist" from the upstream.
func (e *upstreamError) notFound() bool { return e.Status == http.StatusNotFound }

// unavailable reports an upstream that did not answer usefully: no answer, timeout, 429 or 5xx.
// A cached copy may then be served ("stale").
func (e *upstreamError) unavailable() bool {
	return e.Status == 0 || e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// upstreamClient talks to one upstream registry. Authentication follows the registry's
// challenge (anonymous bearer tokens from the announced realm, as docker.io, ghcr.io, quay.io and
// registry.k8s.io require); redirects are followed, and credentials are only ever sent to the
// upstream host itself.
type upstreamClient struct {
	up        Upstream
	reg       name.Registry
	base      http.RoundTripper
	timeout   time.Duration
	userAgent string

	mu    sync.Mutex
	repos map[string]*repoTransport // repository -> authenticated transport
}

type repoTransport struct {
	rt      http.RoundTripper
	created time.Time
}

// repoTransportTTL bounds how long an authenticated transport is reused; a token refresh on 401
// happens inside it anyway, this only lets a changed challenge be seen again.
const repoTransportTTL = 30 * time.Minute

// maxRepoTransports bounds the transport cache per upstream.
const maxRepoTransports = 1024

func newUpstreamClient(up Upstream, base http.RoundTripper, timeout time.Duration, userAgent string) (*upstreamClient, error) {
	opts := []name.Option{name.WeakValidation}
	if up.URL.Scheme == "http" {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(up.URL.Host, opts...)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: url host %q: %w", up.Name, up.URL.Host, err)
	}
	return &upstreamClient{
		up: up, reg: reg, base: retryAfterRecorder{base}, timeout: timeout, userAgent: userAgent,
		repos: map[string]*repoTransport{},
	}, nil
}

// retryAfterRecorder notes an upstream 429's Retry-After in the request state of the client
// request that caused it, wherever in the exchange (ping, token, manifest) it came.
type retryAfterRecorder struct{ next http.RoundTripper }

func (t retryAfterRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			if st, ok := req.Context().Value(stateKey{}).(*reqState); ok {
				st.mu.Lock()
				st.retryAfter = ra
				st.mu.Unlock()
			}
		}
	}
	return resp, err
}

// defaultTransport returns the base transport to upstreams: every phase up to the response
// headers is bounded by timeout, so a black-holed upstream fails instead of hanging.
func defaultTransport(timeout time.Duration) *http.Transport {
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
	}
}

// transport returns the authenticated transport for repo, creating it (a /v2/ ping and, for
// bearer challenges, a token request with pull scope) when missing or old.
func (c *upstreamClient) transport(ctx context.Context, repo string) (http.RoundTripper, error) {
	c.mu.Lock()
	if t, ok := c.repos[repo]; ok && time.Since(t.created) < repoTransportTTL {
		c.mu.Unlock()
		return t.rt, nil
	}
	c.mu.Unlock()

	pctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	base := transport.NewUserAgent(c.base, c.userAgent)
	scope := "repository:" + repo + ":pull"
	rt, err := transport.NewWithContext(pctx, c.reg, authn.Anonymous, base, []string{scope})
	if err != nil {
		return nil, c.classify("authenticate", err)
	}
	c.mu.Lock()
	if len(c.repos) >= maxRepoTransports {
		for k := range c.repos { // drop an arbitrary entry; a miss only costs a ping
			delete(c.repos, k)
			break
		}
	}
	c.repos[repo] = &repoTransport{rt: rt, created: time.Now()}
	c.mu.Unlock()
	return rt, nil
}

// forget drops the cached transport of repo, so the next request authenticates again.
func (c *upstreamClient) forget(repo string) {
	c.mu.Lock()
	delete(c.repos, repo)
	c.mu.Unlock()
}

// do sends method to /v2/<repo>/<kind>/<ref> on the upstream. Statuses other than the wanted
// ones become an *upstreamError; the caller closes the returned body.
func (c *upstreamClient) do(ctx context.Context, method, repo, kind, ref string, hdr http.Header, want ...int) (*http.Response, error) {
	op := fmt.Sprintf("%s %s/%s/%s", method, repo, kind, ref)
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
	client := &http.Client{Transport: rt}
	resp, err := client.Do(req)
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
	return nil, &upstreamError{
		Upstream: c.up.Name, Op: op, Status: resp.StatusCode,
		RetryAfter: resp.Header.Get("Retry-After"),
	}
}

func (c *upstreamClient) classify(op string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		return &upstreamError{Upstream: c.up.Name, Op: op, Status: te.StatusCode, Err: err}
	}
	return &upstreamError{Upstream: c.up.Name, Op: op, Err: err}
}
