package bootstrap

import (
	"net"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/nodecache/nodecache/pkg/mirror"
)

// Mirror is the nodecache endpoint a runtime is pointed at: scheme http or https, host and
// optional port, no path.
type Mirror struct {
	URL *url.URL
}

// ParseMirror validates --mirror: an absolute http:// or https:// URL with a host, without
// credentials, path, query or fragment, e.g. "http://10.0.0.5:5000" or "http://127.0.0.1:5000".
func ParseMirror(s string) (Mirror, error) {
	if strings.TrimSpace(s) == "" {
		return Mirror{}, Refusedf("--mirror is required: the nodecache URL the runtime pulls through, e.g. http://10.0.0.5:5000")
	}
	u, err := url.Parse(strings.TrimSpace(s))
	switch {
	case err != nil:
		return Mirror{}, Refusedf("--mirror %q: %v", s, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return Mirror{}, Refusedf("--mirror %q: scheme %q: want http:// or https://", s, u.Scheme)
	case u.Host == "" || u.Hostname() == "":
		return Mirror{}, Refusedf("--mirror %q: no host: want e.g. http://10.0.0.5:5000", s)
	case u.User != nil:
		return Mirror{}, Refusedf("--mirror %q: must not carry credentials", s)
	case strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "":
		return Mirror{}, Refusedf("--mirror %q: want scheme://host[:port] without path or query", s)
	}
	if p := u.Port(); p != "" {
		if _, err := netip.ParseAddrPort("127.0.0.1:" + p); err != nil {
			return Mirror{}, Refusedf("--mirror %q: port %q is not a number from 0 to 65535", s, p)
		}
	}
	u.Path, u.RawPath = "", ""
	u.Host = strings.ToLower(u.Host)
	return Mirror{URL: u}, nil
}

// IsZero reports a Mirror that was not set (no --mirror, e.g. for --remove).
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

// Host returns host[:port] as written in the URL, or "" for the zero Mirror.
func (m Mirror) Host() string {
	if m.URL == nil {
		return ""
	}
	return m.URL.Host
}

// Loopback reports a mirror on the node itself (localhost or a loopback IP): with it the node
// cannot fall back when the local agent is down, so --skip-fallback is refused. False for the zero
// Mirror.
func (m Mirror) Loopback() bool {
	if m.URL == nil {
		return false
	}
	h := m.URL.Hostname()
	if strings.EqualFold(h, "localhost") || strings.HasSuffix(strings.ToLower(h), ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// UpstreamNames parses --upstream values (NAME or NAME=URL; gen takes the URL from Fallbacks)
// and returns the names, in order, without
// duplicates. An empty list gives serve's default set (mirror.DefaultUpstreams).
func UpstreamNames(values []string) ([]string, error) {
	if len(values) == 0 {
		var out []string
		for _, u := range mirror.DefaultUpstreams() {
			out = append(out, u.Name)
		}
		return out, nil
	}
	ups, err := mirror.ParseUpstreams(values)
	if err != nil {
		return nil, &RefusedError{Reason: "--upstream: " + err.Error()}
	}
	out := make([]string, 0, len(ups))
	for _, u := range ups {
		out = append(out, u.Name)
	}
	return out, nil
}

// Fallbacks reads the URLs of --upstream NAME=URL values for gen: the registry gen writes as
// the fallback after the mirror. A URL whose host is NAME itself (case-insensitive; a port equal
// to the scheme's default may be left out on either side) is kept as written, scheme included,
// so an http-only private registry keeps its http fallback
// ("registry.local:5000=http://registry.local:5000"). docker.io stays https://registry-1.docker.io:
// only an https URL of docker.io, index.docker.io or registry-1.docker.io is accepted for it. A
// URL naming another host is refused (ErrRefused): gen's fallback is the registry itself, never
// another cache (serve and agent accept any URL). The result maps NAME to scheme://host[:port] for
// names whose fallback is not RegistryURL(NAME); names given without URL are absent.
func Fallbacks(values []string) (map[string]string, error) {
	ups, err := mirror.ParseUpstreams(values)
	if err != nil {
		return nil, &RefusedError{Reason: "--upstream: " + err.Error()}
	}
	out := map[string]string{}
	for i, u := range ups {
		if !strings.Contains(values[i], "=") {
			continue
		}
		if u.Name == mirror.DockerHub {
			if u.URL.Scheme != "https" || !slices.Contains([]string{"docker.io", "index.docker.io", "registry-1.docker.io"}, hostOnly(u.URL)) {
				return nil, Refusedf("--upstream %s: gen writes the registry itself as the fallback after the mirror, and docker.io's is %s: give docker.io alone (serve and agent take other URLs)", values[i], mirror.DockerHubURL)
			}
			continue
		}
		if !sameHost(u.Name, u.URL) {
			return nil, Refusedf("--upstream %s: the URL names another host than %s: gen writes the registry itself as the fallback after the mirror (an http URL of %s itself keeps plain HTTP), never another cache; give %s alone or %s=http://%s", values[i], u.Name, u.Name, u.Name, u.Name, u.Name)
		}
		if fb := u.URL.Scheme + "://" + hostOnly(u.URL); fb != RegistryURL(u.Name) {
			out[u.Name] = fb
		}
	}
	return out, nil
}

// hostOnly is the URL's lower-case host name with a default port (80 for http, 443 for https)
// left out.
func hostOnly(u *url.URL) string {
	h := strings.ToLower(u.Host)
	if p := u.Port(); (p == "443" && u.Scheme == "https") || (p == "80" && u.Scheme == "http") {
		h = strings.ToLower(u.Hostname())
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
	}
	return h
}

// sameHost reports whether u addresses the registry called name: the same host and port, a port
// equal to u's scheme default counting as none.
func sameHost(name string, u *url.URL) bool {
	n, err := url.Parse(u.Scheme + "://" + name)
	if err != nil {
		return false
	}
	return hostOnly(n) == hostOnly(u)
}

// RegistryURL is the real registry behind an upstream name: https://NAME, or
// https://registry-1.docker.io for docker.io (mirror.RegistryURL).
func RegistryURL(name string) string { return mirror.RegistryURL(name) }

// CheckHostDir refuses a directory flag that is not one absolute host path: a relative path
// (it would silently be taken from /, and "../../x" would climb to /x) or a ':'-separated list.
// Empty means the default and passes. example is shown as the accepted form.
func CheckHostDir(flag, dir, example string) error {
	if dir == "" || (path.IsAbs(dir) && !strings.Contains(dir, ":")) {
		return nil
	}
	return Refusedf("%s: want one absolute directory, e.g. %s; got %q", flag, example, dir)
}

// CheckTargets refuses a plan without a mirror, without upstreams, or with an upstream name that
// cannot be a registry host (the checks every runtime writer makes first).
func CheckTargets(m Mirror, upstreams []string) error {
	if m.URL == nil {
		return Refusedf("--mirror is required")
	}
	if len(upstreams) == 0 {
		return Refusedf("at least one --upstream is required")
	}
	for _, n := range upstreams {
		if err := CheckName(n); err != nil {
			return err
		}
	}
	return nil
}

// CheckName refuses an upstream name that cannot be a registry host.
func CheckName(name string) error {
	if _, err := mirror.NormalizeName(name); err != nil {
		return Refusedf("upstream %q: %v", name, err)
	}
	return nil
}
