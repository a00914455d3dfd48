package bootstraptest

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Tree describes everything under root, one line per entry in walk order: its path, mode, size,
// modification time (nanoseconds) and, for a regular file, the sha256 of its content, or for a
// link its target. Two calls give the same text exactly when nothing under root was created,
// removed, written, renamed or touched in between: what a reader that must not write checks.
func Tree(t testing.TB, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintf(&b, "%s %v %d %d", rel, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(data))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " -> %s", target)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatalf("describe %s: %v", root, err)
	}
	return b.String()
}

// ReadOnly runs read (named what in failures) and fails the test when it changed anything
// under root (Tree before and after) or returned an error with an empty message. It returns
// read's error: a reader refusing its input is the caller's to judge.
func ReadOnly(t testing.TB, root, what string, read func() error) error {
	t.Helper()
	before := Tree(t, root)
	err := read()
	if after := Tree(t, root); after != before {
		t.Fatalf("%s changed the host root:\nbefore\n%s\nafter\n%s", what, before, after)
	}
	if err != nil && strings.TrimSpace(err.Error()) == "" {
		t.Fatalf("%s: empty error", what)
	}
	return err
}
