package upstream

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
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
		"::ffff:127.0.0.1":       ReasonLoopback, // IPv4-mapped
		"64:ff9b::7f00:1":        ReasonLoopback, // NAT64 of 127.0.0.1
		"64:ff9b::5db8:d70e":     "",             // NAT64 of a public address
		"10.1.2.3":               ReasonPrivate,
		"172.16.0.1":             ReasonPrivate,
		"172.32.0.1":             "",
		"192.168.1.1":            ReasonPrivate,
		"fd00::1":                ReasonPrivate,
		"169.254.169.254":        ReasonLinkLocal, // cloud metadata
		"fe80::1":                ReasonLinkLocal,
		"::ffff:169.254.169.254": ReasonLinkLocal,
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
	} {
		if got := addressClass(netip.MustParseAddr(addr)); got != want {
			t.Errorf("%s: class %q, want %q", addr, got, want)
		}
	}
}

// TestGuardCheck: what an upstream's answer may lead to, for an upstream on a LAN address
// (10.0.0.5, known by its name registry.lan) with one network listed in AllowPrivate.
func TestGuardCheck(t *testing.T) {
	t.Parallel()
	res := mapResolver{"registry.lan": addrs("10.0.0.5"), "metadata.lan": addrs("169.254.169.254")}
	up := Registry{Name: "registry.lan", URL: &url.URL{Scheme: "http", Host: "registry.lan:5000"}}
	linkLocalUp := Registry{Name: "metadata.lan", URL: &url.URL{Scheme: "http", Host: "metadata.lan"}}
	g := newAddressGuard([]Registry{up, linkLocalUp}, nil, []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}, res)
	for _, c := range []struct {
		addr string
		want string // "" allowed, else the reason
	}{
		{"93.184.215.14", ""},
		{"10.0.0.5", ""},                     // the upstream's own address (any port)
		{"10.0.0.6", ReasonPrivate},          // its neighbour
		{"192.168.7.20", ""},                 // listed
		{"192.168.8.20", ReasonPrivate},      // not listed
		{"127.0.0.1", ReasonLoopback},        //
		{"169.254.169.254", ReasonLinkLocal}, // link-local even when an upstream resolves to it
		{"100.64.1.1", ReasonSharedSpace},
	} {
		err := g.check(t.Context(), c.addr+":80", netip.MustParseAddr(c.addr))
		var refused *TargetRefusedError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused (%v), want allowed", c.addr, err)
		case c.want != "" && !errors.As(err, &refused):
			t.Errorf("%s: %v, want a refusal for %s", c.addr, err, c.want)
		case c.want != "" && (refused.Reason != c.want || !errors.Is(err, ErrUnsafeTarget)):
			t.Errorf("%s: reason %q (%v), want %q", c.addr, refused.Reason, err, c.want)
		}
	}
	allowLL := newAddressGuard(nil, nil, []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")}, res)
	if err := allowLL.check(t.Context(), "x", netip.MustParseAddr("169.254.169.254")); err != nil {
		t.Errorf("link-local listed in AllowPrivate: %v", err)
	}
}

// TestGuardDial: configured endpoints are dialled as given; any other name is resolved by the
// guard, checked, and dialled by its allowed address only.
func TestGuardDial(t *testing.T) {
	t.Parallel()
	res := mapResolver{
		"cdn.example":    addrs("93.184.215.14"),
		"rebind.example": addrs("127.0.0.1", "93.184.215.14"),
		"inside.example": addrs("127.0.0.9"),
	}
	up := Registry{Name: "registry.lan", URL: &url.URL{Scheme: "https", Host: "registry.lan"}}
	g := newAddressGuard([]Registry{up}, &url.URL{Scheme: "http", Host: "shared.lan:5000"}, nil, res)
	var dialled []string
	dial := g.dial(func(_ context.Context, _, addr string) (net.Conn, error) {
		dialled = append(dialled, addr)
		return nil, errors.New("not dialled in this test")
	})
	for _, c := range []struct {
		addr    string
		dialled []string
		refused bool
	}{
		{"registry.lan:443", []string{"registry.lan:443"}, false}, // configured: unchecked, by name
		{"SHARED.lan:5000", []string{"SHARED.lan:5000"}, false},   // the chain, case-insensitive
		{"registry.lan:8443", nil, false},                         // not configured: resolved (fails: no such host)
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

// TestGuardProxy: behind a proxy from the environment the proxy is trusted and each target is
// checked by resolving its name before the request goes to the proxy.
func TestGuardProxy(t *testing.T) {
	t.Parallel()
	res := mapResolver{"cdn.example": addrs("93.184.215.14"), "inside.example": addrs("10.9.9.9")}
	up := Registry{Name: "docker.io", URL: &url.URL{Scheme: "https", Host: "registry-1.docker.io"}}
	g := newAddressGuard([]Registry{up}, nil, nil, res)
	proxyURL := &url.URL{Scheme: "http", Host: "10.0.0.1:3128"}
	proxy := g.proxy(func(*http.Request) (*url.URL, error) { return proxyURL, nil })
	for target, refused := range map[string]bool{
		"https://registry-1.docker.io/v2/": false,
		"https://cdn.example/blob":         false,
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
	if !g.trusted("10.0.0.1:3128") {
		t.Error("the proxy the environment named is not dialled as configured")
	}
}

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
		_, err := rt.RoundTrip(req)
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
