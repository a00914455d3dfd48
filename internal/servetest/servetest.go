// Package servetest runs the nodecache binary as a node runs it, for the tests that need the
// process itself (its flags as typed, its exit, signals, resident memory): `nodecache serve` in
// front of its upstream on a root directory, `nodecache agent` next to a runtime. Every process
// is stopped when the test ends and its output quoted when the test failed; a test states only
// its extra flags and what it checks. internal/nodecachetest serves the mirror inside the test
// process instead, for the tests that need no process.
//
// This package imports the standard library and mirrortest only, so that test modules of their
// own (test/faults) can use it without nodecache's whole dependency tree.
package servetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// BuildTags are the build tags the Makefile builds nodecache with (GOTAGS).
const BuildTags = "containers_image_openpgp,exclude_graphdriver_btrfs"

// stopWait bounds the wait for a process told to stop (SIGTERM) before it is killed.
const stopWait = 30 * time.Second

// build is the one build of cmd/nodecache per test process: Binary's result.
var build struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the nodecache binary: $NODECACHE_BINARY (an absolute path; make test-faults
// passes bin/nodecache), else cmd/nodecache built once per test process with BuildTags (static,
// as released). A relative NODECACHE_BINARY or a failed build fails the test.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("NODECACHE_BINARY"); p != "" {
		if !filepath.IsAbs(p) {
			t.Fatalf("NODECACHE_BINARY=%s: must be an absolute path", p)
		}
		return p
	}
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "nodecache-bin-")
		if err != nil {
			build.err = err
			return
		}
		build.path = filepath.Join(dir, "nodecache")
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-tags", BuildTags, "-o", build.path, "./cmd/nodecache")
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/nodecache: %w\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// Result is how a nodecache command that ran to its end ended.
type Result struct {
	// Exit is the exit code; Stdout and Stderr what it wrote.
	Exit           int
	Stdout, Stderr []byte
}

// Run runs the nodecache binary (Binary) with args to its end, within the test's context, and
// returns its exit code and output. The test fails when the command could not run or did not
// exit by itself (killed by a signal).
func Run(t testing.TB, args ...string) Result {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), Binary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && (!errors.As(err, &ee) || ee.ExitCode() < 0) {
		t.Fatalf("nodecache %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return Result{Exit: cmd.ProcessState.ExitCode(), Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
}

// Process is a running nodecache process with its output (stdout and stderr together).
type Process struct {
	// Cmd is the process; Log its output so far.
	Cmd *exec.Cmd
	Log *mirrortest.LogBuffer

	done chan struct{}
	err  error // set when done is closed
}

// Start runs the nodecache binary (Binary) with args until the test ends: then it is stopped
// (Stop) and, when the test failed, the last 60 lines of its output are logged. The process is
// killed when the test process dies.
func Start(t testing.TB, args ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(Binary(t), args...), Log: &mirrortest.LogBuffer{}, done: make(chan struct{})}
	p.Cmd.Stdout, p.Cmd.Stderr = p.Log, p.Log
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start nodecache %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.Stop() // a test that cares how the process ended stops it itself and checks
		if t.Failed() {
			t.Logf("nodecache %s, last lines:\n%s", args[0], Tail(p.Log.Bytes(), 60))
		}
	})
	return p
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited; Err then says how.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit error once Done is closed (nil: exit status 0), nil before.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Stop sends SIGTERM, as a node shutting down does, and waits for the exit (SIGKILL after 30 s);
// it returns the exit error (nil: exit status 0).
func (p *Process) Stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopWait):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// Lines returns the JSON lines of the output so far (zerolog's log); other lines are skipped.
func (p *Process) Lines() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.Log.String()))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// PeakRSS is the process's peak resident set size (VmHWM in /proc/<pid>/status), bytes.
func (p *Process) PeakRSS(t testing.TB) int64 {
	t.Helper()
	n, err := PeakRSS(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ServeOptions says what is special about a test's `nodecache serve`; the zero value is a serve
// on a free 127.0.0.1 port with a temporary root in front of a new, empty upstream.
type ServeOptions struct {
	// Upstream is the registry behind serve, its only upstream and the default one
	// (--upstream <name>=<its URL> --default-upstream <name>); nil: a new mirrortest.NewRegistry.
	Upstream *mirrortest.Registry
	// UpstreamName is the upstream's name on serve; empty: its address (Upstream.Addr).
	UpstreamName string
	// Listen is --listen; empty: a free port on 127.0.0.1.
	Listen string
	// Root is --root; empty: a new temporary directory.
	Root string
	// Args are more flags, after the ones above (--peers, --upstream-timeout, ...).
	Args []string
	// ReadyWithin bounds the wait for /readyz to answer 200; zero: 60 s.
	ReadyWithin time.Duration
}

// Serve is a running `nodecache serve` that answered /readyz.
type Serve struct {
	*Process
	// URL is "http://<Listen>"; Root is its --root; Upstream the registry behind it, named
	// UpstreamName on it.
	URL, Listen, Root, UpstreamName string
	Upstream                        *mirrortest.Registry
}

// StartServe starts `nodecache serve` as o says (Start) and waits until its /readyz answers 200;
// the test fails when serve exits first or is not ready within o.ReadyWithin.
func StartServe(t testing.TB, o ServeOptions) *Serve {
	t.Helper()
	if o.Upstream == nil {
		o.Upstream = mirrortest.NewRegistry(t)
	}
	if o.UpstreamName == "" {
		o.UpstreamName = o.Upstream.Addr
	}
	if o.Listen == "" {
		o.Listen = FreeAddr(t, "127.0.0.1")
	}
	if o.Root == "" {
		o.Root = t.TempDir()
	}
	if o.ReadyWithin == 0 {
		o.ReadyWithin = 60 * time.Second
	}
	args := append([]string{"serve", "--listen", o.Listen, "--root", o.Root,
		"--upstream", o.UpstreamName + "=" + o.Upstream.URL.String(), "--default-upstream", o.UpstreamName}, o.Args...)
	s := &Serve{Process: Start(t, args...), URL: "http://" + o.Listen, Listen: o.Listen, Root: o.Root,
		UpstreamName: o.UpstreamName, Upstream: o.Upstream}
	deadline := time.Now().Add(o.ReadyWithin)
	for {
		if code, _ := Get(t.Context(), s.URL+"/readyz", time.Second); code == http.StatusOK {
			return s
		}
		select {
		case <-s.Done():
			t.Fatalf("serve exited before it was ready: %v", s.Err())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve: /readyz did not answer 200 within %s", o.ReadyWithin)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreeAddr returns "<host>:<port>" with a port free on host (a loopback address: any
// 127.0.0.0/8 address works on Linux) a moment ago.
func FreeAddr(t testing.TB, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listen on %s: %v", host, err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Get is a GET of url within d: the status code and the body, or 0 and the error's text when the
// request failed.
func Get(ctx context.Context, url string, d time.Duration) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Metric returns the value of the unlabelled sample series in the Prometheus text at url
// (a /metrics URL), or an error saying what was missing.
func Metric(ctx context.Context, url, series string) (float64, error) {
	code, body := Get(ctx, url, 10*time.Second)
	if code != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %d %s", url, code, body)
	}
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s has no %s", url, series)
}

// WaitMetric polls url (a /metrics URL) every 200 ms until its body has the line want (a
// sample, e.g. `nodecache_peers{state="live"} 2`); after within it fails the test, quoting the
// last line of the same series.
func WaitMetric(t testing.TB, url, want string, within time.Duration) {
	t.Helper()
	series := strings.SplitN(want, " ", 2)[0]
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		if code, body := Get(t.Context(), url, 10*time.Second); code == http.StatusOK {
			for _, l := range strings.Split(body, "\n") {
				if l == want {
					return
				}
				if strings.HasPrefix(l, series) {
					last = l
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: no line %q within %s (last: %q)", url, want, within, last)
}

// PeakRSS is the peak resident set size (VmHWM in /proc/<pid>/status) of process pid, bytes.
func PeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmHWM %q: %w", pid, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// Tail returns the last lines lines of b.
func Tail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
