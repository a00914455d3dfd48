package mirror_test

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

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
