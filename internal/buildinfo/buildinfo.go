// Package buildinfo carries the version stamped into the binary at link time and the versions of
// the libraries built in.
package buildinfo

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"text/tabwriter"
)

// version and commit are set with
// -ldflags "-X github.com/nodecache/nodecache/internal/buildinfo.version=v1.2.3
// -X github.com/nodecache/nodecache/internal/buildinfo.commit=<git sha>" (make build, make release,
// the Dockerfile).
var (
	version = ""
	commit  = ""
)

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

// Commit returns the git commit this binary was built from: the linker-stamped value, else the
// vcs.revision the go command recorded (with "-dirty" when vcs.modified), else "unknown" (a build
// with -buildvcs=false or outside a checkout, such as `docker build` without the COMMIT argument).
func Commit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "unknown"
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return rev
}

// Module paths of the libraries whose versions Info reports.
const (
	TalosMachineryModule = "github.com/siderolabs/talos/pkg/machinery"
	ContainerdModule     = "github.com/containerd/containerd/v2"
	DistributionModule   = "github.com/distribution/distribution/v3"
)

// Info is what `nodecache version` prints. Library versions are the module versions linked into
// this binary (runtime/debug.ReadBuildInfo, replacements applied); "unknown" when the binary
// carries no module information.
type Info struct {
	Version        string `json:"version"`
	Commit         string `json:"commit"`
	Go             string `json:"go"`
	Platform       string `json:"platform"` // GOOS/GOARCH
	TalosMachinery string `json:"talos_machinery"`
	Containerd     string `json:"containerd"`
	Distribution   string `json:"distribution"`
}

// Read returns the Info of the running binary.
func Read() Info {
	info := Info{
		Version:        Version(),
		Commit:         Commit(),
		Go:             runtime.Version(),
		Platform:       runtime.GOOS + "/" + runtime.GOARCH,
		TalosMachinery: "unknown",
		Containerd:     "unknown",
		Distribution:   "unknown",
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	for _, d := range bi.Deps {
		v := d.Version
		if d.Replace != nil && d.Replace.Version != "" {
			v = d.Replace.Version
		}
		switch d.Path {
		case TalosMachineryModule:
			info.TalosMachinery = v
		case ContainerdModule:
			info.Containerd = v
		case DistributionModule:
			info.Distribution = v
		}
	}
	return info
}

// UserAgent returns the User-Agent product token for a nodecache component,
// e.g. UserAgent("warm") == "nodecache-warm/v1.2.3".
func UserAgent(component string) string {
	if component == "" {
		return "nodecache/" + Version()
	}
	return "nodecache-" + component + "/" + Version()
}

// WriteJSON writes info as one indented JSON object (nodecache version --output json).
func (i Info) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(i)
}

// WriteText writes one aligned "name  value" line per field (nodecache version).
func (i Info) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range [][2]string{
		{"nodecache", i.Version},
		{"commit", i.Commit},
		{"go", i.Go},
		{"platform", i.Platform},
		{"talos machinery", i.TalosMachinery},
		{"containerd", i.Containerd},
		{"distribution", i.Distribution},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", row[0], row[1])
	}
	return tw.Flush()
}
