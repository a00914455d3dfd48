package cache

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // storage driver
	"github.com/google/uuid"
)

// newFilesystemStore is a Store over a filesystem root, its clock stopped at now.
func newFilesystemStore(t *testing.T, root string, now time.Time) *Store {
	t.Helper()
	s, err := New(t.Context(), Options{
		Root: root, Kind: KindFilesystem,
		Config:       configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": root}},
		Clock:        func() time.Time { return now },
		UploadMaxAge: 2 * time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

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

// TestTakeRemovesLeftovers: New removes nothing; Take removes every staging file and every
// upload an earlier run left, whatever their age; a second Take removes nothing (fills are in
// flight by then); the sweep Run makes every UploadSweepInterval removes only uploads older
// than Options.UploadMaxAge.
func TestTakeRemovesLeftovers(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	now := time.Now()
	fresh := writeUpload(t, root, "upstream.test/team/app", now.Add(-time.Minute))
	old := writeUpload(t, root, "upstream.test/team/app", now.Add(-48*time.Hour))
	s := newFilesystemStore(t, root, now)
	t.Cleanup(func() { _ = s.Close() })
	staged := filepath.Join(s.StagingDir(), "fill-left-by-an-earlier-run")
	if err := os.WriteFile(staged, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !exists(fresh) || !exists(old) {
		t.Fatalf("New removed uploads (it only builds): fresh %v, old %v", exists(fresh), exists(old))
	}
	first, err := s.Take(t.Context())
	if err != nil || !first {
		t.Fatalf("Take = %v, %v; want the first take", first, err)
	}
	if exists(fresh) || exists(old) || exists(staged) {
		t.Fatalf("leftovers of an earlier run survived Take: fresh upload %v, old upload %v, staging file %v", exists(fresh), exists(old), exists(staged))
	}
	inFlight := filepath.Join(s.StagingDir(), "fill-in-flight")
	if err := os.WriteFile(inFlight, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if first, err := s.Take(t.Context()); err != nil || first || !exists(inFlight) {
		t.Fatalf("second Take = %v, %v, staging file kept %v; want no second sweep", first, err, exists(inFlight))
	}

	for _, tc := range []struct {
		name    string
		age     time.Duration
		removed bool
	}{
		{"younger than the upload age", time.Hour, false},
		{"just under the upload age", 2*time.Hour - time.Minute, false},
		{"older than the upload age", 2*time.Hour + time.Minute, true},
		{"days old", 72 * time.Hour, true},
	} {
		dir := writeUpload(t, root, "upstream.test/team/"+uuid.NewString()[:8], now.Add(-tc.age))
		s.sweepUploads(t.Context())
		if got := !exists(dir); got != tc.removed {
			t.Errorf("%s: removed = %v, want %v", tc.name, got, tc.removed)
		}
	}
}

// TestTakeRootInUse: a second Store on a root another holds fails to take it with ErrRootInUse
// and removes nothing; once the first is closed, the root can be taken again.
func TestTakeRootInUse(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	now := time.Now()
	a := newFilesystemStore(t, root, now)
	if _, err := a.Take(t.Context()); err != nil {
		t.Fatal(err)
	}
	upload := writeUpload(t, root, "upstream.test/team/app", now.Add(-48*time.Hour))
	b := newFilesystemStore(t, root, now)
	t.Cleanup(func() { _ = b.Close() })
	if _, err := b.Take(t.Context()); !errors.Is(err, ErrRootInUse) {
		t.Fatalf("second Take on a held root = %v; want ErrRootInUse", err)
	}
	if !exists(upload) {
		t.Error("a Take that failed removed an upload of the process holding the root")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if first, err := b.Take(t.Context()); err != nil || !first {
		t.Fatalf("Take after the holder closed = %v, %v; want the first take", first, err)
	}
}
