package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Version is a runtime release version (containerd, CRI-O, Talos): major.minor.patch.
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

// binDirs are where runtime binaries live on the distributions nodecache supports.
var binDirs = []string{"/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"}

// ProbeVersion runs `<root>/<bindir>/<name> --version` for the first bindir holding name (with
// root "/" or "", $PATH is searched first) and parses its output with ParseVersion. It gives up
// after 10 s. The error says what was tried.
func ProbeVersion(ctx context.Context, root, name string) (Version, error) {
	var candidates []string
	if root == "" || root == "/" {
		if p, err := exec.LookPath(name); err == nil {
			candidates = append(candidates, p)
		}
	}
	for _, d := range binDirs {
		candidates = append(candidates, filepath.Join(root, d, name))
	}
	var tried []string
	for _, p := range candidates {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(ctx, p, "--version").CombinedOutput()
		cancel()
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		v, err := ParseVersion(string(out))
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		return v, nil
	}
	if len(tried) == 0 {
		return Version{}, fmt.Errorf("%s --version: no %s binary found under %s", name, name, strings.Join(binDirs, ", "))
	}
	return Version{}, errors.New(strings.Join(tried, "; "))
}
