package name

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
)

// URLError is a refused mirror or upstream URL: what the value was given as, the value
// (credentials redacted) and what was wrong with it, saying what is accepted.
type URLError struct {
	// Field names where the value came from, e.g. "--mirror" or `upstream "ghcr.io" URL`.
	Field string
	// Value is the value as given, with any password replaced by "xxxxx".
	Value string
	// Reason says what is wrong and what is accepted.
	Reason string
}

func (e *URLError) Error() string {
	if e.Value == "" {
		return e.Field + ": " + e.Reason
	}
	return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason)
}

// wantURL is the accepted shape, as error messages show it.
const wantURL = "want http://HOST[:PORT] or https://HOST[:PORT]"

// ParseURL parses the base URL of a registry API — the mirror (--mirror) or an upstream's
// endpoint (--upstream NAME=URL) — and returns it normalised as scheme://host[:port] with an
// empty path. field names the value in errors ("--mirror").
//
// The rules, the same for every command (docs/gen.md, "Common flags": --mirror URL; docs/serve.md,
// "Upstreams": "URL is where its API is reached (http/https, no path)"):
//   - surrounding white space is trimmed; any other space, control or non-ASCII character is
//     refused;
//   - the scheme is http or https, in any case ("HTTP://H:5000" is http://h:5000); a missing
//     scheme is refused with the fix ("did you mean http://10.0.0.5:5000?");
//   - the host is a DNS name or IPv4 address (distribution/reference's domain grammar: the
//     runtime writes it into image locations) or a bracketed IPv6 address without zone; it is
//     lower-cased;
//   - the port, if any, is a decimal number from 1 to 65535 (0, 65536 and 99999 are refused: no
//     server listens there); it is kept as given;
//   - the path is empty or "/": the registry API is at /v2/ of the host, and the upstream is
//     chosen by ?ns= or a path prefix, never by the base URL;
//   - user information (credentials), a query and a fragment are refused: nodecache pulls
//     anonymously and sends no URL parts other than its own.
//
// Errors are *URLError. The Helm chart's checks of upstreams and chain
// (charts/nodecache/templates/_validate.tpl) repeat these rules and messages (deploy/test
// TestChartValueGrammar): change both.
func ParseURL(field, s string) (*url.URL, error) {
	refuse := func(value, format string, args ...any) (*url.URL, error) {
		return nil, &URLError{Field: field, Value: redact(value), Reason: fmt.Sprintf(format, args...)}
	}
	t := strings.TrimSpace(s)
	if t == "" {
		return refuse("", "required: %s, e.g. http://10.0.0.5:5000", wantURL)
	}
	for i, c := range t {
		if c <= ' ' || c >= 0x7f {
			if redact(t) != t { // the value shown hides a password: neither its characters nor offsets
				return refuse(t, "a space, control or non-ASCII character: %s (ASCII, no spaces)", wantURL)
			}
			return refuse(t, "character %q at byte %d: %s (ASCII, no spaces)", c, i, wantURL)
		}
	}
	if !strings.Contains(t, "://") {
		if u, err := ParseURL(field, "http://"+t); err == nil {
			return refuse(t, "no scheme: did you mean %s?", u.String())
		}
		return refuse(t, "no scheme: %s", wantURL)
	}
	u, err := url.Parse(t)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return refuse(t, "not a URL (%v): %s", err, wantURL)
	}
	switch {
	case u.User != nil:
		return refuse(t, "credentials (user:password@) are not accepted: %s; nodecache pulls anonymously", wantURL)
	case u.Scheme != "http" && u.Scheme != "https":
		return refuse(t, "scheme %q: %s", u.Scheme, wantURL)
	case u.Opaque != "" || u.Host == "":
		return refuse(t, "no host: %s", wantURL)
	case u.Path != "" && u.Path != "/":
		return refuse(t, "path %q is not accepted: %s (the registry API is at /v2/ of the host)", u.Path, wantURL)
	case u.RawQuery != "" || u.ForceQuery:
		return refuse(t, "a query is not accepted: %s", wantURL)
	case u.Fragment != "" || strings.Contains(t, "#"):
		return refuse(t, "a fragment is not accepted: %s", wantURL)
	}
	h, reason := urlHost(u)
	if reason != "" {
		return refuse(t, "%s", reason)
	}
	return &url.URL{Scheme: u.Scheme, Host: h}, nil
}

// urlHost is the host[:port] of u as ParseURL returns it (the host lower-cased, an IPv6 address
// bracketed), or why u's host or port is refused.
func urlHost(u *url.URL) (h, reason string) {
	host, port := u.Hostname(), u.Port()
	if strings.HasSuffix(u.Host, ":") {
		return "", "empty port: " + wantURL
	}
	if strings.HasPrefix(u.Host, "[") {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", fmt.Sprintf("host [%s] is not an IPv6 address without zone: %s", host, wantURL)
		}
	} else if strings.Contains(host, ":") || !anchoredDomain.MatchString(host) {
		return "", fmt.Sprintf("host %q is not a DNS name or IP address: %s", host, wantURL)
	}
	if port != "" {
		if err := checkPort(port); err != nil {
			return "", err.Error()
		}
	}
	h = strings.ToLower(host)
	if strings.HasPrefix(u.Host, "[") || port != "" {
		if port == "" {
			h = "[" + h + "]"
		} else {
			h = net.JoinHostPort(h, port)
		}
	}
	return h, ""
}

// redact hides a password in a URL that carries one; anything else is returned as it is.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i := strings.Index(s, "@"); i >= 0 && strings.Contains(s[:i], "://") {
			return s[:strings.Index(s, "://")+3] + "xxxxx" + s[i:]
		}
		return s
	}
	return u.Redacted()
}

// Mirror is the nodecache endpoint a runtime or warm is pointed at (--mirror), as ParseMirror
// returns it: URL is scheme://host[:port] with an empty path. The zero Mirror means "not set".
type Mirror struct {
	URL *url.URL
}

// ParseMirror parses --mirror with the rules of ParseURL (errors are *URLError naming
// "--mirror"). Every command that takes --mirror (gen, status, warm, agent) parses it here.
func ParseMirror(s string) (Mirror, error) {
	u, err := ParseURL("--mirror", s)
	if err != nil {
		return Mirror{}, err
	}
	return Mirror{URL: u}, nil
}

// IsZero reports a Mirror that was not set (no --mirror, e.g. for gen --remove).
func (m Mirror) IsZero() bool { return m.URL == nil }

// String returns scheme://host[:port], or "" for the zero Mirror.
func (m Mirror) String() string {
	if m.URL == nil {
		return ""
	}
	return m.URL.Scheme + "://" + m.URL.Host
}

// HTTP reports a plain-HTTP mirror (no TLS settings may be written for it); false for the zero
// Mirror.
func (m Mirror) HTTP() bool { return m.URL != nil && m.URL.Scheme == "http" }

// Host returns host[:port] (lower case, IPv6 in brackets), or "" for the zero Mirror.
func (m Mirror) Host() string {
	if m.URL == nil {
		return ""
	}
	return m.URL.Host
}

// ClusterDNS reports whether the mirror's host is a Kubernetes cluster DNS name (the
// Kubernetes DNS specification, kubernetes/dns docs/specification.md): SERVICE.NAMESPACE.svc or
// POD.NAMESPACE.pod, followed by the cluster domain or not (…svc.cluster.local, …svc.k8s.example),
// a headless Service's HOST.SERVICE.NAMESPACE.svc, or any name under the default domain
// cluster.local. Only pods resolve such names (the cluster's DNS server is their resolver); a
// node's runtime resolves with the node's. False for the zero Mirror, an IP address and any
// other name (a single label too: it may be the node's own search domain's).
func (m Mirror) ClusterDNS() bool {
	if m.URL == nil {
		return false
	}
	h := strings.ToLower(m.URL.Hostname())
	if h == "cluster.local" || strings.HasSuffix(h, ".cluster.local") {
		return true
	}
	labels := strings.Split(h, ".")
	for i := 2; i < len(labels); i++ {
		if labels[i] == "svc" || labels[i] == "pod" {
			return true
		}
	}
	return false
}

// Loopback reports a mirror on the node itself (localhost, *.localhost or a loopback IP): with it
// the node cannot fall back when the local agent is down. False for the zero Mirror.
func (m Mirror) Loopback() bool {
	if m.URL == nil {
		return false
	}
	h := strings.ToLower(m.URL.Hostname())
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}
