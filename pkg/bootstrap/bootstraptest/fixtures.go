// Package bootstraptest holds test helpers for the runtime writers: the repository's own
// runtime-config corpus (Corpus, always there), the optional folder of third-party files
// ($NODECACHE_FIXTURES, Fixtures) and host roots populated from either.
package bootstraptest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/name"
)

// Fixtures returns the real runtime config files folder: $NODECACHE_FIXTURES, else
// ../shared/fixtures next to the repository root. When it is missing the test is skipped with the
// reason, or fails when CI=true (docs/contracts.md, "Test plumbing").
func Fixtures(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("NODECACHE_FIXTURES")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		// file is <repo>/pkg/bootstrap/bootstraptest/fixtures.go
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "shared", "fixtures")
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		msg := "fixtures folder " + dir + " is missing (set NODECACHE_FIXTURES)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// Fixture reads one fixture file by its path under Fixtures, e.g. "containerd/config/kind-node-v2.toml".
func Fixture(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Fixtures(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// WriteHostFile writes data at host path p under root, creating directories.
func WriteHostFile(t testing.TB, root, p string, data []byte) {
	t.Helper()
	full := filepath.Join(root, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ReadHostFile reads host path p under root; a missing file returns nil.
func ReadHostFile(t testing.TB, root, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return b
}

// Apply makes changes (a writer's plan) under host root root, as gen does, failing t on an error.
func Apply(t testing.TB, root string, changes []bootstrap.Change) {
	t.Helper()
	if err := (bootstrap.Applier{Root: root}).Apply(t.Context(), changes); err != nil {
		t.Fatalf("apply under %s: %v", root, err)
	}
}

// Mirror parses a --mirror value as every command does (name.ParseMirror), failing t on an
// error.
func Mirror(t testing.TB, s string) name.Mirror {
	t.Helper()
	m, err := name.ParseMirror(s)
	if err != nil {
		t.Fatalf("mirror %q: %v", s, err)
	}
	return m
}

// HostRoot returns a new host root (a directory the test removes) holding files, each at its
// host path ("/etc/os-release") with its content.
func HostRoot(t testing.TB, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, data := range files {
		WriteHostFile(t, root, p, []byte(data))
	}
	return root
}
