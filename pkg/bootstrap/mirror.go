package bootstrap

import (
	"net/url"
	"path"
	"strings"

	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// UpstreamNames parses --upstream values (NAME or NAME=URL; gen takes the URL from Fallbacks)
// and returns the names, in order, without duplicates (name.ParseUpstreams). An empty list gives
// the default set (name.DefaultNames).
func UpstreamNames(values []string) ([]string, error) {
	if len(values) == 0 {
		return name.DefaultNames(), nil
	}
	ups, err := name.ParseUpstreams(values)
	if err != nil {
		return nil, &refusal.Error{Reason: err.Error()} // names --upstream (name.ParseUpstreams)
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
// names whose fallback is not name.RegistryURL(NAME); names given without URL, or as serve's
// NAME=offline (which names no registry address), are absent.
func Fallbacks(values []string) (map[string]string, error) {
	ups, err := name.ParseUpstreams(values)
	if err != nil {
		return nil, &refusal.Error{Reason: err.Error()} // names --upstream (name.ParseUpstreams)
	}
	out := map[string]string{}
	for i, u := range ups {
		if !strings.Contains(values[i], "=") || u.Offline {
			continue
		}
		if name.Canonical(u.Name) == name.DockerHub {
			if u.URL.Scheme != "https" || name.Canonical(hostOnly(u.URL)) != name.DockerHub {
				return nil, refusal.Errorf("--upstream %s: gen writes the registry itself as the fallback after the mirror, and docker.io's is %s: give docker.io alone (serve and agent take other URLs)", values[i], name.DockerHubURL)
			}
			continue
		}
		if !sameHost(u.Name, u.URL) {
			return nil, refusal.Errorf("--upstream %s: the URL names another host than %s: gen writes the registry itself as the fallback after the mirror (an http URL of %s itself keeps plain HTTP), never another cache; give %s alone or %s=http://%s", values[i], u.Name, u.Name, u.Name, u.Name, u.Name)
		}
		if fb := u.URL.Scheme + "://" + hostOnly(u.URL); fb != name.RegistryURL(u.Name) {
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
func sameHost(registry string, u *url.URL) bool {
	n, err := url.Parse(u.Scheme + "://" + registry)
	if err != nil {
		return false
	}
	return hostOnly(n) == hostOnly(u)
}

// CheckHostDir refuses a directory flag that is not one absolute host path: a relative path
// (it would silently be taken from /, and "../../x" would climb to /x) or a ':'-separated list.
// Empty means the default and passes. example is shown as the accepted form.
func CheckHostDir(flag, dir, example string) error {
	if dir == "" || (path.IsAbs(dir) && !strings.Contains(dir, ":")) {
		return nil
	}
	return refusal.Errorf("%s: want one absolute directory, e.g. %s; got %q", flag, example, dir)
}

// CheckTargets refuses a plan without a mirror, without upstreams, or with an upstream name that
// cannot be a registry host (the checks every runtime writer makes first).
func CheckTargets(m name.Mirror, upstreams []string) error {
	if m.URL == nil {
		return refusal.Errorf("--mirror is required")
	}
	if len(upstreams) == 0 {
		return refusal.Errorf("at least one --upstream is required")
	}
	for _, n := range upstreams {
		if err := CheckName(n); err != nil {
			return err
		}
	}
	return nil
}

// CheckName refuses an upstream name that cannot be a registry host.
func CheckName(upstream string) error {
	if _, err := name.ParseRegistry(upstream); err != nil {
		return refusal.Errorf("upstream %q: %v", upstream, err)
	}
	return nil
}
