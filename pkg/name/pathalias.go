package name

import (
	"regexp"
	"strings"
)

// pathComponent is one repository path component of the distribution spec (and reference's
// grammar): lower-case alphanumerics separated by '.', '_', '__' or dashes.
var pathComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)

// PathAlias returns the port-free path alias of a registry name with a port: host, '_', port
// ("reg.local:5005" → "reg.local_5005"). Unlike containerd's "host_port_" it is a valid
// repository path component, so it can be the first component of a repository path where a ':'
// cannot (a CRI-O mirror location "10.0.0.5:5000/reg.local_5005"). ok is false for a name
// without a port (the name itself is its path prefix) and for one whose alias would not be a path
// component (an IPv6 address). name should be normalised (ParseRegistry).
func PathAlias(name string) (alias string, ok bool) {
	host, port := splitHostPort(strings.ToLower(name))
	if port == "" || !decimal(port) {
		return "", false
	}
	a := host + "_" + port
	if !pathComponent.MatchString(a) {
		return "", false
	}
	return a, true
}

// ParsePathAlias reverses PathAlias: "reg.local_5005" → "reg.local:5005". ok is false when
// component is not host '_' port with a valid registry name; a caller routing by it must still
// check that the name is configured, since "app_1" is also an ordinary repository component.
func ParsePathAlias(component string) (name string, ok bool) {
	i := strings.LastIndex(component, "_")
	if i <= 0 || !decimal(component[i+1:]) {
		return "", false
	}
	n, err := ParseRegistry(component[:i] + ":" + component[i+1:])
	if err != nil || n != component[:i]+":"+component[i+1:] {
		return "", false
	}
	if a, ok := PathAlias(n); !ok || a != component {
		return "", false
	}
	return n, true
}
