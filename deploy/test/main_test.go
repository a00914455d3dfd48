package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// repoRoot is the nodecache checkout this module lives in (deploy/test → ../..).
var repoRoot = mustAbs(filepath.Join("..", ".."))

// binary is the nodecache binary under test: $NODECACHE_BINARY (make test-deploy passes the one
// `make build` made), else built once here.
var binary string

// readRepoFile returns the file at rel (slash-separated) in the checkout.
func readRepoFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	binary = os.Getenv("NODECACHE_BINARY")
	if binary == "" {
		dir, err := os.MkdirTemp("", "nodecache-deploy-")
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "nodecache")
		cmd := exec.Command("go", "build", "-tags", "containers_image_openpgp,exclude_graphdriver_btrfs",
			"-o", binary, "./cmd/nodecache")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("build nodecache: %v\n%s", err, out)
		}
	} else if !filepath.IsAbs(binary) {
		return 0, fmt.Errorf("NODECACHE_BINARY=%q: want an absolute path", binary)
	}
	return m.Run(), nil
}

// needTool returns the path of a tool a test needs. Without it the test skips saying why, except
// under CI=true, where .ci/run must have installed it and its absence fails the test.
func needTool(t *testing.T, name, installedBy string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	// internal/runtimetest.Find's words, which this module cannot import.
	msg := fmt.Sprintf("%s not found: put it on $PATH (%s installs it)", name, installedBy)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skip(msg)
	return ""
}
