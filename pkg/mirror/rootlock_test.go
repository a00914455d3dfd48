package mirror_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// TestRootLock (newuser F20): two mirrors on one filesystem root are refused (the flock holds
// between open files even within one process, as between processes), the message names the
// root and the holder's pid, and Close frees the root. A second root is independent.
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
	_, err = mirror.New(t.Context(), opts(root))
	if !errors.Is(err, mirror.ErrRootInUse) {
		t.Fatalf("second mirror on %s: %v, want ErrRootInUse", root, err)
	}
	for _, want := range []string{"--root " + root, "pid " + strconv.Itoa(os.Getpid()), "--storage s3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q: %v", want, err)
		}
	}
	other, err := mirror.New(t.Context(), opts(filepath.Join(t.TempDir(), "other")))
	if err != nil {
		t.Fatalf("a mirror on another root: %v", err)
	}
	_ = other.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := mirror.New(t.Context(), opts(root))
	if err != nil {
		t.Fatalf("after Close the root is free: %v", err)
	}
	_ = again.Close()
}
