package faults

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/servetest"
)

// Settings of every serve the suite starts.
const (
	// upstreamTimeout is serve's --upstream-timeout: short, so black holes and stalls cost a
	// round seconds, not minutes.
	upstreamTimeout = "2s"
	// upstreamName is the upstream's name on serve (its URL is the case's front).
	upstreamName = "upstream.test"
	// readyWithin bounds a start (an index rebuild after a kill included).
	readyWithin = 30 * time.Second
)

// serveProc is one `nodecache serve` process of a case: its root, listen address and upstream
// stay the same across restarts.
type serveProc struct {
	bin, root, listen, upstreamURL, logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	log     *os.File
}

func newServe(t *testing.T, bin, root, upstreamURL, logPath string) *serveProc {
	t.Helper()
	s := &serveProc{bin: bin, root: root, listen: servetest.FreeAddr(t, "127.0.0.1"), upstreamURL: upstreamURL, logPath: logPath}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("serve log (%s), last lines:\n%s", logPath, servetest.Tail(b, 40))
		}
	})
	return s
}

// url is the serve's base URL.
func (s *serveProc) url() string { return "http://" + s.listen }

// start starts serve and waits until /readyz answers 200.
func (s *serveProc) start(ctx context.Context) error {
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, "serve", "--listen", s.listen, "--root", s.root,
		"--upstream", upstreamName+"="+s.upstreamURL, "--default-upstream", upstreamName,
		"--upstream-timeout", upstreamTimeout, "--fill-timeout", "1m", "--log-level", "info")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("start serve: %w", err)
	}
	exited := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.exited, s.exitErr, s.log = cmd, exited, nil, f
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.exitErr = err
		s.mu.Unlock()
		close(exited)
	}()
	deadline := time.Now().Add(readyWithin)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("serve exited while starting: %w", cmp.Or(s.exitError(), errors.New("exit status 0")))
		default:
		}
		if code, _ := s.get(ctx, "/readyz", time.Second); code == http.StatusOK {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("serve not ready within %s", readyWithin)
}

func (s *serveProc) exitError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitErr
}

// signal sends sig and waits for the process to end (SIGTERM: up to 30 s, then SIGKILL).
func (s *serveProc) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd, exited, f := s.cmd, s.exited, s.log
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	_ = f.Close()
}

// kill ends serve with SIGKILL.
func (s *serveProc) kill() { s.signal(syscall.SIGKILL) }

// stop ends serve with SIGTERM, as a node shutting down does.
func (s *serveProc) stop() { s.signal(syscall.SIGTERM) }

// alive says why serve is not alive: it exited, or /healthz does not answer 200 within 10 s;
// "" when it is.
func (s *serveProc) alive(ctx context.Context) string {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	select {
	case <-exited:
		return fmt.Sprintf("serve exited: %v", s.exitError())
	default:
	}
	code, err := s.get(ctx, "/healthz", 10*time.Second)
	if code != http.StatusOK {
		return fmt.Sprintf("serve does not answer /healthz: %d %v", code, err)
	}
	return ""
}

// get is a GET of path on serve within d: status and body.
func (s *serveProc) get(ctx context.Context, path string, d time.Duration) (int, string) {
	return servetest.Get(ctx, s.url()+path, d)
}

// metric returns the value of the unlabelled sample name from serve's /metrics.
func (s *serveProc) metric(ctx context.Context, name string) (float64, error) {
	return servetest.Metric(ctx, s.url()+"/metrics", name)
}

// waitQuiet waits until serve has no blob fill in flight (within d): nothing is being written
// to its storage then.
func (s *serveProc) waitQuiet(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		var n float64
		if n, err = s.metric(ctx, "nodecache_blob_fills_in_flight"); err == nil && n == 0 {
			return nil
		} else if err == nil {
			err = fmt.Errorf("%v blob fills in flight", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not quiet after %s: %w", d, err)
}

// peakRSS is the process's peak resident set size (VmHWM, bytes).
func (s *serveProc) peakRSS() (int64, error) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return 0, errors.New("serve is not running")
	}
	return servetest.PeakRSS(cmd.Process.Pid)
}
