package bootstrap

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/runtimetest"
)

// TestDiffAppliesWithPatch: every --dry-run diff is a unified diff that `patch -p1` applies
// from the host root and that reproduces the planned content byte for byte, including files
// without a final newline ("\ No newline at end of file"), created and removed files, and
// changes far apart (two hunks).
func TestDiffAppliesWithPatch(t *testing.T) {
	t.Parallel()
	patch := runtimetest.Find(t, runtimetest.Patch) // GNU patch; missing: skips with the reason; fails under CI=true
	long := func(lines ...string) string { return strings.Join(lines, "\n") }
	base := long("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n") + "\n"
	for _, tc := range []struct {
		name     string
		old, new string
		action   Action
		noEOL    bool // the diff must say "\ No newline at end of file"
	}{
		{"create", "", "# managed by nodecache\nx = 1\n", ActionCreate, false},
		{"create without final newline", "", "# managed by nodecache\nx = 1", ActionCreate, true},
		{"remove", "# managed by nodecache\nx = 1\n", "", ActionRemove, false},
		{"append to a file without final newline", "version = 2\n[a]\n  b = 1", "version = 2\n[a]\n  b = 1\n\n[c]\n  d = 2\n", ActionUpdate, true},
		{"change the last line, no final newline either side", "a\nb\nc", "a\nb\nC", ActionUpdate, true},
		{"drop the final newline", "a\nb\n", "a\nb", ActionUpdate, true},
		{"add the final newline", "a\nb", "a\nb\n", ActionUpdate, true},
		{"two hunks", base, strings.Replace(strings.Replace(base, "b\n", "B\n", 1), "m\n", "M\n", 1), ActionUpdate, false},
		{"one line file", "x", "y", ActionUpdate, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			const p = "/etc/demo/file.toml"
			file := filepath.Join(root, p)
			if tc.action != ActionCreate {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(tc.old), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			ch := Change{Path: p, Action: tc.action, New: []byte(tc.new)}
			if tc.action != ActionCreate {
				ch.Old = []byte(tc.old)
			}
			d, err := Diff([]Change{ch})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(d, "\n\\ No newline at end of file\n"); got != tc.noEOL {
				t.Errorf("diff says no newline at end of file: %v, want %v:\n%s", got, tc.noEOL, d)
			}
			cmd := exec.Command(patch, "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-d", root)
			cmd.Stdin = strings.NewReader(d)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("patch refused the diff: %v\n%s\ndiff:\n%s", err, out, d)
			}
			got, err := os.ReadFile(file)
			if tc.action == ActionRemove {
				if !os.IsNotExist(err) {
					t.Fatalf("patch left the removed file: %v", err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, []byte(tc.new)) {
				t.Fatalf("patched file %q (%v), want %q\ndiff:\n%s", got, err, tc.new, d)
			}
		})
	}
}
