package crio

import "github.com/nodecache/nodecache/pkg/bootstrap"

// Release is a CRI-O release, MAJOR.MINOR.PATCH, and the rule of that release gen relies on:
// whether it has [crio.image] auto_reload_registries (CRI-O v1.30.0, pkg/config: re-read
// registries.conf and its drop-ins when they change). The zero Release is an unknown one.
type Release bootstrap.Version

// ParseRelease reads a release given on the command line (--crio-version) by
// bootstrap.ParseVersionFlag's rules: the whole of s is MAJOR.MINOR[.PATCH], a leading "v", a
// pre-release ("-rc.1") and build metadata allowed, nothing else. The error shows 1.34.1 as an
// example.
func ParseRelease(s string) (Release, error) {
	v, err := bootstrap.ParseVersionFlag(s, "1.34.1")
	return Release(v), err
}

// String returns "vMAJOR.MINOR.PATCH", or "unknown" for the zero Release.
func (r Release) String() string { return bootstrap.Version(r).String() }

// IsZero reports an unknown release.
func (r Release) IsZero() bool { return bootstrap.Version(r).IsZero() }

// AutoReloadRegistries reports a release that has [crio.image] auto_reload_registries (>= 1.30).
// An older CRI-O does not know the key, so gen writes no drop-in setting it there.
func (r Release) AutoReloadRegistries() bool { return bootstrap.Version(r).AtLeast(1, 30) }
