package inputfile_test

import (
	"bytes"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/refusal"
)

var small = inputfile.Kind{Name: "a test file", Limit: 16}

// TestRead covers every file type and the size bound, through Read, ReadFS and Check.
func TestRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, n int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte("x"), n), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	exact, over := write("exact", 16), write("over", 17)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(exact, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		kind       inputfile.Kind
		want       int    // bytes read when accepted
		problem    string // part of the refusal; "" = accepted
		missing    bool
	}{
		{name: "empty", path: write("empty", 0), kind: small},
		{name: "at the limit", path: exact, kind: small, want: 16},
		{name: "symbolic link to a file", path: link, kind: small, want: 16},
		{name: "over the limit", path: over, kind: small, problem: "is 17 bytes; want a test file: a regular file of at most 16 bytes"},
		{name: "directory", path: dir, kind: small, problem: "is a directory"},
		{name: "fifo", path: fifo, kind: small, problem: "is a named pipe (FIFO); want a test file: a regular file of"},
		{name: "character device", path: "/dev/zero", kind: small, problem: "is a character device"},
		{name: "full device", path: "/dev/full", kind: small, problem: "is a character device"},
		{name: "socket", path: sock, kind: small, problem: "is a socket"},
		{name: "proc file reports size 0", path: "/proc/self/status", kind: inputfile.Proc, want: -1},
		{name: "proc file over the limit", path: "/proc/self/status", kind: inputfile.Kind{Name: "a procfs file", Limit: 8}, problem: "holds more than 8 bytes"},
		{name: "missing", path: filepath.Join(dir, "nope"), kind: small, missing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			check := func(how, source string, b []byte, err error) {
				t.Helper()
				switch {
				case tc.missing:
					if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, refusal.ErrRefused) || inputfile.Refused(err) {
						t.Fatalf("%s: err = %v, want fs.ErrNotExist and no refusal", how, err)
					}
				case tc.problem != "":
					if !errors.Is(err, refusal.ErrRefused) || !inputfile.Refused(err) || !strings.HasPrefix(err.Error(), source+" ") || !strings.Contains(err.Error(), tc.problem) {
						t.Fatalf("%s: err = %v, want a refusal of %s containing %q", how, err, source, tc.problem)
					}
				case err != nil:
					t.Fatalf("%s: %v", how, err)
				case how == "Check":
				case tc.want >= 0 && len(b) != tc.want, tc.want < 0 && len(b) == 0:
					t.Fatalf("%s: read %d bytes, want %d", how, len(b), tc.want)
				}
			}
			b, err := nodecachetest.Within(t, 5*time.Second, "Read of "+tc.path, func() result { b, err := inputfile.Read(tc.path, tc.kind); return result{b, err} }).get()
			check("Read", tc.path, b, err)
			if !strings.Contains(tc.problem, "holds more") { // Check does not read
				err := nodecachetest.Within(t, 5*time.Second, "Check of "+tc.path, func() error { return inputfile.Check(tc.path, tc.kind) })
				check("Check", tc.path, nil, err)
			}
			fsys, name := os.DirFS(filepath.Dir(tc.path)), filepath.Base(tc.path)
			b, err = nodecachetest.Within(t, 5*time.Second, "ReadFS of "+name, func() result { b, err := inputfile.ReadFS(fsys, name, "--flag "+name, tc.kind); return result{b, err} }).get()
			check("ReadFS", "--flag "+name, b, err)
		})
	}
}

type result struct {
	b   []byte
	err error
}

func (r result) get() ([]byte, error) { return r.b, r.err }

// TestReadPipe: a kind that accepts pipes reads a FIFO until its writer closes it, bounded.
func TestReadPipe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		data    string
		problem string
	}{
		{name: "within the limit", data: "alpine:3.20\n"},
		{name: "over the limit", data: strings.Repeat("y", 40), problem: "holds more than 16 bytes; want a list: a regular file or a pipe of at most 16 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fifo := filepath.Join(t.TempDir(), "fifo")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			go func() {
				f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err != nil {
					return
				}
				_, _ = f.WriteString(tc.data)
				_ = f.Close()
			}()
			b, err := nodecachetest.Within(t, 10*time.Second, "Read of the FIFO", func() result {
				b, err := inputfile.Read(fifo, inputfile.Kind{Name: "a list", Limit: 16, Pipes: true})
				return result{b, err}
			}).get()
			if tc.problem != "" {
				if !errors.Is(err, refusal.ErrRefused) || !inputfile.Refused(err) || !strings.Contains(err.Error(), tc.problem) {
					t.Fatalf("err = %v, want a refusal containing %q", err, tc.problem)
				}
				return
			}
			if err != nil || string(b) != tc.data {
				t.Fatalf("Read = %q, %v; want %q", b, err, tc.data)
			}
		})
	}
}

func TestSize(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 bytes", 1023: "1023 bytes", 1024: "1 KiB", 1536: "1.5 KiB", 4 << 20: "4 MiB", 1 << 30: "1 GiB"} {
		if got := inputfile.Size(n); got != want {
			t.Errorf("Size(%d) = %q, want %q", n, got, want)
		}
	}
}
