package bootstrap_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
)

// The release of a real containerd binary is read from its build information, never by
// running it; under a host root the usual binary directories are searched.
func TestBinaryVersionRealContainerd(t *testing.T) {
	t.Parallel()
	for _, v := range runtimetest.Containerds() {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			bin := runtimetest.Binary(t, v.Env)
			got, err := bootstrap.BinaryVersion(bin, "containerd")
			if err != nil {
				t.Fatal(err)
			}
			if want := v.Name + "."; !strings.HasPrefix(fmt.Sprintf("%d.%d.", got.Major, got.Minor), want) {
				t.Fatalf("BinaryVersion(%s) = %s, want %sx", bin, got, want)
			}
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(bin, filepath.Join(root, "usr", "bin", "containerd")); err != nil {
				t.Fatal(err)
			}
			probed, err := bootstrap.ProbeVersion(t.Context(), root, "containerd")
			if err != nil || probed != got {
				t.Fatalf("ProbeVersion under a host root = %s, %v; want %s", probed, err, got)
			}
		})
	}
}

// A binary that is not the runtime (this test binary) or not a Go binary gives an error naming
// the file; nothing is run.
func TestBinaryVersionRefused(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "containerd")
	marker := filepath.Join(t.TempDir(), "ran")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch "+marker+"\necho containerd v9.9.9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{self, script} {
		if _, err := bootstrap.BinaryVersion(f, "containerd"); err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("BinaryVersion(%s) = %v, want an error naming it", f, err)
		}
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(script, filepath.Join(root, "usr", "bin", "containerd")); err != nil {
		t.Fatal(err)
	}
	if v, err := bootstrap.ProbeVersion(t.Context(), root, "containerd"); err == nil {
		t.Errorf("ProbeVersion over a shell script = %s, want an error", v)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a host binary was run")
	}
}
