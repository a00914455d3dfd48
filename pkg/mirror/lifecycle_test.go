package mirror_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// TestNewStartsNothing: New only builds. Without Run it starts no goroutine at all (nothing is
// ignored: the Mirror builds no distribution App, only its storage), takes no lock on the root
// and removes nothing an earlier run left (staging files, uploads); Close then leaves no
// goroutine either.
//
//nolint:paralleltest // counts the process's goroutines: runs before the package's parallel tests
func TestNewStartsNothing(t *testing.T) {
	up := mirrortest.NewRegistry(t)
	before := goleak.IgnoreCurrent()
	root := t.TempDir()
	staged := filepath.Join(root, "nodecache", "staging", "fill-left-by-an-earlier-run")
	upload := filepath.Join(root, "docker/registry/v2/repositories/upstream.test/team/app/_uploads/u1/data")
	for _, p := range []string{staged, upload} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m, err := mirror.New(t.Context(), mirror.Options{Root: root, Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("New started goroutines: %v", err)
	}
	if locked(filepath.Join(root, "nodecache", "lock")) {
		t.Error("New took the root lock")
	}
	if m.Inventory().Ready {
		t.Error("the cache index is ready before Run (runUntilLocked takes Ready for the lock held)")
	}
	for _, p := range []string{staged, upload} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("New removed %s: %v", p, err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("goroutines left after Close: %v", err)
	}
}

// TestRootLock (newuser F20): two mirrors on one filesystem root are refused when the second
// runs (the flock holds between open files even within one process, as between processes), the
// message names the root and the holder's pid, and Close frees the root. A second root is
// independent. New takes nothing: two mirrors are built on one root without a complaint.
func TestRootLock(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	root := filepath.Join(t.TempDir(), "cache")
	opts := func(root string) mirror.Options {
		return mirror.Options{Root: root, Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)}}
	}
	first, err := mirror.New(t.Context(), opts(root))
	if err != nil {
		t.Fatal(err)
	}
	stopFirst := runUntilLocked(t, first, root)
	second, err := mirror.New(t.Context(), opts(root))
	if err != nil {
		t.Fatalf("New on a root another mirror runs on: %v (New only builds)", err)
	}
	err = second.Run(t.Context())
	if !errors.Is(err, mirror.ErrRootInUse) {
		t.Fatalf("second mirror's Run on %s: %v, want ErrRootInUse", root, err)
	}
	_ = second.Close()
	for _, want := range []string{"--root " + root, "pid " + strconv.Itoa(os.Getpid()), "--storage s3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q: %v", want, err)
		}
	}
	otherRoot := filepath.Join(t.TempDir(), "other")
	other, err := mirror.New(t.Context(), opts(otherRoot))
	if err != nil {
		t.Fatalf("a mirror on another root: %v", err)
	}
	runUntilLocked(t, other, otherRoot)()
	_ = other.Close()
	stopFirst()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := mirror.New(t.Context(), opts(root))
	if err != nil {
		t.Fatal(err)
	}
	runUntilLocked(t, again, root)()
	_ = again.Close()
}

// runUntilLocked runs m in the background until the returned stop is called, once m holds the
// lock of root.
func runUntilLocked(t *testing.T, m *mirror.Mirror, root string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Ready: Run took the lock (and wrote its pid), then loaded the index. Probing the flock
		// here would take it for a moment, and a Run locking then would find the root in use.
		if m.Inventory().Ready {
			break
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("Run on %s: %v", root, err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("Run did not lock %s within 10s", root)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// locked reports whether someone holds the flock of the lock file at path.
func locked(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}
