// Package buildinfo carries the version stamped into the binary at link time.
package buildinfo

import "runtime/debug"

// version is set with -ldflags "-X github.com/nodecache/nodecache/internal/buildinfo.version=v1.2.3".
var version = ""

// Version returns the release version of this build: the linker-stamped value, else the module
// version recorded by `go install`, else "dev".
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// UserAgent returns the User-Agent product token for a nodecache component,
// e.g. UserAgent("warm") == "nodecache-warm/v1.2.3".
func UserAgent(component string) string {
	if component == "" {
		return "nodecache/" + Version()
	}
	return "nodecache-" + component + "/" + Version()
}
