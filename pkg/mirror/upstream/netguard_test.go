package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

// mapResolver answers from a fixed table, as DNS would for these names.
type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestAddressClass(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"93.184.215.14":          "",
		"2606:4700::1111":        "",
		"127.0.0.1":              ReasonLoopback,
		"127.0.0.5":              ReasonLoopback,
		"::1":                    ReasonLoopback,
		"::ffff:127.0.0.1":       ReasonLoopback,  // IPv4-mapped
		"::127.0.0.5":            ReasonLoopback,  // IPv4-compatible
		"::ffff:0:a00:1":         ReasonPrivate,   // IPv4-translated 10.0.0.1
		"64:ff9b::7f00:1":        ReasonLoopback,  // NAT64 of 127.0.0.1
		"64:ff9b:1::a9fe:a9fe":   ReasonLinkLocal, // local-use NAT64 of 169.254.169.254
		"64:ff9b::5db8:d70e":     "",              // NAT64 of a public address
		"2002:7f00:1::1":         ReasonLoopback,  // 6to4 of 127.0.0.1
		"2002:5db8:d70e::1":      "",              // 6to4 of a public address
		"10.1.2.3":               ReasonPrivate,
		"172.16.0.1":             ReasonPrivate,
		"172.32.0.1":             "",
		"192.168.1.1":            ReasonPrivate,
		"fd00::1":                ReasonPrivate,
		"169.254.169.254":        ReasonLinkLocal, // cloud metadata
		"fe80::1":                ReasonLinkLocal,
		"::ffff:169.254.169.254": ReasonLinkLocal,
		"100.100.100.200":        ReasonMetadata, // Alibaba Cloud
		"fd00:ec2::254":          ReasonMetadata, // AWS over IPv6
		"168.63.129.16":          ReasonMetadata, // Azure WireServer
		"100.64.0.1":             ReasonSharedSpace,
		"100.127.255.254":        ReasonSharedSpace,
		"100.128.0.1":            "",
		"0.0.0.0":                ReasonUnspecified,
		"0.1.2.3":                ReasonUnspecified,
		"::":                     ReasonUnspecified,
		"224.0.0.251":            ReasonLinkLocal, // link-local multicast
		"239.1.1.1":              ReasonMulticast,
		"255.255.255.255":        ReasonMulticast,
		"ff02::1":                ReasonLinkLocal,
		"ff05::2":                ReasonMulticast,
		"198.18.0.1":             ReasonReserved,
		"240.1.2.3":              ReasonReserved,
		"192.0.2.10":             ReasonReserved,
		"fec0::1":                ReasonReserved,
		"2001:db8::1":            ReasonReserved,
		"2001:0:4136:e378::1":    ReasonReserved, // Teredo
	} {
		if got := addressClass(netip.MustParseAddr(addr)); got != want {
			t.Errorf("%s: class %q, want %q", addr, got, want)
		}
	}
}

// fakeConn is a connection that only tells where it leads.
type fakeConn struct {
	net.Conn
	remote string
}

func (c fakeConn) RemoteAddr() net.Addr {
	return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(c.remote))
}
func (c fakeConn) Close() error { return nil }

func refusedFor(t *testing.T, err error) string {
	t.Helper()
	var refused *TargetRefusedError
	if err == nil {
		return ""
	}
	if !errors.As(err, &refused) || !errors.Is(err, ErrUnsafeTarget) {
		t.Fatalf("%v is not a TargetRefusedError", err)
	}
	return refused.Reason
}

// TestGuardOwnAddress: what an upstream's answer may lead to for an upstream configured by name
// (registry.lan:5000): its own address is one nodecache reached it at (pinned), never what its
// name resolves to later, and only while it was never reached at a public address.
func TestGuardOwnAddress(t *testing.T) {
	t.Parallel()
	res := mapResolver{"registry.lan": addrs("10.0.0.5", "10.20.30.40")}
	g := newAddressGuard(&url.URL{Scheme: "http", Host: "registry.lan:5000"}, []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}, res)
	check := func(addr string) string { return refusedFor(t, g.check(addr+":80", netip.MustParseAddr(addr))) }
	for addr, want := range map[string]string{
		"93.184.215.14":   "",
		"10.0.0.5":        ReasonPrivate, // what the name resolves to is not "own" before nodecache went there
		"192.168.7.20":    "",            // listed
		"192.168.8.20":    ReasonPrivate, // not listed
		"100.100.100.200": ReasonMetadata,
	} {
		if got := check(addr); got != want {
			t.Errorf("before any connection, %s: %q, want %q", addr, got, want)
		}
	}
	if err := g.reachedEndpoint(fakeConn{remote: "10.0.0.5:5000"}); err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{
		"10.0.0.5":    "",            // the address nodecache reached it at, any port
		"10.20.30.40": ReasonPrivate, // also in its DNS answer, never connected to
		"127.0.0.1":   ReasonLoopback,
	} {
		if got := check(addr); got != want {
			t.Errorf("reached at 10.0.0.5, %s: %q, want %q", addr, got, want)
		}
	}
	// Reached once at a public address: a registry that lives outside the network, whose
	// name answering with inside addresses is no LAN registry.
	if err := g.reachedEndpoint(fakeConn{remote: "93.184.215.14:5000"}); err != nil {
		t.Fatal(err)
	}
	if got := check("10.0.0.5"); got != ReasonPrivate {
		t.Errorf("after a public connection, 10.0.0.5: %q, want private", got)
	}
	// The metadata service behind the configured name (a DNS answer switched to it) is refused
	// at once, unless the operator wrote or listed the address.
	for _, c := range []struct {
		endpoint string
		allow    []netip.Prefix
		remote   string
		want     string
	}{
		{"registry.lan:80", nil, "169.254.169.254:80", ReasonLinkLocal},
		{"registry.lan:80", nil, "100.100.100.200:80", ReasonMetadata},
		{"registry.lan:80", []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")}, "169.254.169.254:80", ""},
		{"169.254.169.254:80", nil, "169.254.169.254:80", ""},
		{"registry.lan:80", nil, "127.0.0.1:80", ""},
	} {
		g := newAddressGuard(&url.URL{Scheme: "http", Host: c.endpoint}, c.allow, res)
		if got := refusedFor(t, g.reachedEndpoint(fakeConn{remote: c.remote})); got != c.want {
			t.Errorf("endpoint %s reached at %s: %q, want %q", c.endpoint, c.remote, got, c.want)
		}
	}
}

// TestGuardDial: the configured endpoint is dialled by name and checked on the address reached;
// any other name is resolved by the guard, checked, and dialled by its allowed addresses only.
func TestGuardDial(t *testing.T) {
	t.Parallel()
	res := mapResolver{
		"cdn.example":    addrs("93.184.215.14"),
		"rebind.example": addrs("127.0.0.1", "93.184.215.14"),
		"inside.example": addrs("127.0.0.9"),
	}
	g := newAddressGuard(&url.URL{Scheme: "https", Host: "registry.example"}, nil, res)
	var dialled []string
	dial := g.dial(func(_ context.Context, _, addr string) (net.Conn, error) {
		dialled = append(dialled, addr)
		if addr == "registry.example:443" {
			return fakeConn{remote: "93.184.215.20:443"}, nil
		}
		return nil, errors.New("not dialled in this test")
	})
	for _, c := range []struct {
		addr    string
		dialled []string
		refused bool
	}{
		{"REGISTRY.example:443", []string{"REGISTRY.example:443"}, false}, // configured: by name
		{"registry.example:8443", nil, false},                             // not configured: resolved (no such host)
		{"cdn.example:443", []string{"93.184.215.14:443"}, false},
		{"rebind.example:443", []string{"93.184.215.14:443"}, false}, // only the public address
		{"inside.example:80", nil, true},
		{"127.0.0.1:10250", nil, true},
	} {
		dialled = nil
		_, err := dial(t.Context(), "tcp", c.addr)
		if got := errors.Is(err, ErrUnsafeTarget); got != c.refused {
			t.Errorf("%s: refused %v (%v), want %v", c.addr, got, err, c.refused)
		}
		if len(dialled) != len(c.dialled) || (len(c.dialled) > 0 && dialled[0] != c.dialled[0]) {
			t.Errorf("%s: dialled %q, want %q", c.addr, dialled, c.dialled)
		}
	}
}

// TestDialAddrsFallback: when the first address family does not answer, the other one is
// tried fallbackDelay later, not after the first attempt's whole timeout.
func TestDialAddrsFallback(t *testing.T) {
	t.Parallel()
	start := time.Now()
	conn, err := dialAddrs(t.Context(), func(ctx context.Context, _, addr string) (net.Conn, error) {
		if strings.HasPrefix(addr, "[") { // IPv6: black-holed
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return fakeConn{remote: addr}, nil
	}, "tcp", "443", addrs("2001:4860::1", "93.184.215.14"))
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.RemoteAddr().String(); got != "93.184.215.14:443" {
		t.Errorf("connected to %s", got)
	}
	if d := time.Since(start); d < fallbackDelay || d > 5*time.Second {
		t.Errorf("connected after %s, want about %s", d, fallbackDelay)
	}
}

// TestGuardProxy: behind a proxy from the environment the proxy is trusted and each target is
// checked by resolving its name before the request goes to the proxy; a name this host cannot
// resolve goes to the proxy, which resolves it.
func TestGuardProxy(t *testing.T) {
	t.Parallel()
	res := mapResolver{"cdn.example": addrs("93.184.215.14"), "inside.example": addrs("10.9.9.9")}
	g := newAddressGuard(&url.URL{Scheme: "https", Host: "registry-1.docker.io"}, nil, res)
	proxyURL := &url.URL{Scheme: "http", Host: "10.0.0.1:3128"}
	proxy := g.proxy(func(*http.Request) (*url.URL, error) { return proxyURL, nil })
	for target, refused := range map[string]bool{
		"https://registry-1.docker.io/v2/": false,
		"https://cdn.example/blob":         false,
		"https://auth.unknown.example/tok": false, // not resolvable here
		"http://inside.example/latest":     true,
	} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, target, nil)
		p, err := proxy(req)
		if got := errors.Is(err, ErrUnsafeTarget); got != refused {
			t.Errorf("%s: refused %v (%v), want %v", target, got, err, refused)
		}
		if !refused && p != proxyURL {
			t.Errorf("%s: proxy %v", target, p)
		}
	}
	if !g.isProxy("10.0.0.1:3128") {
		t.Error("the proxy the environment named is not dialled as configured")
	}
}

// TestBoundedPing: the body of a /v2/ answer is read up to maxPingBody bytes, however long.
func TestBoundedPing(t *testing.T) {
	t.Parallel()
	rt := boundedPing{next: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(zeroReader{})}, nil
	})}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://registry.example/v2/", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, _ := io.Copy(io.Discard, resp.Body)
	if n != maxPingBody {
		t.Errorf("read %d bytes of an endless /v2/ body, want %d", n, maxPingBody)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestNoDowngrade: a request a redirect created from an https answer may not be http.
func TestNoDowngrade(t *testing.T) {
	t.Parallel()
	sent := 0
	rt := noDowngrade{next: roundTripFunc(func(*http.Request) (*http.Response, error) {
		sent++
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})}
	from, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://registry.example/v2/x/blobs/sha256:1", nil)
	for target, refused := range map[string]bool{
		"http://cdn.example/blob?sig=secret": true,
		"https://cdn.example/blob":           false,
	} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, target, nil)
		req.Response = &http.Response{Request: from}
		resp, err := rt.RoundTrip(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		if got := errors.Is(err, ErrUnsafeTarget); got != refused {
			t.Errorf("%s: refused %v (%v), want %v", target, got, err, refused)
		}
		if err != nil && (!strings.Contains(err.Error(), "downgrade") || strings.Contains(err.Error(), "secret")) {
			t.Errorf("%s: message %q should name the downgrade and not the query", target, err)
		}
	}
	if sent != 1 {
		t.Errorf("%d requests sent, want 1 (the https one)", sent)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
