package mirror

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// DockerHub is the registry host Docker Hub images carry in references; its API lives at
// DockerHubURL. Single-component repositories under it get the "library/" prefix.
const (
	DockerHub    = "docker.io"
	DockerHubURL = "https://registry-1.docker.io"
)

// Upstream is one registry that the mirror pulls through.
type Upstream struct {
	// Name is the registry host as written in image references (e.g. "ghcr.io",
	// "localhost:5000"), lower case, port significant. containerd sends it as ?ns=.
	Name string
	// URL is where the registry API is reached: scheme http or https, host, no path.
	URL *url.URL
}

// String returns NAME=URL.
func (u Upstream) String() string { return u.Name + "=" + u.URL.String() }

// DefaultUpstreams returns serve's default set: docker.io, ghcr.io, registry.k8s.io, quay.io,
// gcr.io, each at its real API endpoint.
func DefaultUpstreams() []Upstream {
	var out []Upstream
	for _, s := range []string{
		DockerHub + "=" + DockerHubURL,
		"ghcr.io=https://ghcr.io",
		"registry.k8s.io=https://registry.k8s.io",
		"quay.io=https://quay.io",
		"gcr.io=https://gcr.io",
	} {
		u, err := ParseUpstream(s)
		if err != nil {
			panic(err) // constant input
		}
		out = append(out, u)
	}
	return out
}

// ParseUpstream parses "NAME=URL" (serve, agent) or, with a bare "NAME", derives the URL of the
// real registry: https://NAME, or DockerHubURL for docker.io.
//
// NAME must be a registry host (DNS name or IP, optional port), URL an absolute http or https URL
// without path, query or credentials. Errors name the part that was refused.
func ParseUpstream(s string) (Upstream, error) {
	nameStr, rawURL, hasURL := strings.Cut(strings.TrimSpace(s), "=")
	n, err := NormalizeName(nameStr)
	if err != nil {
		return Upstream{}, fmt.Errorf("upstream %q: %w", s, err)
	}
	if !hasURL {
		rawURL = RegistryURL(n)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return Upstream{}, fmt.Errorf("upstream %q: url: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return Upstream{}, fmt.Errorf("upstream %q: url scheme %q: want http or https", s, u.Scheme)
	case u.Host == "":
		return Upstream{}, fmt.Errorf("upstream %q: url has no host", s)
	case u.User != nil:
		return Upstream{}, fmt.Errorf("upstream %q: url must not carry credentials", s)
	case strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "":
		return Upstream{}, fmt.Errorf("upstream %q: url must be scheme://host[:port] without path or query", s)
	}
	u.Path, u.RawPath = "", ""
	return Upstream{Name: n, URL: u}, nil
}

// NormalizeName checks a registry host as written in image references and returns it lower case.
func NormalizeName(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return "", errors.New("empty registry name")
	}
	if strings.ContainsAny(s, "/@=?#") {
		return "", fmt.Errorf("registry name %q: want a host such as ghcr.io or registry.local:5000", s)
	}
	if _, err := name.NewRegistry(s, name.StrictValidation); err != nil {
		return "", fmt.Errorf("registry name %q: %w", s, err)
	}
	return s, nil
}

// RegistryURL returns the API endpoint of the real registry called name: https://name, or
// DockerHubURL for docker.io.
func RegistryURL(name string) string {
	if name == DockerHub {
		return DockerHubURL
	}
	return "https://" + name
}

// ParseUpstreams parses every entry and refuses duplicate names.
func ParseUpstreams(in []string) ([]Upstream, error) {
	var (
		out  []Upstream
		errs []error
		seen = map[string]bool{}
	)
	for i, s := range in {
		u, err := ParseUpstream(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("upstream[%d]: %w", i, err))
			continue
		}
		if seen[u.Name] {
			errs = append(errs, fmt.Errorf("upstream[%d]: %q is configured twice", i, u.Name))
			continue
		}
		seen[u.Name] = true
		out = append(out, u)
	}
	return out, errors.Join(errs...)
}
