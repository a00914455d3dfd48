// Package ptytest opens pseudo-terminals for tests of what a program does on a real terminal.
package ptytest

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Pair opens a pseudo-terminal and returns its controller and terminal sides, both closed when
// the test ends; where there are no pseudo-terminals the test is skipped.
func Pair(t testing.TB) (ptmx, pts *os.File) {
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
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	t.Cleanup(func() { _ = pts.Close() })
	return ptmx, pts
}
