package bootstrap_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// goListDeps returns the packages that patterns link (go list -deps, no tests), with the build
// tags of the Makefile and without them: a tag can only add or remove a dependency.
func goListDeps(t *testing.T, patterns ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go list needs the go command: %v", err)
	}
	var out []string
	for _, tags := range []string{"", "containers_image_openpgp,exclude_graphdriver_btrfs"} {
		args := append([]string{"list", "-deps", "-tags", tags}, patterns...)
		cmd := exec.CommandContext(t.Context(), goBin, args...)
		b, err := cmd.Output()
		if err != nil {
			var stderr string
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		out = append(out, strings.Fields(string(b))...)
	}
	return out
}

// TestNoServerDependencies: gen, status, the agent's configure pass and warm are clients of serve;
// they share its vocabulary (pkg/name) and wire contract (pkg/mirrorapi) and link neither serve
// (pkg/mirror) nor distribution's registry with its init-registered storage drivers (issue 8).
func TestNoServerDependencies(t *testing.T) {
	t.Parallel()
	deps := goListDeps(t, "github.com/nodecache/nodecache/pkg/bootstrap/...", "github.com/nodecache/nodecache/pkg/warm/...")
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %v", len(deps), deps)
	}
	var bad []string
	for _, p := range deps {
		if p == "github.com/nodecache/nodecache/pkg/mirror" || strings.HasPrefix(p, "github.com/nodecache/nodecache/pkg/mirror/") ||
			p == "github.com/distribution/distribution/v3" || strings.HasPrefix(p, "github.com/distribution/distribution/v3/") {
			bad = append(bad, p)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("pkg/bootstrap/... and pkg/warm/... link %s", strings.Join(bad, ", "))
	}
}

// TestVocabularyDependencies: pkg/name links the standard library and distribution/reference
// only (with go-digest, which reference needs); pkg/mirrorapi the standard library only.
func TestVocabularyDependencies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pkg     string
		allowed []string
	}{
		{"github.com/nodecache/nodecache/pkg/name", []string{"github.com/nodecache/nodecache/pkg/name", "github.com/distribution/reference", "github.com/opencontainers/go-digest"}},
		{"github.com/nodecache/nodecache/pkg/mirrorapi", []string{"github.com/nodecache/nodecache/pkg/mirrorapi"}},
	} {
		for _, p := range goListDeps(t, tc.pkg) {
			first, _, _ := strings.Cut(p, "/")
			if !strings.Contains(first, ".") {
				continue // standard library
			}
			ok := false
			for _, a := range tc.allowed {
				ok = ok || p == a || strings.HasPrefix(p, a+"/")
			}
			if !ok {
				t.Errorf("%s links %s", tc.pkg, p)
			}
		}
	}
}
