package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one server process the bench started: nodecache, distribution's stock proxy or the
// plain file server. Its output goes to a log file in the work directory.
type proc struct {
	name    string
	addr    string // host:port it listens on
	cmd     *exec.Cmd
	started time.Time
	ready   time.Duration // from exec to the first 200 on /v2/ (or / for the file server)
	log     string
}

// freeAddr returns a loopback host:port nobody listened on a moment ago.
func freeAddr() (string, error) { return freeAddrOn("127.0.0.1") }

// freeAddrOn returns host:port on a loopback address host (127.0.0.2 and on need no setup on
// Linux) that nobody listened on a moment ago.
func freeAddrOn(host string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("find a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startProc execs argv with its output in logDir/<name>.log and waits up to wait for readyPath on
// addr to answer 200.
func startProc(ctx context.Context, name, addr, readyPath, logDir string, wait time.Duration, argv ...string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer lf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	p := &proc{name: name, addr: addr, cmd: cmd, log: logPath}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(wait)
	for {
		resp, err := client.Get("http://" + addr + readyPath)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.ready = time.Since(p.started)
				return p, nil
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("%s exited before answering (log %s)", name, logPath)
		case <-ctx.Done():
			p.stop()
			return nil, fmt.Errorf("%s: %w", name, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not answer %s within %s (log %s)", name, readyPath, wait, logPath)
		}
	}
}

// hwm is the process's peak resident set size in bytes (VmHWM in /proc/<pid>/status).
func (p *proc) hwm() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("peak RSS of %s: %w", p.name, err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("peak RSS of %s: VmHWM %q: %w", p.name, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("peak RSS of %s: no VmHWM in /proc/%d/status", p.name, p.cmd.Process.Pid)
}

// stop sends SIGTERM and kills the process when it has not exited after 15 s.
func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	for i := 0; i < 1500; i++ {
		if err := p.cmd.Process.Signal(syscall.Signal(0)); errors.Is(err, os.ErrProcessDone) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = p.cmd.Process.Kill()
}

// servers knows how to start each implementation under test.
type servers struct {
	nodecache string // built nodecache binary
	registry  string // distribution's registry binary (v3.1.2)
	self      string // this bench binary (its fileserve mode)
	logDir    string
}

// startNodecache runs `nodecache serve` over root with upstream bench.test=upstreamURL as the
// default upstream; extra flags are appended.
func (s servers) startNodecache(ctx context.Context, tag, root, upstreamURL string, wait time.Duration, extra ...string) (*proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return s.startNodecacheAt(ctx, tag, addr, root, upstreamURL, wait, extra...)
}

// startNodecacheAt is startNodecache listening on addr.
func (s servers) startNodecacheAt(ctx context.Context, tag, addr, root, upstreamURL string, wait time.Duration, extra ...string) (*proc, error) {
	argv := append([]string{s.nodecache, "serve", "--root", root, "--listen", addr,
		"--upstream", "bench.test=" + upstreamURL, "--default-upstream", "bench.test",
		"--log-level", "warn"}, extra...)
	return startProc(ctx, "nodecache-"+tag, addr, "/v2/", s.logDir, wait, argv...)
}

// startStock runs distribution's registry in proxy mode over root, pulling through upstreamURL.
func (s servers) startStock(ctx context.Context, tag, root, upstreamURL string, wait time.Duration) (*proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return s.startStockAt(ctx, tag, addr, root, upstreamURL, wait)
}

// startStockAt is startStock listening on addr.
func (s servers) startStockAt(ctx context.Context, tag, addr, root, upstreamURL string, wait time.Duration) (*proc, error) {
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %s
  secret: %s
proxy:
  remoteurl: %s
`, root, addr, hex.EncodeToString(secret), upstreamURL)
	cfgPath := filepath.Join(s.logDir, "stock-"+tag+".yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("stock proxy config: %w", err)
	}
	return startProc(ctx, "stock-"+tag, addr, "/v2/", s.logDir, wait, s.registry, "serve", cfgPath)
}

// startFileServer runs this binary's fileserve mode: http.ServeFile of file on every path.
func (s servers) startFileServer(ctx context.Context, file string) (*proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return startProc(ctx, "fileserver", addr, "/", s.logDir, 30*time.Second, s.self, "fileserve", addr, file)
}

// fileServe is the fileserve mode: a plain Go file server of one file, the warm-GET baseline.
func fileServe(addr, file string) error {
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, file)
	})}
	return srv.ListenAndServe()
}
