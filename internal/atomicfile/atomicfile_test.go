package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWrite: the file has the bytes and the mode asked for, its directories are created, the
// temporary file is gone, and a failed write leaves the old content and no temporary file.
func TestWrite(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	p := filepath.Join(root, "a", "b", "file")
	for _, o := range []Options{{}, {Perm: 0o644, DirPerm: 0o755, SyncDir: true}, {TempDir: root}} {
		if err := Write(p, []byte("new"), o); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		fi, err := os.Stat(p)
		want := o.Perm
		if want == 0 {
			want = 0o600
		}
		if err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%+v: %v %v, want mode %v", o, fi, err, want)
		}
		if b, _ := os.ReadFile(p); string(b) != "new" {
			t.Fatalf("%+v: content %q", o, b)
		}
	}
	// The target is a directory: the rename fails, the temporary file goes.
	dir := filepath.Join(root, "a", "dir")
	if err := os.MkdirAll(filepath.Join(dir, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, []byte("x"), Options{}); err == nil {
		t.Fatal("a write over a non-empty directory succeeded")
	}
	for _, d := range []string{root, filepath.Join(root, "a"), filepath.Join(root, "a", "b")} {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.Name() != "a" && e.Name() != "b" && e.Name() != "file" && e.Name() != "dir" {
				t.Errorf("left behind in %s: %s", d, e.Name())
			}
		}
	}
}
