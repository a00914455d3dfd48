package cache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// ErrRootInUse is wrapped by LockRoot's error when another process holds the lock of a
// filesystem root: two processes on one root would keep separate indexes and evict what the
// other serves.
var ErrRootInUse = errors.New("storage root in use")

// LockPath is the lock file of a filesystem root: <root>/nodecache/lock.
func LockPath(root string) string { return filepath.Join(root, "nodecache", "lock") }

// LockRoot takes an exclusive flock(2) on <root>/nodecache/lock (created if missing) and writes
// this process's pid into it. The lock is held until the returned file is closed (or the
// process ends; the kernel then releases it, so a crash leaves no stale lock).
//
// Errors: ErrRootInUse, naming root and the holder's pid when the file records one; a root
// where the lock file cannot be created.
func LockRoot(root string) (*os.File, error) {
	path := LockPath(root)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("storage root %s: %w", root, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("storage root %s: lock: %w", root, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := "another process"
		if b, rerr := inputfile.Read(path, inputfile.Lock); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				holder = "pid " + strconv.Itoa(pid)
			}
		}
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("--root %s: %w by %s (lock %s): one filesystem root serves one nodecache process; stop the other one, give this one its own --root, or share a cache between replicas with --storage s3",
				root, ErrRootInUse, holder, path)
		}
		return nil, fmt.Errorf("storage root %s: lock %s: %w", root, path, err)
	}
	// The pid is informational (for the message above); the flock is the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
