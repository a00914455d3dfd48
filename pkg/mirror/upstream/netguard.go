package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
)

// ErrUnsafeTarget marks a connection nodecache refused to open because an upstream's answer (a
// redirect's Location, a token realm, or a redirect of either) pointed it at an address it must
// not reach on an upstream's word, or downgraded https to http. Every *TargetRefusedError
// matches it with errors.Is.
var ErrUnsafeTarget = errors.New("target named by an upstream's answer refused")

// Reasons of a TargetRefusedError, also the reason label of
// nodecache_upstream_refused_targets_total.
const (
	ReasonLoopback    = "loopback"
	ReasonPrivate     = "private"
	ReasonLinkLocal   = "link-local"
	ReasonUnspecified = "unspecified"
	ReasonMulticast   = "multicast"
	ReasonSharedSpace = "shared-address-space"
	ReasonDowngrade   = "https-to-http"
)

// TargetRefusedError is a connection refused by the address guard: Target is the host:port (or,
// for a downgrade, the URL without its query) the upstream's answer named, Addr the address it
// resolved to (invalid for a downgrade), Reason one of the Reason* constants.
type TargetRefusedError struct {
	Target string
	Addr   netip.Addr
	Reason string
}

func (e *TargetRefusedError) Error() string {
	if e.Reason == ReasonDowngrade {
		return fmt.Sprintf("refused to follow the upstream's redirect to %s: it would downgrade https to http", e.Target)
	}
	what := e.Reason + " address"
	if e.Reason == ReasonSharedSpace {
		what = "shared address space (RFC 6598, carrier-grade NAT) address"
	}
	hint := "only configured endpoints, the upstreams' own addresses and --upstream-allow-private networks are reached there"
	if e.Reason == ReasonLinkLocal {
		hint = "link-local addresses (cloud metadata services) are reached only when --upstream-allow-private lists them"
	}
	return fmt.Sprintf("refused to connect to %s named by the upstream's answer: %s is a %s (%s)", e.Target, e.Addr, what, hint)
}

// Unwrap makes every TargetRefusedError match ErrUnsafeTarget.
func (e *TargetRefusedError) Unwrap() error { return ErrUnsafeTarget }

// Resolver looks up the addresses of a host name; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Address ranges an upstream's answer may not send nodecache to (IANA special-purpose address
// registries; RFC 1918 and RFC 4193 private, RFC 3927 and RFC 4291 link-local, RFC 6598 shared).
var (
	sharedSpace = netip.MustParsePrefix("100.64.0.0/10")
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
)

// addressClass names the kind of a special-purpose address ip is ("" for a global unicast
// address anyone on the internet could reach). An IPv4-mapped or NAT64 (RFC 6052 well-known
// prefix) IPv6 address is judged by the IPv4 address inside it.
func addressClass(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is6() && nat64.Contains(ip) {
		b := ip.As16()
		ip = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	switch {
	case !ip.IsValid(), ip.IsUnspecified(), thisNetwork.Contains(ip):
		return ReasonUnspecified
	case ip.IsLoopback():
		return ReasonLoopback
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return ReasonLinkLocal
	case ip.IsMulticast(), ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return ReasonMulticast
	case ip.IsPrivate():
		return ReasonPrivate
	case sharedSpace.Contains(ip):
		return ReasonSharedSpace
	}
	return ""
}

// addressGuard checks every connection the upstream transport opens to a host the operator did
// not configure, that is a host learned from an upstream's answer: it resolves the name itself,
// refuses special-purpose addresses (addressClass) unless allowed, and dials the checked address,
// so a name that resolves differently a moment later (DNS rebinding) cannot slip through.
type addressGuard struct {
	resolver Resolver
	// allow are the --upstream-allow-private networks: reached whatever their class.
	allow []netip.Prefix
	// configured holds host:port (lowercase host) of every endpoint the operator configured:
	// the upstreams' URLs and the shared tier. They are dialled unchecked.
	configured map[string]bool
	// own are the hosts of the configured upstreams: a target on one of their addresses is the
	// upstream sending nodecache to itself (a registry on a LAN redirecting to its own address).
	own []string
	// proxies holds host:port of the proxies the environment named (HTTPS_PROXY, HTTP_PROXY),
	// which are dialled unchecked: their targets are checked before (proxy).
	proxies sync.Map
}

func newAddressGuard(regs []Registry, chain *url.URL, allow []netip.Prefix, resolver Resolver) *addressGuard {
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	g := &addressGuard{resolver: resolver, allow: allow, configured: map[string]bool{}}
	for _, r := range regs {
		g.configured[endpointKey(r.URL)] = true
		g.own = append(g.own, r.URL.Hostname())
	}
	if chain != nil {
		g.configured[endpointKey(chain)] = true
	}
	return g
}

// endpointKey is u's host:port as http.Transport dials it: the scheme's port when none is given.
func endpointKey(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return addrKey(net.JoinHostPort(u.Hostname(), port))
}

func addrKey(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return strings.ToLower(addr)
	}
	return net.JoinHostPort(strings.TrimSuffix(strings.ToLower(host), "."), port)
}

func (g *addressGuard) trusted(addr string) bool {
	key := addrKey(addr)
	if g.configured[key] {
		return true
	}
	_, ok := g.proxies.Load(key)
	return ok
}

// check returns nil when ip may be reached for target, else a *TargetRefusedError.
func (g *addressGuard) check(ctx context.Context, target string, ip netip.Addr) error {
	ip = ip.Unmap()
	class := addressClass(ip)
	if class == "" {
		return nil
	}
	for _, p := range g.allow {
		if p.Contains(ip) {
			return nil
		}
	}
	if class != ReasonLinkLocal && class != ReasonUnspecified && class != ReasonMulticast && g.isOwn(ctx, ip) {
		return nil
	}
	return &TargetRefusedError{Target: target, Addr: ip, Reason: class}
}

// isOwn reports whether ip is an address of a configured upstream's host. It resolves the
// upstreams' names only here, for a target that is not a public address (rare: a redirect or
// realm inside a LAN), so the answer follows their DNS as it is now.
func (g *addressGuard) isOwn(ctx context.Context, ip netip.Addr) bool {
	for _, h := range g.own {
		addrs, err := g.lookup(ctx, h)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if a.Unmap() == ip {
				return true
			}
		}
	}
	return false
}

func (g *addressGuard) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{ip}, nil
	}
	return g.resolver.LookupNetIP(ctx, "ip", host)
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// dial wraps next: a trusted address is dialled as given; any other is resolved here, each of its
// addresses checked, and the first allowed one that answers is dialled by address.
func (g *addressGuard) dial(next dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if g.trusted(addr) {
			return next(ctx, network, addr)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := g.lookup(ctx, host)
		if err != nil {
			return nil, err
		}
		var refused, dialErr error
		for _, ip := range ips {
			if (network == "tcp4" && !ip.Unmap().Is4()) || (network == "tcp6" && ip.Unmap().Is4()) {
				continue
			}
			if err := g.check(ctx, addr, ip); err != nil {
				refused = cmpFirst(refused, err)
				continue
			}
			conn, err := next(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
			if err == nil {
				return conn, nil
			}
			dialErr = cmpFirst(dialErr, err)
		}
		// An allowed address that did not answer says more than a refused one beside it.
		switch {
		case dialErr != nil:
			return nil, dialErr
		case refused != nil:
			return nil, refused
		}
		return nil, fmt.Errorf("%s: no %s address", host, network)
	}
}

func cmpFirst(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// proxy wraps next (http.ProxyFromEnvironment): the proxy it names is trusted, and the target
// of a request sent through it is checked by resolving its name here. What that leaves open:
// the proxy resolves the name again itself, so a name whose DNS answer changes between the two
// lookups, or that the proxy resolves differently (split-horizon DNS), reaches what the proxy
// lets it; the proxy's own policy is the guard there.
func (g *addressGuard) proxy(next func(*http.Request) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	return func(req *http.Request) (*url.URL, error) {
		p, err := next(req)
		if err != nil || p == nil {
			return p, err
		}
		g.proxies.Store(endpointKey(p), true)
		target := endpointKey(req.URL)
		if g.trusted(target) {
			return p, nil
		}
		ips, err := g.lookup(req.Context(), req.URL.Hostname())
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if err := g.check(req.Context(), target, ip); err != nil {
				return nil, err
			}
		}
		return p, nil
	}
}

// guardTransport returns base with the guard in place: an *http.Transport is cloned with its
// dialers and proxy function wrapped, and with transparent decompression off (an upstream's
// Content-Encoding is never undone, so a compressed body is checked against the digest as sent
// and cannot expand on disk). Any other RoundTripper (tests) is wrapped by a check of each
// request's host before it is sent, which a DNS answer that changes between that check and the
// transport's own lookup can pass.
func (g *addressGuard) guardTransport(base http.RoundTripper, dialer *net.Dialer) http.RoundTripper {
	t, ok := base.(*http.Transport)
	if !ok {
		return preflightGuard{g: g, next: base}
	}
	t = t.Clone()
	t.DisableCompression = true
	next := t.DialContext
	if next == nil {
		next = dialer.DialContext
	}
	t.DialContext = g.dial(next)
	if t.DialTLSContext != nil {
		t.DialTLSContext = g.dial(t.DialTLSContext)
	}
	if t.Proxy != nil {
		t.Proxy = g.proxy(t.Proxy)
	}
	return t
}

// preflightGuard checks the host of every request to an endpoint the operator did not configure
// before handing it on (guardTransport, for transports that are not *http.Transport).
type preflightGuard struct {
	g    *addressGuard
	next http.RoundTripper
}

func (p preflightGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	target := endpointKey(req.URL)
	if !p.g.trusted(target) {
		ips, err := p.g.lookup(req.Context(), req.URL.Hostname())
		if err != nil {
			closeBody(req)
			return nil, err
		}
		for _, ip := range ips {
			if err := p.g.check(req.Context(), target, ip); err != nil {
				closeBody(req)
				return nil, err
			}
		}
	}
	return p.next.RoundTrip(req)
}

// noDowngrade refuses a redirect from https to http: http.Client (nodecache's own, and
// go-containerregistry's ping and token clients) sets Request.Response on the request a redirect
// creates, so every redirect of every client passes here.
type noDowngrade struct{ next http.RoundTripper }

func (t noDowngrade) RoundTrip(req *http.Request) (*http.Response, error) {
	if via := req.Response; via != nil && via.Request != nil && via.Request.URL.Scheme == "https" && req.URL.Scheme == "http" {
		closeBody(req)
		u := *req.URL
		u.RawQuery, u.User = "", nil
		return nil, &TargetRefusedError{Target: u.String(), Reason: ReasonDowngrade}
	}
	return t.next.RoundTrip(req)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
