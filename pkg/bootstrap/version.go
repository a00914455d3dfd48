package bootstrap

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// Version is a runtime release version, major.minor.patch, as read from a flag, a --version line
// or a binary's build information. Each runtime's release rules are on its own type, a Version
// by another name: containerd.Release, crio.Release.
type Version struct {
	Major, Minor, Patch int
}

// IsZero reports an unknown version.
func (v Version) IsZero() bool { return v == Version{} }

// String returns "vMAJOR.MINOR.PATCH", or "unknown" for the zero Version.
func (v Version) String() string {
	if v.IsZero() {
		return "unknown"
	}
	return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// AtLeast reports v >= major.minor.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

var versionRE = regexp.MustCompile(`(?:^|[\s:=v])v?(\d+)\.(\d+)(?:\.(\d+))?`)

// ParseVersion finds the first MAJOR.MINOR[.PATCH] in s, with or without a leading "v", so it
// reads a bare "2.4.2" as well as `--version` lines: "containerd github.com/containerd/containerd/v2
// v2.4.2 abc", "containerd containerd.io 1.7.27 05044ec", "crio version 1.30.2",
// "Version:  1.31.0". Anything else is an error naming the input.
func ParseVersion(s string) (Version, error) {
	for _, m := range versionRE.FindAllStringSubmatch(" "+s, -1) {
		var v Version
		var err error
		if v.Major, err = strconv.Atoi(m[1]); err != nil {
			continue
		}
		if v.Minor, err = strconv.Atoi(m[2]); err != nil {
			continue
		}
		if m[3] != "" {
			if v.Patch, err = strconv.Atoi(m[3]); err != nil {
				continue
			}
		}
		if v.IsZero() {
			continue
		}
		return v, nil
	}
	return Version{}, fmt.Errorf("version %q: want MAJOR.MINOR[.PATCH], e.g. 2.4.2", strings.TrimSpace(s))
}

var versionFlagRE = regexp.MustCompile(`^v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$`)

// ParseVersionFlag reads a version given on the command line (--containerd-version,
// --crio-version): the whole of s is MAJOR.MINOR[.PATCH], a leading "v", a pre-release suffix
// ("-rc.1") and build metadata ("+unknown", as a containerd built from source reports) allowed
// (semver.org 9, 10), nothing else ("2.0.junk", "2.4.2.9" and "2.4.-1" are refused, not
// read as 2.0 or 2.4.2). example shows an accepted value in the error ("2.4.2").
func ParseVersionFlag(s, example string) (Version, error) {
	m := versionFlagRE.FindStringSubmatch(strings.TrimSpace(s))
	var v Version
	if m != nil {
		v.Major, _ = strconv.Atoi(m[1])
		v.Minor, _ = strconv.Atoi(m[2])
		if m[3] != "" {
			v.Patch, _ = strconv.Atoi(m[3])
		}
	}
	if v.IsZero() {
		return Version{}, fmt.Errorf("version %q: want MAJOR.MINOR[.PATCH], e.g. %s", s, example)
	}
	return v, nil
}

// binDirs are where runtime binaries live on the distributions nodecache supports.
var binDirs = []string{"/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"}

// runtimeModules are the Go modules whose version is the runtime's release, per binary name.
var runtimeModules = map[string][]string{
	"containerd": {"github.com/containerd/containerd/v2", "github.com/containerd/containerd"},
	"crio":       {"github.com/cri-o/cri-o"},
}

// BinaryVersion reads the release of the runtime binary at file (a local path: a host binary
// under --host-root, or /proc/<pid>/exe of the running daemon) from the Go build information
// the linker embedded (debug/buildinfo): a -X <module>/version.Version=… link flag (release
// builds), else the version of the runtime's module (main module or dependency; "(devel)" does
// not count). The binary is read, never run. name is "containerd" or "crio".
func BinaryVersion(file, name string) (Version, error) {
	if err := inputfile.Check(file, inputfile.Executable); err != nil {
		return Version{}, fmt.Errorf("read build information: %w", err)
	}
	bi, err := buildinfo.ReadFile(file)
	if err != nil {
		return Version{}, fmt.Errorf("read build information of %s: %w", file, err)
	}
	mods := runtimeModules[name]
	for _, st := range bi.Settings {
		if st.Key != "-ldflags" {
			continue
		}
		for _, f := range strings.Fields(st.Value) {
			for _, m := range mods {
				if v, ok := strings.CutPrefix(strings.Trim(f, `'"`), m+"/version.Version="); ok {
					if ver, err := ParseVersion(v); err == nil {
						return ver, nil
					}
				}
			}
		}
	}
	candidates := append([]*debug.Module{&bi.Main}, bi.Deps...)
	for _, m := range candidates {
		for _, want := range mods {
			if m == nil || m.Path != want || m.Version == "" || m.Version == "(devel)" {
				continue
			}
			if v, err := ParseVersion(m.Version); err == nil {
				return v, nil
			}
		}
	}
	return Version{}, fmt.Errorf("%s: no %s version in its build information (a development build?)", file, name)
}

// ProbeVersion reads the version of the runtime binary name from the first of the usual
// binary directories under root that holds it (BinaryVersion: its build information, never by
// running it). The error says what was tried.
func ProbeVersion(_ context.Context, root, name string) (Version, error) {
	if root == "" {
		root = "/"
	}
	var tried []string
	for _, d := range binDirs {
		p := filepath.Join(root, d, name)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			continue
		}
		v, err := BinaryVersion(p, name)
		if err != nil {
			tried = append(tried, err.Error())
			continue
		}
		return v, nil
	}
	if len(tried) == 0 {
		return Version{}, fmt.Errorf("no %s binary found under %s", name, strings.Join(binDirs, ", "))
	}
	return Version{}, errors.New(strings.Join(tried, "; "))
}
