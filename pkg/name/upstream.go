package name

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Upstream is one registry nodecache pulls through.
type Upstream struct {
	// Name is the registry host as written in image references (ParseRegistry: lower case, port
	// significant), e.g. "ghcr.io" or "localhost:5000". containerd sends it as ?ns=.
	Name string
	// URL is where the registry API is reached: scheme://host[:port], no path (ParseURL).
	URL *url.URL
}

// String returns NAME=URL.
func (u Upstream) String() string { return u.Name + "=" + u.URL.String() }

// ParseUpstream parses one --upstream value: "NAME=URL" (serve, agent) or a bare "NAME", whose URL
// is the real registry's (RegistryURL). NAME follows ParseRegistry, URL ParseURL. An error names
// the part refused once: ParseRegistry's `registry name "ghcr.io/x": ...`, or for the URL the
// name and the URL error: `docker.io: URL "ftp://x": scheme "ftp": want ...` (*URLError inside;
// credentials in the URL are never echoed).
func ParseUpstream(s string) (Upstream, error) {
	nameStr, rawURL, hasURL := strings.Cut(strings.TrimSpace(s), "=")
	n, err := ParseRegistry(nameStr)
	if err != nil {
		return Upstream{}, err
	}
	if !hasURL {
		rawURL = RegistryURL(n)
	}
	u, err := ParseURL("URL", rawURL)
	if err != nil {
		return Upstream{}, fmt.Errorf("%s: %w", n, err)
	}
	return Upstream{Name: n, URL: u}, nil
}

// ParseUpstreams parses every value (ParseUpstream) and refuses a registry configured twice,
// aliases included (docker.io and index.docker.io are one registry: Canonical). Errors are
// joined, one per refused value, each naming the flag once: `--upstream docker.io: URL "ftp://x":
// scheme "ftp": want ...`, `--upstream: registry name "ghcr.io/x": ...`, `--upstream: "ghcr.io"
// is configured twice`.
func ParseUpstreams(in []string) ([]Upstream, error) {
	var (
		out  []Upstream
		errs []error
		seen = map[string]string{}
	)
	for _, s := range in {
		u, err := ParseUpstream(s)
		var ue *URLError
		switch {
		case errors.As(err, &ue):
			errs = append(errs, fmt.Errorf("--upstream %w", err))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("--upstream: %w", err))
			continue
		}
		c := Canonical(u.Name)
		if prev, dup := seen[c]; dup {
			if prev == u.Name {
				errs = append(errs, fmt.Errorf("--upstream: %q is configured twice", u.Name))
			} else {
				errs = append(errs, fmt.Errorf("--upstream: %q is configured twice (as %q: the same registry)", u.Name, prev))
			}
			continue
		}
		seen[c] = u.Name
		out = append(out, u)
	}
	return out, errors.Join(errs...)
}

// DefaultUpstreams returns DefaultNames, each at its real registry (RegistryURL).
func DefaultUpstreams() []Upstream {
	names := DefaultNames()
	out := make([]Upstream, 0, len(names))
	for _, n := range names {
		u, err := url.Parse(RegistryURL(n))
		if err != nil {
			continue // constant input: cannot happen
		}
		out = append(out, Upstream{Name: n, URL: u})
	}
	return out
}
