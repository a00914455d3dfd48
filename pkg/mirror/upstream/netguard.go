package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"
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
	ReasonMetadata    = "metadata"
	ReasonUnspecified = "unspecified"
	ReasonMulticast   = "multicast"
	ReasonSharedSpace = "shared-address-space"
	ReasonReserved    = "reserved"
	ReasonDowngrade   = "https-to-http"
)

// TargetRefusedError is a connection refused by the address guard: Target is the host:port (or,
// for a downgrade, the URL without its query) the upstream's answer named, Addr the address it
// resolved to (invalid for a downgrade), Reason one of the Reason* constants. Its message names
// Addr only when Target is itself an address: what a name resolves to inside the network is
// logged, not told to clients.
type TargetRefusedError struct {
	Target string
	Addr   netip.Addr
	Reason string
}

func (e *TargetRefusedError) Error() string {
	if e.Reason == ReasonDowngrade {
		return fmt.Sprintf("refused to follow the upstream's redirect to %s: it would downgrade https to http", e.Target)
	}
	what := "a " + e.Reason + " address"
	switch e.Reason {
	case ReasonSharedSpace:
		what = "a shared address space (RFC 6598, carrier-grade NAT) address"
	case ReasonMetadata:
		what = "a cloud metadata service address"
	case ReasonReserved:
		what = "a special-purpose address that is not globally reachable"
	}
	hint := "reached on an upstream's word only when it is the upstream's own address or --upstream-allow-private lists it"
	switch e.Reason {
	case ReasonLinkLocal, ReasonMetadata, ReasonSharedSpace, ReasonReserved, ReasonUnspecified, ReasonMulticast:
		hint = "reached on an upstream's word only when --upstream-allow-private lists it"
	}
	subject := e.Addr.String() + " is"
	if host, _, err := net.SplitHostPort(e.Target); err == nil {
		if _, perr := netip.ParseAddr(strings.Trim(host, "[]")); perr != nil {
			subject = "it resolves to"
		}
	}
	return fmt.Sprintf("refused to connect to %s named by the upstream's answer: %s %s (%s)", e.Target, subject, what, hint)
}

// Unwrap makes every TargetRefusedError match ErrUnsafeTarget.
func (e *TargetRefusedError) Unwrap() error { return ErrUnsafeTarget }

// Resolver looks up the addresses of a host name; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Special-purpose address ranges, from the IANA IPv4 and IPv6 Special-Purpose Address Registries
// (RFC 6890): addresses not marked globally reachable there, named by kind.
var (
	sharedSpace = netip.MustParsePrefix("100.64.0.0/10") // RFC 6598
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")     // RFC 791
	// metadataAddrs are cloud metadata and host-agent services on addresses that are not
	// link-local: Alibaba Cloud's (100.100.100.200), AWS's IPv6 instance metadata endpoint
	// (fd00:ec2::254) and Azure's WireServer (168.63.129.16, a public address).
	metadataAddrs = []netip.Addr{
		netip.MustParseAddr("100.100.100.200"),
		netip.MustParseAddr("fd00:ec2::254"),
		netip.MustParseAddr("168.63.129.16"),
	}
	reserved = []netip.Prefix{
		netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments (RFC 6890)
		netip.MustParsePrefix("192.0.2.0/24"),    // TEST-NET-1 (RFC 5737)
		netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking (RFC 2544)
		netip.MustParsePrefix("198.51.100.0/24"), // TEST-NET-2
		netip.MustParsePrefix("203.0.113.0/24"),  // TEST-NET-3
		netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast (RFC 7526)
		netip.MustParsePrefix("240.0.0.0/4"),     // reserved (RFC 1112), broadcast included
		netip.MustParsePrefix("fec0::/10"),       // site-local (RFC 3879)
		netip.MustParsePrefix("100::/64"),        // discard-only (RFC 6666)
		netip.MustParsePrefix("2001::/23"),       // IETF protocol assignments, Teredo (RFC 2928, 4380)
		netip.MustParsePrefix("2001:db8::/32"),   // documentation (RFC 3849)
	}
	nat64     = netip.MustParsePrefix("64:ff9b::/96")    // RFC 6052 well-known prefix
	nat64Loc  = netip.MustParsePrefix("64:ff9b:1::/48")  // RFC 8215 local-use prefix
	sixToFour = netip.MustParsePrefix("2002::/16")       // RFC 3056
	compat    = netip.MustParsePrefix("::/96")           // IPv4-compatible (RFC 4291, deprecated)
	xlated    = netip.MustParsePrefix("::ffff:0:0:0/96") // IPv4-translated (RFC 2765)
)

// embeddedV4 returns the IPv4 address an IPv6 address carries by one of the standard embeddings
// (mapped, compatible, translated, NAT64 with the /96 well-known or a local-use prefix, 6to4),
// else ip itself.
func embeddedV4(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if !ip.Is6() {
		return ip
	}
	b := ip.As16()
	last4 := netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	switch {
	case compat.Contains(ip) && !ip.IsUnspecified() && !ip.IsLoopback():
		return last4
	case xlated.Contains(ip), nat64.Contains(ip), nat64Loc.Contains(ip):
		return last4
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
	}
	return ip
}

// addressClass names the kind of a special-purpose address ip is ("" for a globally reachable
// unicast address). An IPv6 address that embeds an IPv4 address (embeddedV4) is judged by it.
func addressClass(ip netip.Addr) string {
	ip = embeddedV4(ip)
	for _, m := range metadataAddrs {
		if ip == m {
			return ReasonMetadata
		}
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
	for _, p := range reserved {
		if p.Contains(ip) {
			return ReasonReserved
		}
	}
	return ""
}

// maxPinned bounds the non-public addresses a guard remembers as its endpoint's own.
const maxPinned = 16

// addressGuard guards the connections of one upstream (or of the shared tier): its configured
// endpoint is dialled as configured, and every other host — one an answer named — is resolved
// by the guard, each address checked, and dialled by the checked address, so a name that
// resolves differently a moment later (DNS rebinding) cannot slip through.
//
// The endpoint's own address: a loopback or private address nodecache actually connected to as
// the configured endpoint (pinned at dial time, not looked up again) may be named by the same
// upstream's answers (a registry on a LAN redirecting to itself, another port included), as long
// as the endpoint was never reached on a public address: a public registry whose name once
// resolves inside the network gets no exception. Another upstream's address is not "own".
type addressGuard struct {
	resolver Resolver
	// allow are the --upstream-allow-private networks: reached whatever their class.
	allow []netip.Prefix
	// endpoint is host:port (lowercase host) of the configured endpoint; literal is its address
	// when the operator wrote one, which is then reached whatever its class.
	endpoint string
	literal  netip.Addr
	// proxies holds host:port of the proxies the environment named (HTTPS_PROXY, HTTP_PROXY),
	// dialled unchecked: their targets are checked before (proxy).
	proxies sync.Map

	mu        sync.Mutex
	pinned    map[netip.Addr]bool // non-public addresses the endpoint was reached at
	sawPublic bool                // the endpoint was reached at a public address
}

func newAddressGuard(endpoint *url.URL, allow []netip.Prefix, resolver Resolver) *addressGuard {
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	g := &addressGuard{resolver: resolver, allow: allow, endpoint: endpointKey(endpoint), pinned: map[netip.Addr]bool{}}
	if ip, err := netip.ParseAddr(strings.Trim(endpoint.Hostname(), "[]")); err == nil {
		g.literal = ip.Unmap()
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

func (g *addressGuard) isProxy(addr string) bool {
	_, ok := g.proxies.Load(addrKey(addr))
	return ok
}

func (g *addressGuard) allowed(ip netip.Addr) bool {
	for _, p := range g.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// check returns nil when ip may be reached for target, a host:port an answer named, else a
// *TargetRefusedError.
func (g *addressGuard) check(target string, ip netip.Addr) error {
	ip = ip.Unmap()
	class := addressClass(ip)
	if class == "" || g.allowed(ip) {
		return nil
	}
	if (class == ReasonLoopback || class == ReasonPrivate) && g.isOwn(ip) {
		return nil
	}
	return &TargetRefusedError{Target: target, Addr: ip, Reason: class}
}

// isOwn reports whether ip is a pinned address of the endpoint (see addressGuard).
func (g *addressGuard) isOwn(ip netip.Addr) bool {
	if ip == g.literal {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.sawPublic && g.pinned[ip]
}

// reachedEndpoint checks the address a connection to the configured endpoint reached: a cloud
// metadata or link-local address is refused unless the operator wrote it or listed it (a name
// whose DNS answer was switched to the metadata service), and a non-public one is pinned.
func (g *addressGuard) reachedEndpoint(conn net.Conn) error {
	ap, err := netip.ParseAddrPort(conn.RemoteAddr().String())
	if err != nil {
		return nil // not an IP connection (a test's pipe)
	}
	ip := ap.Addr().Unmap()
	class := addressClass(ip)
	if (class == ReasonMetadata || class == ReasonLinkLocal) && ip != g.literal && !g.allowed(ip) {
		return &TargetRefusedError{Target: g.endpoint, Addr: ip, Reason: class}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case class == "":
		g.sawPublic = true
	case len(g.pinned) < maxPinned:
		g.pinned[ip] = true
	}
	return nil
}

func (g *addressGuard) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{ip}, nil
	}
	return g.resolver.LookupNetIP(ctx, "ip", host)
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// dial wraps next: a proxy is dialled as given; the configured endpoint as given, then checked
// on the address it reached (reachedEndpoint); any other host is resolved here, each of its
// addresses checked, and the allowed ones dialled by address (dialAddrs).
func (g *addressGuard) dial(next dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if g.isProxy(addr) {
			return next(ctx, network, addr)
		}
		if addrKey(addr) == g.endpoint {
			return g.dialEndpoint(ctx, next, network, addr)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := g.lookup(ctx, host)
		if err != nil {
			return nil, err
		}
		ok, err := g.allowedAddrs(network, addr, host, ips)
		if err != nil {
			return nil, err
		}
		return dialAddrs(ctx, next, network, port, ok)
	}
}

// dialEndpoint dials the configured endpoint as given and checks the address it reached.
func (g *addressGuard) dialEndpoint(ctx context.Context, next dialFunc, network, addr string) (net.Conn, error) {
	conn, err := next(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := g.reachedEndpoint(conn); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// allowedAddrs are the addresses ips of host (addr's) of network's family that pass the check;
// none is an error: the first refusal, or that host has no address of the family.
func (g *addressGuard) allowedAddrs(network, addr, host string, ips []netip.Addr) ([]netip.Addr, error) {
	var (
		refused error
		ok      []netip.Addr
	)
	for _, ip := range ips {
		ip = ip.Unmap()
		if (network == "tcp4" && !ip.Is4()) || (network == "tcp6" && ip.Is4()) {
			continue
		}
		if err := g.check(addr, ip); err != nil {
			if refused == nil {
				refused = err
			}
			continue
		}
		ok = append(ok, ip)
	}
	if len(ok) == 0 {
		if refused != nil {
			return nil, refused
		}
		return nil, fmt.Errorf("%s: no %s address", host, network)
	}
	return ok, nil
}

// fallbackDelay is how long the first address family is tried alone before the other one joins
// (RFC 8305, Happy Eyeballs v2, "Connection Attempt Delay"; Go's net.Dialer uses 300 ms too).
const fallbackDelay = 300 * time.Millisecond

// dialAddrs dials the checked addresses: those of the first address's family in turn, and,
// fallbackDelay later when the first has not connected yet, those of the other family in
// parallel; the first connection wins. Errors: the first family's last error.
func dialAddrs(ctx context.Context, next dialFunc, network, port string, addrs []netip.Addr) (net.Conn, error) {
	var primary, fallback []netip.Addr
	for _, a := range addrs {
		if a.Is4() == addrs[0].Is4() {
			primary = append(primary, a)
		} else {
			fallback = append(fallback, a)
		}
	}
	serial := func(ctx context.Context, list []netip.Addr) (net.Conn, error) {
		return dialSerial(ctx, next, network, port, list)
	}
	if len(fallback) == 0 {
		return serial(ctx, primary)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan dialResult, 2)
	go func() { c, err := serial(rctx, primary); results <- dialResult{c, err, true} }()
	timer := time.NewTimer(fallbackDelay)
	defer timer.Stop()
	started, pending := false, 1
	var firstErr error
	for {
		select {
		case <-timer.C:
			if !started {
				started, pending = true, pending+1
				go func() { c, err := serial(rctx, fallback); results <- dialResult{c, err, false} }()
			}
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				// The other attempt may still connect: close what it brings.
				go closeLate(results, pending)
				return r.conn, nil
			}
			if r.primary || firstErr == nil {
				firstErr = r.err
			}
			if !started {
				started, pending = true, pending+1
				timer.Stop()
				go func() { c, err := serial(rctx, fallback); results <- dialResult{c, err, false} }()
				continue
			}
			if pending == 0 {
				return nil, firstErr
			}
		}
	}
}

// dialResult is one address family's attempt in dialAddrs.
type dialResult struct {
	conn    net.Conn
	err     error
	primary bool
}

// dialSerial dials the addresses list in turn, port on each; the first connection wins, else
// the last error (the dial stops early when ctx ends).
func dialSerial(ctx context.Context, next dialFunc, network, port string, list []netip.Addr) (net.Conn, error) {
	var last error
	for _, a := range list {
		conn, err := next(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return conn, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

// closeLate receives the n attempts still running after one connected and closes what they
// bring.
func closeLate(results <-chan dialResult, n int) {
	for ; n > 0; n-- {
		if o := <-results; o.conn != nil {
			_ = o.conn.Close()
		}
	}
}

// proxy wraps next (http.ProxyFromEnvironment): the proxy it names is trusted, and the target
// of a request sent through it — unless it is the configured endpoint — is checked by
// resolving its name here. What that leaves open: the proxy resolves the name again itself, so
// a name whose DNS answer changes between the two lookups, one the proxy resolves differently
// (split-horizon DNS), or one this host cannot resolve at all (nodes whose only way out is the
// proxy: the request then goes to the proxy unchecked) reaches what the proxy lets it; the
// proxy's own policy is the guard there.
func (g *addressGuard) proxy(next func(*http.Request) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	return func(req *http.Request) (*url.URL, error) {
		p, err := next(req)
		if err != nil || p == nil {
			return p, err
		}
		g.proxies.Store(endpointKey(p), true)
		target := endpointKey(req.URL)
		if target == g.endpoint {
			return p, nil
		}
		ips, err := g.lookup(req.Context(), req.URL.Hostname())
		if err != nil {
			return p, nil // unresolvable here: the proxy resolves it (see above)
		}
		for _, ip := range ips {
			if err := g.check(target, ip); err != nil {
				return nil, err
			}
		}
		return p, nil
	}
}

// guardTransport returns base with the guard in place. An *http.Transport is cloned (so each
// guarded endpoint has a connection pool of its own: a connection opened for another upstream is
// never reused on this one's word) with its dialers and proxy function wrapped and transparent
// decompression off (an upstream's Content-Encoding is never undone, so a compressed body is
// checked against the digest as sent and cannot expand on disk). Any other RoundTripper (tests)
// is wrapped by a check of each request's host before it is sent, which a DNS answer that
// changes between that check and the transport's own lookup can pass.
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

// preflightGuard checks the host of every request to a host other than the configured endpoint
// before handing it on (guardTransport, for transports that are not *http.Transport).
type preflightGuard struct {
	g    *addressGuard
	next http.RoundTripper
}

func (p preflightGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	target := endpointKey(req.URL)
	if target != p.g.endpoint {
		ips, err := p.g.lookup(req.Context(), req.URL.Hostname())
		if err != nil {
			closeBody(req)
			return nil, err
		}
		for _, ip := range ips {
			if err := p.g.check(target, ip); err != nil {
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
		return nil, &TargetRefusedError{Target: redactedURL(req.URL), Reason: ReasonDowngrade}
	}
	return t.next.RoundTrip(req)
}

// redactedURL is u without its query, fragment and user information: what may be shown of a URL
// an upstream handed out (a CDN's signed query is a credential).
func redactedURL(u *url.URL) string {
	c := *u
	c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment, c.User = "", false, "", "", nil
	return c.String()
}

// maxPingBody bounds what is read of the body of a /v2/ answer (the API version check, whose body
// go-containerregistry drains whole): real registries send "{}" or an error document.
const maxPingBody = 64 << 10

// boundedPing caps the body of answers to GET /v2/ at maxPingBody bytes.
type boundedPing struct{ next http.RoundTripper }

func (t boundedPing) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && req.URL.Path == "/v2/" && resp.Body != nil {
		resp.Body = limitedBody{Reader: io.LimitReader(resp.Body, maxPingBody), Closer: resp.Body}
	}
	return resp, err
}

type limitedBody struct {
	io.Reader
	io.Closer
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
