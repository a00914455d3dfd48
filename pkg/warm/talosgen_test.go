package warm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestTalosTableUpToDate regenerates the Talos release table (go generate's command, reading
// each release's machinery through the module cache or the Go module proxy) and fails when the
// committed talos_releases_gen.go differs.
func TestTalosTableUpToDate(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: regenerating the Talos table builds and runs the generator")
	}
	out := filepath.Join(t.TempDir(), "talos_releases_gen.go")
	cmd := exec.CommandContext(t.Context(), "go", "run", "./internal/talosgen", "-o", out)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./internal/talosgen: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("talos_releases_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, committed) {
		t.Fatalf("talos_releases_gen.go is stale: run go generate ./pkg/warm\ngenerated:\n%s", got)
	}
}
