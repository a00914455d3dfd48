package containerd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nodecache/nodecache/pkg/bootstrap"
)

// Release is a containerd release, MAJOR.MINOR.PATCH, and the rules of that release nodecache
// relies on: how its loader reads config.toml (gen, and status' view of the files on disk) and
// what the running daemon can tell about the configuration it loaded (status). The zero Release
// is an unknown one. Sources: containerd v1.7 and v2.0–v2.4, cmd/containerd/server/config
// (version.ConfigVersion, per-file migration), plugins/cri/images (the CRI image plugin and its
// RegistryConfigPath export, 2.4), internal/cri/server (CRI status' info["config"], 1.x).
type Release bootstrap.Version

// ParseRelease reads a release given on the command line (--containerd-version) by
// bootstrap.ParseVersionFlag's rules: the whole of s is MAJOR.MINOR[.PATCH], a leading "v", a
// pre-release ("-rc.1") and build metadata ("+unknown") allowed, nothing else. The error shows
// 2.4.2 as an example.
func ParseRelease(s string) (Release, error) {
	v, err := bootstrap.ParseVersionFlag(s, "2.4.2")
	return Release(v), err
}

// maxReportedPart bounds MAJOR and MINOR in ReportedRelease.
const maxReportedPart = 1000

// ReportedRelease reads the version a running containerd's version service reports: "v2.4.2",
// "1.7.35", "2.1.4+unknown", "1.7.28-0ubuntu1", "1.6.20~ds1". MAJOR is all digits up to the
// first ".", MINOR the digits that start what follows it (a suffix there is ignored), each at
// most 1000; a leading "v" and surrounding space are dropped and whatever follows a second "."
// is not read: the patch level changes no rule, and the Release's Patch is 0. Anything else is an
// error naming s.
func ReportedRelease(s string) (Release, error) {
	bad := fmt.Errorf("containerd version %q: want MAJOR.MINOR[.PATCH]", s)
	parts := strings.SplitN(strings.TrimPrefix(strings.TrimSpace(s), "v"), ".", 3)
	if len(parts) < 2 {
		return Release{}, bad
	}
	minor := parts[1]
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	var r Release
	for _, p := range []struct {
		digits string
		to     *int
	}{{parts[0], &r.Major}, {minor, &r.Minor}} {
		if p.digits == "" || strings.TrimLeft(p.digits, "0123456789") != "" {
			return Release{}, bad
		}
		n, err := strconv.ParseUint(p.digits, 10, 64)
		if err != nil || n > maxReportedPart {
			return Release{}, bad
		}
		*p.to = int(n)
	}
	return r, nil
}

// String returns "vMAJOR.MINOR.PATCH", or "unknown" for the zero Release.
func (r Release) String() string { return bootstrap.Version(r).String() }

// IsZero reports an unknown release.
func (r Release) IsZero() bool { return bootstrap.Version(r).IsZero() }

// atLeast reports r >= major.minor.
func (r Release) atLeast(major, minor int) bool { return bootstrap.Version(r).AtLeast(major, minor) }

// V2 reports the containerd 2.x rules: each file migrated to the current schema on its own,
// plugin tables merged deeply across imports, and the CRI registry configuration in the image
// plugin io.containerd.cri.v1.images (PluginImages); 1.x keeps the last file's whole plugin
// table and reads io.containerd.grpc.v1.cri (PluginCRIv1).
func (r Release) V2() bool { return r.Major >= 2 }

// ConfigVersion is the highest config.toml schema (`version`) the release loads, and the one it
// migrates every file to (version.ConfigVersion): 2 for 1.x, 3 for 2.0–2.2, 4 from 2.3. A file
// of a higher version stops the daemon; a lower one is migrated at every start.
func (r Release) ConfigVersion() int {
	switch {
	case !r.V2():
		return 2
	case r.atLeast(2, 3):
		return 4
	default:
		return 3
	}
}

// PluginID is the plugin whose registry table the CRI image service reads: PluginImages on 2.x,
// PluginCRIv1 on 1.x.
func (r Release) PluginID() string {
	if r.V2() {
		return PluginImages
	}
	return PluginCRIv1
}

// TransferService reports a release whose CRI pulls go through the transfer service unless
// local pull is forced (containerd >= 2.1); the transfer service reads a ":"-list config_path as
// one directory.
func (r Release) TransferService() bool { return r.atLeast(2, 1) }

// IntrospectsConfigPath reports a release whose introspection service exports the config_path
// the CRI image service runs with (PluginInfo of io.containerd.cri.v1 images:
// "RegistryConfigPath"; containerd >= 2.4).
func (r Release) IntrospectsConfigPath() bool { return r.atLeast(2, 4) }

// CRIStatusConfig reports a release whose CRI status (RuntimeService/Status, verbose) carries
// the CRI plugin's configuration, registry.configPath included (containerd 1.x). 2.0–2.3 have
// neither this nor IntrospectsConfigPath: what they loaded can only be judged by start time.
func (r Release) CRIStatusConfig() bool { return r.Major == 1 }

// genLines are the first releases of the release lines whose rules change what gen writes: 1.7
// (schema 2, PluginCRIv1), 2.0 (schema 3, PluginImages), 2.1 (the transfer service) and 2.3
// (schema 4).
func genLines() []Release {
	return []Release{{Major: 1, Minor: 7}, {Major: 2, Minor: 0}, {Major: 2, Minor: 1}, {Major: 2, Minor: 3}}
}
