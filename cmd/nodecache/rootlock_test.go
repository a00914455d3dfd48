package main

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
)

// TestServeRootLocked (newuser F20): a second serve on the filesystem --root a running serve
// holds is refused with exit 2 naming the root and the holder's pid; once the first has stopped,
// the root is free again.
func TestServeRootLocked(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "cache")
	start := func(listen string) *exec.Cmd {
		cmd := exec.Command(binary, "serve", "--root", root, "--listen", listen, "--upstream", "a.test=http://127.0.0.1:1")
		cmd.Stderr = &bytes.Buffer{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	addr := nodecachetest.FreeAddr(t)
	first := start(addr)
	t.Cleanup(func() { _ = first.Process.Kill(); _ = first.Wait() })
	waitReady(t, nil, "http://"+addr+"/readyz", first.Process)

	second := exec.Command(binary, "serve", "--root", root, "--listen", nodecachetest.FreeAddr(t), "--upstream", "a.test=http://127.0.0.1:1")
	out, err := second.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("second serve on %s: err %v, want exit 2\n%s", root, err, out)
	}
	for _, want := range []string{"--root " + root, "pid " + strconv.Itoa(first.Process.Pid), "--storage s3"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("second serve's message lacks %q:\n%s", want, out)
		}
	}

	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := nodecachetest.Within(t, 20*time.Second, "first serve after SIGTERM", first.Wait); err != nil {
		t.Fatalf("first serve: %v\n%s", err, first.Stderr)
	}
	addr = nodecachetest.FreeAddr(t)
	third := start(addr)
	defer func() { _ = third.Process.Kill(); _ = third.Wait() }()
	waitReady(t, nil, "http://"+addr+"/readyz", third.Process)
}
