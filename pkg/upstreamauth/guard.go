package upstreamauth

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// Guard returns a transport to put under the authenticating transport of upstream name (reached
// at upstream) when it has credentials: it refuses, before anything is sent, every request that would carry them anywhere but the
// upstream itself or its token realm (RealmAllowed). Requests that carry the credentials are
// those with Basic authorization (the registry's own Basic challenge, or the token fetch) and
// POSTs (the OAuth2 token fetch sends an identity token or password in its body; nothing else
// nodecache sends upstream is a POST). Bearer tokens are the upstream's or a redirect target's
// own answer and are not the configured secret. A refused request fails with an error wrapping
// ErrRealmRefused, naming the upstream and the target.
func Guard(name string, upstream *url.URL, next http.RoundTripper) http.RoundTripper {
	return credentialGuard{name: name, upstream: upstream, next: next}
}

// credentialGuard is Guard's transport.
type credentialGuard struct {
	name     string
	upstream *url.URL
	next     http.RoundTripper
}

func (g credentialGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if carriesCredentials(req) {
		if err := RealmAllowed(g.upstream, req.URL); err != nil {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, fmt.Errorf("credentials of upstream %s not sent to %s://%s: %w", g.name, req.URL.Scheme, req.URL.Host, err)
		}
	}
	return g.next.RoundTrip(req)
}

func carriesCredentials(req *http.Request) bool {
	if req.Method == http.MethodPost {
		return true
	}
	scheme, _, _ := strings.Cut(req.Header.Get("Authorization"), " ")
	return strings.EqualFold(scheme, "basic")
}

// ErrRealmRefused marks a target the credentials of an upstream must not be sent to.
var ErrRealmRefused = errors.New("credentials go only to the upstream and to an https token realm on its registrable domain")

// RealmAllowed reports (nil) whether an upstream's credentials may be sent to target: the
// upstream's own host (same scheme, or https), or an https host on the same registrable domain
// (eTLD+1 by the Public Suffix List, golang.org/x/net/publicsuffix: auth.docker.io for
// registry-1.docker.io) — http only when the upstream itself is http. An upstream named by an IP
// address or a single-label name (localhost) has no registrable domain: only its own host.
//
// Errors: wrap ErrRealmRefused, saying which rule failed.
func RealmAllowed(upstream, target *url.URL) error {
	switch {
	case target.Scheme == "https":
	case target.Scheme == "http" && upstream.Scheme == "http":
	default:
		return fmt.Errorf("%w: scheme %q for an %s upstream", ErrRealmRefused, target.Scheme, upstream.Scheme)
	}
	uh, th := hostKey(upstream.Hostname()), hostKey(target.Hostname())
	if uh == th {
		return nil
	}
	ud, uerr := registrableDomain(uh)
	td, terr := registrableDomain(th)
	if uerr != nil || terr != nil || ud != td {
		return fmt.Errorf("%w: %s is not on the registrable domain of %s", ErrRealmRefused, th, uh)
	}
	return nil
}

func hostKey(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// registrableDomain is host's eTLD+1; an error for IP addresses and names without one.
func registrableDomain(host string) (string, error) {
	if _, err := netip.ParseAddr(host); err == nil {
		return "", fmt.Errorf("%s is an IP address", host)
	}
	if net.ParseIP(host) != nil || !strings.Contains(host, ".") {
		return "", fmt.Errorf("%s has no registrable domain", host)
	}
	return publicsuffix.EffectiveTLDPlusOne(host)
}
