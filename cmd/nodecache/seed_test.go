package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestServeSeed (issue 24, serve --seed): `nodecache serve --seed DIR` over the Talos flat
// fixture becomes ready with the bundle's images stored (cache ls lists them at once). Started
// again on the same root with one of the bundle's blobs since damaged, it is ready again: blobs
// already stored are not read from the bundle again. On a fresh root that damaged bundle stops
// serve (exit 1) naming the blob, nothing stored.
func TestServeSeed(t *testing.T) {
	t.Parallel()
	seed := t.TempDir()
	if err := os.CopyFS(seed, os.DirFS(filepath.Join("..", "..", "pkg", "bundle", "testdata", "talos", "flat"))); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	run := func(root string) (*exec.Cmd, *mirrortest.LogBuffer, string) {
		listen := nodecachetest.FreeAddr(t)
		cmd, logs := launchServe(t, nil, "--root", root, "--listen", listen, "--seed", seed, "--log-format", "json",
			"--upstream", "upstream.test:5000=offline", "--upstream", "docker.io=offline")
		return cmd, logs, listen
	}
	stop := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}

	cmd, _, listen := run(root)
	waitReady(t, nil, "http://"+listen+"/readyz", cmd.Process)
	var inv mirrorapi.CacheInventory
	runAppJSON(t, &inv, "cache", "ls", "--listen-url", "http://"+listen, "--output", "json")
	if len(inv.Images) != 3 {
		t.Fatalf("cache ls once ready: %+v, want the bundle's 3 images", inv.Images)
	}
	stop(cmd)

	if err := flipByte(filepath.Join(seed, "blob", "sha256-ffa38f83ff1fc33819c723cd940fbbf74f05929360da22b9ddd948114ceb43c8")); err != nil {
		t.Fatal(err)
	}
	cmd, logs, listen := run(root)
	waitReady(t, nil, "http://"+listen+"/readyz", cmd.Process)
	if !strings.Contains(logs.String(), `"blobs_missing":0`) || !strings.Contains(logs.String(), `"blobs_stored":0,"bytes_stored":0,"blobs_present":4`) {
		t.Errorf("second start: want no blob read again (blobs_missing 0, blobs_present 4):\n%s", logs.String())
	}
	stop(cmd)

	fresh := t.TempDir()
	cmd, logs, _ = run(fresh)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if cmd.ProcessState.ExitCode() != exitNegative || !strings.Contains(logs.String(), "blob sha256:ffa38f83ff1fc33819c723cd940fbbf74f05929360da22b9ddd948114ceb43c8") {
			t.Fatalf("serve with a damaged seed: %v (exit %d), want exit 1 naming the blob:\n%s", err, cmd.ProcessState.ExitCode(), logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve with a damaged --seed did not stop")
	}
	if entries, _ := os.ReadDir(filepath.Join(fresh, "docker", "registry", "v2", "blobs")); len(entries) != 0 {
		t.Errorf("blobs stored from a damaged seed: %v", entries)
	}

	// A bundle with an image of a registry serve has no upstream for is refused input: exit 2.
	out, err := exec.Command(binary, "serve", "--root", t.TempDir(), "--listen", nodecachetest.FreeAddr(t), "--seed", seed,
		"--upstream", "upstream.test:5000=offline").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), "docker.io is not an upstream of this serve (configured: upstream.test:5000): add it with serve --upstream docker.io[=URL]") {
		t.Errorf("serve --seed with docker.io not an upstream: %v, want exit 2 naming --upstream docker.io:\n%s", err, out)
	}
}
