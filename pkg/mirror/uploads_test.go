package mirror

import (
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/nodecache/nodecache/pkg/name"
)

// writeUpload creates an upload as distribution lays it out, started at startedAt, and returns
// its directory.
func writeUpload(t *testing.T, root, repo string, startedAt time.Time) string {
	t.Helper()
	dir := filepath.Join(root, "docker/registry/v2/repositories", repo, "_uploads", uuid.NewString())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"startedat": startedAt.UTC().Format(time.RFC3339), "data": "partial blob"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func TestFillLeftoversAreRemoved(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	now := time.Now()
	// Left by an earlier run: removed when Run takes the root, whatever their age.
	fresh := writeUpload(t, root, "upstream.test/team/app", now.Add(-time.Minute))
	old := writeUpload(t, root, "upstream.test/team/app", now.Add(-48*time.Hour))
	u, _ := url.Parse("http://127.0.0.1:1")
	m, err := New(t.Context(), Options{
		Root: root, Upstreams: []name.Upstream{{Name: "upstream.test", URL: u}},
		FillTimeout: 2 * time.Hour, Clock: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if !exists(fresh) || !exists(old) {
		t.Fatalf("New removed uploads (it only builds): fresh %v, old %v", exists(fresh), exists(old))
	}
	if err := m.takeRoot(t.Context()); err != nil { // what Run does first
		t.Fatal(err)
	}
	if exists(fresh) || exists(old) {
		t.Fatalf("uploads of an earlier run survived the start: fresh %v, old %v", exists(fresh), exists(old))
	}

	// While running: the hourly sweep removes only uploads older than the fill timeout.
	for _, tc := range []struct {
		name    string
		age     time.Duration
		removed bool
	}{
		{"younger than the fill timeout", time.Hour, false},
		{"just under the fill timeout", 2*time.Hour - time.Minute, false},
		{"older than the fill timeout", 2*time.Hour + time.Minute, true},
		{"days old", 72 * time.Hour, true},
	} {
		dir := writeUpload(t, root, "upstream.test/team/"+uuid.NewString()[:8], now.Add(-tc.age))
		m.sweepUploads(t.Context())
		if got := !exists(dir); got != tc.removed {
			t.Errorf("%s: removed = %v, want %v", tc.name, got, tc.removed)
		}
	}
}
