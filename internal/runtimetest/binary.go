// Package runtimetest runs real container runtimes for tests: containerd daemons (2.x and 1.7)
// built by .ci/build-tools.sh, each with its own root, state, socket and config.toml, reached over
// the CRI API exactly as the kubelet reaches them.
//
// Tests that need a tool call Binary (a pinned build), Find (a program any machine may have on
// $PATH) or Unavailable, so that a missing tool skips with the reason on a developer machine and
// fails when CI=true (docs/contracts.md, "Test plumbing").
package runtimetest

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Environment variables that .ci/build-tools.sh exports: absolute paths of the tool binaries.
const (
	EnvContainerd24 = "NODECACHE_CONTAINERD_2_4" // containerd 2.4.x (config schema 3)
	EnvContainerd23 = "NODECACHE_CONTAINERD_2_3" // containerd 2.3.x (config schema 3)
	EnvContainerd17 = "NODECACHE_CONTAINERD_1_7" // containerd 1.7.x (config schema 2)
	EnvSkopeo       = "NODECACHE_SKOPEO"         // skopeo (Debian package)
	EnvCurl         = "NODECACHE_CURL"           // curl (Debian package)
)

// buildHint tells a developer how to get the binaries.
const buildHint = "run `source .ci/build-tools.sh` (builds them into ${NODECACHE_TOOLS:-$HOME/.cache/nodecache-ci} and exports the NODECACHE_* paths)"

// Containerds lists the containerd versions .ci/build-tools.sh provides, newest first, as
// {Name, Env} pairs for table tests: Name is "2.4", "2.3" or "1.7".
func Containerds() []struct{ Name, Env string } {
	return []struct{ Name, Env string }{
		{"2.4", EnvContainerd24},
		{"2.3", EnvContainerd23},
		{"1.7", EnvContainerd17},
	}
}

// InCI reports whether the tests run in CI (CI=true), where a missing tool is a failure.
func InCI() bool {
	return os.Getenv("CI") == "true"
}

// Unavailable stops the test because something it needs is missing: t.Skip with the reason on a
// developer machine, t.Fatal with the same reason when CI=true.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skip(msg)
}

// Binary returns the executable named by envVar (e.g. EnvContainerd24). When the variable is
// unset or does not name an executable file, the test is skipped with the reason (failed with
// CI=true); see Unavailable.
func Binary(t testing.TB, envVar string) string {
	t.Helper()
	p := os.Getenv(envVar)
	if p == "" {
		Unavailable(t, "%s is not set: %s", envVar, buildHint)
		return ""
	}
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		Unavailable(t, "%s=%s: %v: %s", envVar, p, err, buildHint)
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		Unavailable(t, "%s=%s is not an executable file: %s", envVar, p, buildHint)
	}
	return p
}

// Tool is a program tests run that any machine may have on $PATH (a Debian package), unlike the
// pinned builds Binary finds: Name on $PATH, or the path in Env (when Env is not empty and set),
// which .ci/build-tools.sh exports; Install says how to get it.
type Tool struct{ Name, Env, Install string }

// Tools tests run. .ci/build-tools.sh installs each (as root) from Debian; a shell is
// Tool{Name: "zsh", Install: "apt-get install zsh"}.
var (
	Skopeo  = Tool{Name: "skopeo", Env: EnvSkopeo, Install: "apt-get install skopeo"}
	Curl    = Tool{Name: "curl", Env: EnvCurl, Install: "apt-get install curl"}
	Patch   = Tool{Name: "patch", Install: "apt-get install patch"}
	Prlimit = Tool{Name: "prlimit", Install: "apt-get install util-linux"}
	IP      = Tool{Name: "ip", Install: "apt-get install iproute2"}
)

// LookPath is Find for the tool with the variable envVar and the name name (a Debian package of
// that name).
func LookPath(t testing.TB, envVar, name string) string {
	t.Helper()
	return Find(t, Tool{Name: name, Env: envVar, Install: "apt-get install " + name})
}

// Find returns the executable of tool: $Env when set (then it must name an executable file),
// else Name on $PATH. A missing tool is Unavailable, always in these words (so that the test
// summary counts the tests it stops as one reason): "<name> not found: set <Env> to its path or
// put it on $PATH (<Install>; .ci/build-tools.sh installs it)".
func Find(t testing.TB, tool Tool) string {
	t.Helper()
	if tool.Env != "" && os.Getenv(tool.Env) != "" {
		return Binary(t, tool.Env)
	}
	p, err := exec.LookPath(tool.Name)
	if err != nil {
		where := "put it on $PATH"
		if tool.Env != "" {
			where = "set " + tool.Env + " to its path or put it on $PATH"
		}
		Unavailable(t, "%s not found: %s (%s; .ci/build-tools.sh installs it)", tool.Name, where, tool.Install)
		return ""
	}
	return p
}

// RequireRoot stops the test (Unavailable) unless it runs as root, which real daemons need.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "this test starts a container runtime and must run as root (euid %d)", os.Geteuid())
	}
}

// HostsLine is the /etc/hosts line that maps every name tests dial to loopback; .ci/build-tools.sh
// adds exactly this line (TestHostsLineIsBuildTools).
const HostsLine = "127.0.0.1 upstream.test registry.hub.test auth.hub.test cdn.test"

// RequireLoopbackName stops the test (Unavailable) unless /etc/hosts maps name to a loopback
// address, saying the line to add (HostsLine), in the same words for every name. It reads the
// file instead of resolving, so a missing entry never becomes a DNS query that leaves the
// machine.
func RequireLoopbackName(t testing.TB, name string) {
	t.Helper()
	b, err := os.ReadFile("/etc/hosts")
	if err != nil {
		Unavailable(t, "read /etc/hosts to check %s: %v", name, err)
		return
	}
	if !hostsMapsToLoopback(b, name) {
		Unavailable(t, "/etc/hosts does not map the test names to loopback: add the line %q to /etc/hosts (.ci/build-tools.sh adds it)", HostsLine)
	}
}

// hostsMapsToLoopback reports whether an /etc/hosts text maps name (case-insensitive) to a
// loopback address (127.0.0.0/8 or ::1) and to nothing else: resolvers may return every address
// listed for a name, and a single non-loopback one could send a test's traffic off the machine.
func hostsMapsToLoopback(hosts []byte, name string) bool {
	found := false
	sc := bufio.NewScanner(bytes.NewReader(hosts))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		for _, n := range f[1:] {
			if !strings.EqualFold(n, name) {
				continue
			}
			a, err := netip.ParseAddr(f[0])
			if err != nil || !a.IsLoopback() {
				return false
			}
			found = true
		}
	}
	return found
}
