package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// TestGenTellsEachChangeOnceOnATerminal (issue 26): with stdout and stderr on a terminal, gen
// names each file it writes once (its report line), not a second time in a console log line,
// and says once that the containerd version is unknown. Before, every change had an INF "file
// written" line too, and the version warning came as a WRN line and as the report's warning.
func TestGenTellsEachChangeOnceOnATerminal(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/containerd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/containerd/config.toml"), []byte("version = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		files []string
		once  []string
	}{
		{[]string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--upstream", "docker.io"},
			[]string{"/etc/containerd/certs.d/docker.io/hosts.toml"}, []string{"containerd version unknown"}},
		{[]string{"gen", "crio", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--upstream", "docker.io", "--crio-version", "1.31.0"},
			[]string{"/etc/containers/registries.conf.d/90-nodecache.conf", "/etc/crio/crio.conf.d/90-nodecache.conf"}, nil},
		{[]string{"gen", "crio", "--host-root", root, "--remove"},
			[]string{"/etc/containers/registries.conf.d/90-nodecache.conf", "/etc/crio/crio.conf.d/90-nodecache.conf"}, nil},
	} {
		out := onTerminal(t, tc.args...)
		for _, s := range append(tc.files, tc.once...) {
			if n := strings.Count(out, s); n != 1 {
				t.Errorf("%v on a terminal names %s %d times, want once:\n%s", tc.args[:2], s, n, out)
			}
		}
	}
}

// onTerminal runs the nodecache binary with args, stdout and stderr on one pseudo-terminal, and
// returns what the terminal showed (line ends as written).
func onTerminal(t *testing.T, args ...string) string {
	t.Helper()
	ptmx, pts := ptytest.Pair(t)
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = pts, pts
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { _, _ = io.Copy(&out, ptmx); close(done) }()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	_ = pts.Close() // the reader ends once no one holds the terminal side
	<-done
	return strings.ReplaceAll(out.String(), "\r\n", "\n")
}
