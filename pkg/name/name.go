// Package name is nodecache's vocabulary for registries: upstream names as written in image
// references, the one alias table, the real registry's URL for a name, serve's default upstream
// set, the one parser of mirror and upstream URLs, containerd's hosts-directory names and the
// port-free path alias of a name with a port.
//
// It depends on the standard library and github.com/distribution/reference only, so every
// package (serve, gen, status, warm, agent) can share it without linking distribution's registry.
package name

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/distribution/reference"
)

// DockerHub is the registry name Docker Hub images carry in references; its API is reached at
// DockerHubURL. Single-component repositories under it get the "library/" prefix.
const (
	DockerHub    = "docker.io"
	DockerHubURL = "https://registry-1.docker.io"
)

// anchoredDomain is distribution/reference's registry grammar (DNS name, IPv4, or bracketed IPv6
// without zone, optional :port), anchored: what may precede the first "/" of an image reference.
var anchoredDomain = regexp.MustCompile(`^(?:` + reference.DomainRegexp.String() + `)$`)

// maxRegistryName is the longest registry name accepted, port included: the longest DNS name
// (RFC 1035 section 2.3.4: 255 octets on the wire, 253 characters written). It also keeps the
// path alias (PathAlias, the host and port as a repository path component for CRI-O) short
// enough for distribution/reference's 255-character repository path with a repository after it.
const maxRegistryName = 253

// ParseRegistry checks an upstream name — a registry host as written in image references, such
// as "docker.io", "ghcr.io", "registry.local:5000" or "[::1]:5000" — and returns it normalised:
// surrounding space trimmed, lower case (registry names are case-insensitive), the port kept as
// written (it is part of the name: "reg:5000" and "reg:5001" are two registries).
//
// Accepted is distribution/reference's domain grammar (reference.DomainRegexp) with a port from
// 1 to 65535 and, in brackets, an IPv6 address without zone, at most 253 characters in all.
// Refused, with an error that names the value and the accepted form: an empty name, a scheme, a
// path, credentials, a query, a port out of range, a longer name. Aliases are not resolved here: see Canonical.
func ParseRegistry(s string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(s))
	if n == "" {
		return "", fmt.Errorf("empty registry name: want a host such as ghcr.io or registry.local:5000")
	}
	if !anchoredDomain.MatchString(n) {
		return "", fmt.Errorf("registry name %q: want a host such as ghcr.io, registry.local:5000 or [::1]:5000 (no scheme, path or credentials)", s)
	}
	if len(n) > maxRegistryName {
		return "", fmt.Errorf("registry name %q is %d characters long: want at most %d (the longest DNS name, RFC 1035; as a path alias it must also leave room for a repository in the 255 characters of a repository path)", s, len(n), maxRegistryName)
	}
	host, port := splitHostPort(n)
	if strings.HasPrefix(host, "[") {
		if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err != nil || !a.Is6() || a.Zone() != "" || a.Is4In6() {
			return "", fmt.Errorf("registry name %q: %s is not an IPv6 address", s, host)
		}
	}
	if port != "" {
		if err := checkPort(port); err != nil {
			return "", fmt.Errorf("registry name %q: %w", s, err)
		}
	}
	return n, nil
}

// splitHostPort splits "host:port", "[v6]:port", "host" or "[v6]" (already grammar-checked).
// port is "" when there is none.
func splitHostPort(n string) (host, port string) {
	i := strings.LastIndexByte(n, ':')
	if i < 0 || strings.Contains(n[i:], "]") {
		return n, ""
	}
	return n[:i], n[i+1:]
}

// checkPort accepts a decimal TCP port from 1 to 65535.
func checkPort(p string) error {
	v, err := strconv.ParseUint(p, 10, 32)
	if err != nil || p == "" {
		return fmt.Errorf("port %q is not a number: want 1 to 65535", p)
	}
	if v < 1 || v > 65535 {
		return fmt.Errorf("port %s is out of range: want 1 to 65535", p)
	}
	return nil
}

// Canonical resolves the alias table: "index.docker.io" and "registry-1.docker.io" are
// "docker.io" (Docker Hub answers under all three; reference.ParseNormalizedNamed turns
// index.docker.io into docker.io). Every other name is its own canonical name. name should be
// normalised (ParseRegistry); Canonical lower-cases it anyway.
func Canonical(name string) string {
	n := strings.ToLower(name)
	switch n {
	case "index.docker.io", "registry-1.docker.io":
		return DockerHub
	}
	return n
}

// Aliases returns every name of the registry called name, canonical name first: for Docker Hub
// docker.io, index.docker.io and registry-1.docker.io; for any other registry just its name.
// The table has no other entries.
func Aliases(name string) []string {
	if c := Canonical(name); c == DockerHub {
		return []string{DockerHub, "index.docker.io", "registry-1.docker.io"}
	}
	return []string{strings.ToLower(name)}
}

// RegistryURL returns the API endpoint of the real registry called name: https://NAME, or
// DockerHubURL for Docker Hub under any of its aliases.
func RegistryURL(name string) string {
	if Canonical(name) == DockerHub {
		return DockerHubURL
	}
	return "https://" + strings.ToLower(name)
}

// DefaultNames returns the default upstream set of serve, gen and the agent, in order:
// docker.io, ghcr.io, registry.k8s.io, quay.io, gcr.io.
func DefaultNames() []string {
	return []string{DockerHub, "ghcr.io", "registry.k8s.io", "quay.io", "gcr.io"}
}
