package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/inputfile"
	"github.com/nodecache/nodecache/internal/nodecachetest"
)

// TestFileFlagsRefuseBadFiles (new-user trial 2, items 1 and 2): every flag of every command
// that names a file, and the host files gen reads under --host-root, refuse a character device
// (/dev/zero, /dev/full), a FIFO, a directory and a regular file over the kind's limit with exit
// 2 and a message naming the file and what is wrong — never a crash, never a hang (each run
// has a deadline). Before, /dev/zero ran out of memory and a FIFO config.toml blocked forever.
func TestFileFlagsRefuseBadFiles(t *testing.T) {
	t.Parallel()
	const mirror = "http://10.0.0.5:5000"
	type flagCase struct {
		name string
		kind inputfile.Kind
		// at is where the bad file goes, under the test's directory dir; under the host root
		// H = dir/host for host files, which cannot lead to /dev (a link resolves under H).
		at   string
		host bool
		// args runs the command with the bad file at path p (dir is the test's directory).
		args func(dir, p string) []string
		// names is what the message must name (default: the path given).
		names string
		// role, when set, is how the message must call the file (a key file is not "the
		// certificate", newuser3 item 9).
		role string
	}
	serve := func(dir string, more ...string) []string {
		return append([]string{"serve", "--root", filepath.Join(dir, "root"), "--listen", "127.0.0.1:0"}, more...)
	}
	flags := []flagCase{
		{name: "serve --config", kind: inputfile.Settings, at: "settings.yaml", args: func(dir, p string) []string { return serve(dir, "--config", p) }},
		{name: "serve --upstream-auth", kind: inputfile.DockerConfig, at: "config.json", args: func(dir, p string) []string { return serve(dir, "--upstream-auth", "docker.io="+p) }},
		{name: "serve --upstream-ca", kind: inputfile.PEM, at: "ca.pem", args: func(dir, p string) []string { return serve(dir, "--upstream-ca", "docker.io="+p) }},
		{name: "serve --tls-cert", kind: inputfile.PEM, at: "cert.pem", args: func(dir, p string) []string {
			return serve(dir, "--tls-cert", p, "--tls-key", filepath.Join(dir, "ok.pem"))
		}, role: "--tls-cert: TLS certificate: /"},
		{name: "serve --tls-key", kind: inputfile.PEM, at: "key.pem", args: func(dir, p string) []string {
			return serve(dir, "--tls-cert", filepath.Join(dir, "ok.pem"), "--tls-key", p)
		}, role: "--tls-key: TLS private key: /"},
		{name: "agent --upstream-auth", kind: inputfile.DockerConfig, at: "config.json", args: func(dir, p string) []string {
			return []string{"agent", "--host-root", filepath.Join(dir, "host"), "--root", filepath.Join(dir, "root"), "--listen", "127.0.0.1:0", "--upstream-auth", "docker.io=" + p}
		}},
		{name: "gen talos -o", kind: inputfile.Patch, at: "patch.yaml", args: func(_, p string) []string { return []string{"gen", "talos", "--mirror", mirror, "-o", p} }},
		{name: "gen talos --machine-config", kind: inputfile.MachineConfig, at: "node.yaml", args: func(_, p string) []string {
			return []string{"gen", "talos", "--remove", "--mirror", mirror, "--machine-config", p}
		}},
		{name: "gen talos --mirror-ca", kind: inputfile.PEM, at: "ca.pem", args: func(_, p string) []string {
			return []string{"gen", "talos", "--mirror", "https://10.0.0.5:5000", "--mirror-ca", p}
		}},
		{name: "gen talos --config", kind: inputfile.Settings, at: "settings.yaml", args: func(_, p string) []string { return []string{"gen", "talos", "--mirror", mirror, "--config", p} }},
		{name: "gen containerd config.toml", kind: inputfile.RuntimeConfig, host: true, at: "etc/containerd/config.toml", names: "/etc/containerd/config.toml", args: func(dir, _ string) []string {
			return []string{"gen", "containerd", "--host-root", filepath.Join(dir, "host"), "--mirror", mirror, "--containerd-version", "2.1.4"}
		}},
		{name: "gen containerd hosts.toml", kind: inputfile.RuntimeConfig, host: true, at: "etc/containerd/certs.d/docker.io/hosts.toml", names: "/etc/containerd/certs.d/docker.io/hosts.toml", args: func(dir, _ string) []string {
			return []string{"gen", "containerd", "--host-root", filepath.Join(dir, "host"), "--mirror", mirror, "--containerd-version", "2.1.4"}
		}},
		{name: "gen containerd --mirror-ca", kind: inputfile.PEM, host: true, at: "ca.pem", names: "/ca.pem", args: func(dir, _ string) []string {
			return []string{"gen", "containerd", "--host-root", filepath.Join(dir, "host"), "--mirror", "https://10.0.0.5:5000", "--containerd-version", "2.1.4", "--mirror-ca", "/ca.pem"}
		}},
		{name: "gen crio registries.conf", kind: inputfile.RuntimeConfig, host: true, at: "etc/containers/registries.conf", names: "/etc/containers/registries.conf", args: func(dir, _ string) []string {
			return []string{"gen", "crio", "--host-root", filepath.Join(dir, "host"), "--mirror", mirror, "--crio-version", "1.31.0", "--no-reload"}
		}},
		{name: "gen crio drop-in", kind: inputfile.RuntimeConfig, host: true, at: "etc/containers/registries.conf.d/99-nodecache.conf", names: "/etc/containers/registries.conf.d/99-nodecache.conf", args: func(dir, _ string) []string {
			return []string{"gen", "crio", "--host-root", filepath.Join(dir, "host"), "--mirror", mirror, "--crio-version", "1.31.0", "--no-reload"}
		}},
		{name: "warm --machine-config", kind: inputfile.MachineConfig, at: "node.yaml", args: func(_, p string) []string {
			return []string{"warm", "--mirror", "http://127.0.0.1:1", "--print", "--machine-config", p}
		}},
		{name: "warm --images-from", kind: inputfile.ImageList, at: "images.txt", args: func(_, p string) []string {
			return []string{"warm", "--mirror", "http://127.0.0.1:1", "--print", "--images-from", p}
		}},
		{name: "status --config", kind: inputfile.Settings, at: "settings.yaml", args: func(dir, p string) []string {
			return []string{"status", "--host-root", filepath.Join(dir, "host"), "--config", p}
		}},
		{name: "cache ls --config", kind: inputfile.Settings, at: "settings.yaml", args: func(_, p string) []string { return []string{"cache", "ls", "--config", p} }},
	}
	bads := []struct {
		name string
		// says is the problem the message must state; "" for the size refusal of the kind.
		says string
		// make puts the bad file at p; dev is a device given instead.
		make func(t *testing.T, p string, k inputfile.Kind)
		dev  string
	}{
		{name: "/dev/zero", says: "is a character device", dev: "/dev/zero"},
		{name: "/dev/full", says: "is a character device", dev: "/dev/full"},
		{name: "fifo", says: "is a named pipe (FIFO)", make: func(t *testing.T, p string, _ inputfile.Kind) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "directory", says: "is a directory", make: func(t *testing.T, p string, _ inputfile.Kind) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "over the limit", make: func(t *testing.T, p string, k inputfile.Kind) {
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(k.Limit + 1); err != nil { // sparse: no disk used
				t.Fatal(err)
			}
		}},
	}
	for _, fc := range flags {
		for _, bad := range bads {
			if bad.dev != "" && fc.host {
				continue // a host path resolves under --host-root, where no device is
			}
			if bad.name == "fifo" && fc.kind.Pipes {
				continue // --images-from reads a pipe until its writer closes it (inputfile.TestReadPipe)
			}
			if bad.name == "directory" && fc.name == "gen crio drop-in" {
				continue // a directory among the drop-ins is no drop-in: gen lists *.conf files only
			}
			t.Run(fc.name+"/"+bad.name, func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				for _, d := range []string{"host", "root"} {
					if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
						t.Fatal(err)
					}
				}
				writeFile(t, dir, "ok.pem", "not checked before the other file\n")
				p := filepath.Join(dir, fc.at)
				if fc.host {
					p = filepath.Join(dir, "host", fc.at)
				}
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				if bad.dev != "" {
					p = bad.dev
				} else {
					bad.make(t, p, fc.kind)
				}
				names := fc.names
				if names == "" {
					names = p
				}
				type run struct {
					code           int
					stdout, stderr string
				}
				r := nodecachetest.Within(t, 30*time.Second, fmt.Sprintf("%v (blocked on %s?)", fc.args(dir, p), p), func() run {
					code, stdout, stderr := runApp(t, fc.args(dir, p)...)
					return run{code, stdout, stderr}
				})
				says := bad.says
				if says == "" {
					says = fmt.Sprintf("is %d bytes; want %s: a regular file", fc.kind.Limit+1, fc.kind.Name)
				}
				if r.code != exitUsage || !strings.Contains(r.stderr, names) || !strings.Contains(r.stderr, says) || !strings.Contains(r.stderr, fc.role) {
					t.Fatalf("exit %d, stderr %q\nwant exit 2, naming %s, saying %q and %q", r.code, r.stderr, names, fc.role, says)
				}
			})
		}
	}
}

// TestImagesFromPipes: --images-from still reads what a pipe gives — standard input ("-") and
// a named pipe such as bash's <(cmd) — bounded like a file (inputfile.ImageList.Limit).
func TestImagesFromPipes(t *testing.T) {
	t.Parallel()
	args := []string{"warm", "--mirror", "http://127.0.0.1:1", "--print", "--images-from"}
	t.Run("standard input", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runAppStdin(t, "alpine:3.20\n", append(args, "-")...)
		if code != 0 || stdout != "docker.io/library/alpine:3.20\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
	t.Run("standard input over the limit", func(t *testing.T) {
		t.Parallel()
		code, _, stderr := runAppStdin(t, strings.Repeat("\n", int(inputfile.ImageList.Limit)+1), append(args, "-")...)
		if want := "standard input holds more than 16 MiB"; code != exitUsage || !strings.Contains(stderr, want) {
			t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
		}
	})
	// newuser trial 2, F1: a writer that never writes held warm forever, and the first signal
	// did not end it. The signal is the context ending (main's NotifyContext).
	for _, src := range []string{"standard input", "named pipe"} {
		t.Run(src+" never written: a signal ends the wait", func(t *testing.T) {
			t.Parallel()
			pr, pw := io.Pipe()
			t.Cleanup(func() { _ = pw.Close() })
			var out, errOut bytes.Buffer
			app := newApp()
			app.Reader, app.Writer, app.ErrWriter = pr, &out, &errOut
			from := "-"
			if src == "named pipe" {
				from = filepath.Join(t.TempDir(), "images")
				if err := syscall.Mkfifo(from, 0o600); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { // release the reader left blocked in open
					if f, err := os.OpenFile(from, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
						_ = f.Close()
					}
				})
			}
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			code := nodecachetest.Within(t, 20*time.Second, "warm reading --images-from after its context ended", func() int {
				return report(&errOut, app.RunContext(ctx, append([]string{"nodecache"}, append(args, from)...)))
			})
			if want := "stopped while reading --images-from " + from; code != exitNegative || !strings.Contains(errOut.String(), want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 and %q", code, errOut.String(), want)
			}
		})
	}
	t.Run("named pipe", func(t *testing.T) {
		t.Parallel()
		fifo := filepath.Join(t.TempDir(), "images")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		go func() {
			if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				_, _ = f.WriteString("alpine:3.20\n")
				_ = f.Close()
			}
		}()
		code, stdout, stderr := runApp(t, append(args, fifo)...)
		if code != 0 || stdout != "docker.io/library/alpine:3.20\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
}
