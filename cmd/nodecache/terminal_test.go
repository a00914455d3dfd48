package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/ptytest"
)

// TestTerminalChecks: colours and the progress bar only on a real terminal; /dev/null is a
// character device but no terminal.
func TestTerminalChecks(t *testing.T) {
	t.Parallel()
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = devNull.Close() })
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close(); _ = pw.Close() })
	file, err := os.Create(filepath.Join(t.TempDir(), "out.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = file.Close() })

	tests := []struct {
		name string
		w    func(t *testing.T) io.Writer
		want bool
	}{
		{"pseudo-terminal", func(t *testing.T) io.Writer { _, pts := ptytest.Pair(t); return pts }, true},
		{"/dev/null", func(*testing.T) io.Writer { return devNull }, false},
		{"pipe", func(*testing.T) io.Writer { return pw }, false},
		{"regular file", func(*testing.T) io.Writer { return file }, false},
		{"buffer", func(*testing.T) io.Writer { return &bytes.Buffer{} }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := tc.w(t)
			if got := writerIsTerminal(w); got != tc.want {
				t.Fatalf("writerIsTerminal = %v, want %v", got, tc.want)
			}
			if f, ok := w.(*os.File); ok && clitext.IsTerminal(f) != tc.want {
				t.Fatalf("isTerminal = %v, want %v", !tc.want, tc.want)
			}
		})
	}
}
