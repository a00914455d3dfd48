package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/internal/clitext"
)

// openPTY opens a pseudo-terminal pair and returns its terminal side.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here (/dev/ptmx: %v)", err)
	}
	t.Cleanup(func() { _ = ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	t.Cleanup(func() { _ = pts.Close() })
	return pts
}

// TestTerminalChecks: colours and the progress bar only on a real terminal; /dev/null is a
// character device but no terminal.
func TestTerminalChecks(t *testing.T) {
	t.Parallel()
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = devNull.Close() })
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close(); _ = pw.Close() })
	file, err := os.Create(filepath.Join(t.TempDir(), "out.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = file.Close() })

	tests := []struct {
		name string
		w    func(t *testing.T) io.Writer
		want bool
	}{
		{"pseudo-terminal", func(t *testing.T) io.Writer { return openPTY(t) }, true},
		{"/dev/null", func(*testing.T) io.Writer { return devNull }, false},
		{"pipe", func(*testing.T) io.Writer { return pw }, false},
		{"regular file", func(*testing.T) io.Writer { return file }, false},
		{"buffer", func(*testing.T) io.Writer { return &bytes.Buffer{} }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := tc.w(t)
			if got := writerIsTerminal(w); got != tc.want {
				t.Fatalf("writerIsTerminal = %v, want %v", got, tc.want)
			}
			if f, ok := w.(*os.File); ok && clitext.IsTerminal(f) != tc.want {
				t.Fatalf("isTerminal = %v, want %v", !tc.want, tc.want)
			}
		})
	}
}
