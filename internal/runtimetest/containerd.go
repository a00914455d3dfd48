package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Timeouts of the daemon's lifecycle.
const (
	// readyTimeout bounds how long Start waits for the CRI API to answer on the socket.
	readyTimeout = 90 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 15 * time.Second
	// pollInterval is the readiness poll period.
	pollInterval = 100 * time.Millisecond
	// logTailLines is how many log lines a failure message quotes.
	logTailLines = 60
)

// Containerd is one containerd daemon run by a test: its own config.toml, root, state and socket,
// started with `containerd --config <Dir>/config.toml` in its own process group, stopped (group
// killed) when the test ends.
//
// Life cycle, so a test can run a config generator between the steps:
//
//	c := NewContainerd(t, bin, cfg) // writes config.toml, starts nothing
//	gen(c.ConfigFile())             // e.g. pkg/bootstrap/containerd editing it in place
//	c.Start(t)                      // daemon up, CRI answering
//	...edit again...
//	c.Restart(t)                    // containerd reads config_path only at start
//
// StartContainerd does the first and third step at once.
type Containerd struct {
	bin     string
	version string // as `containerd --version` prints it, without "v": "2.4.2+unknown"
	major   int
	schema  int

	dir, root, state, sock, configFile, logFile string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the current process was reaped
	started time.Time
	starts  int
	conn    *grpc.ClientConn
}

// NewContainerd prepares a daemon of binary bin: it asks the binary for its version, writes
// config.toml (see ContainerdConfig) and registers cleanup, but starts nothing. It fails the test
// when bin does not run or the config does not render. Tests call RequireRoot first.
func NewContainerd(t testing.TB, bin string, cfg ContainerdConfig) *Containerd {
	t.Helper()
	version, err := containerdVersion(t.Context(), bin)
	if err != nil {
		t.Fatalf("containerd binary %s: %v", bin, err)
	}
	major, err := majorOf(version)
	if err != nil {
		t.Fatalf("containerd binary %s: %v", bin, err)
	}
	dir := cfg.Dir
	if dir == "" {
		dir = t.TempDir()
	}
	c := &Containerd{
		bin: bin, version: version, major: major,
		dir:        dir,
		root:       filepath.Join(dir, "root"),
		state:      filepath.Join(dir, "state"),
		configFile: filepath.Join(dir, configFileName),
		logFile:    filepath.Join(dir, logFileName),
	}
	c.sock = filepath.Join(dir, socketFileName)
	// The ttrpc socket is "<grpc address>.ttrpc" and shim sockets live under state: keep both
	// under the unix socket path limit with a short directory when the test's one is deep.
	if len(c.sock)+len(".ttrpc") > unixSocketMaxLen {
		short, err := os.MkdirTemp("", "ctrd-")
		if err != nil {
			t.Fatalf("socket directory: %v", err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(short) })
		c.sock = filepath.Join(short, socketFileName)
	}
	c.WriteConfig(t, cfg)
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			t.Logf("containerd %s log %s (last %d lines):\n%s", c.version, c.logFile, logTailLines, c.LogTail(logTailLines))
		}
	})
	return c
}

// WriteConfig renders cfg into ConfigFile again (same root, state and socket; cfg.Dir is
// ignored), replacing the file atomically. A running daemon does not see the change until
// Restart: containerd reads config.toml only at start.
func (c *Containerd) WriteConfig(t testing.TB, cfg ContainerdConfig) {
	t.Helper()
	out, schema, err := containerdConfigTOML(cfg, c.major, c.root, c.state, c.sock)
	if err != nil {
		t.Fatalf("containerd %s config: %v", c.version, err)
	}
	tmp := c.configFile + ".tmp"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		t.Fatalf("write %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, c.configFile); err != nil {
		t.Fatalf("replace %s: %v", c.configFile, err)
	}
	c.mu.Lock()
	c.schema = schema
	c.mu.Unlock()
}

// StartContainerd is NewContainerd followed by Start.
func StartContainerd(t testing.TB, bin string, cfg ContainerdConfig) *Containerd {
	t.Helper()
	c := NewContainerd(t, bin, cfg)
	c.Start(t)
	return c
}

// Start runs the daemon on ConfigFile and waits until its CRI API answers (RuntimeService.Version
// and ImageService.ListImages), at most 90 s. It fails the test, quoting the log, when the
// process exits, the CRI plugin is not served, or the timeout passes. Starting a running daemon
// fails the test.
func (c *Containerd) Start(t testing.TB) {
	t.Helper()
	c.start(t, true)
}

// StartWithoutCRI runs the daemon like Start but waits only for its version service: for a
// configuration whose CRI plugin fails to load (containerd still serves version and
// introspection then).
func (c *Containerd) StartWithoutCRI(t testing.TB) {
	t.Helper()
	c.start(t, false)
}

func (c *Containerd) start(t testing.TB, cri bool) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		t.Fatalf("containerd %s: Start while running (pid %d)", c.version, c.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(c.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", c.logFile, err)
	}
	defer logf.Close()
	c.starts++
	fmt.Fprintf(logf, "=== runtimetest: start #%d of %s --config %s at %s\n",
		c.starts, c.bin, c.configFile, time.Now().Format(time.RFC3339Nano))

	cmd := exec.Command(c.bin, "--config", c.configFile)
	cmd.Env = daemonEnv(os.Environ())
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group so Stop can kill the daemon with anything it spawned; SIGKILL when
	// the test binary dies so no daemon outlives the run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", c.bin, err)
	}
	c.cmd, c.started = cmd, time.Now()
	exited := make(chan struct{})
	c.exited = exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()

	conn, err := grpc.NewClient("unix://"+c.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc client for %s: %v", c.sock, err)
	}
	c.conn = conn
	wait := c.waitReady
	if !cri {
		wait = c.waitVersion
	}
	if err := wait(t.Context(), exited, conn); err != nil {
		t.Fatalf("containerd %s on %s: %v\nlog (last %d lines):\n%s", c.version, c.sock, err, logTailLines, c.LogTail(logTailLines))
	}
}

// waitReady polls the CRI API until it answers, the process exits or readyTimeout passes.
func (c *Containerd) waitReady(ctx context.Context, exited <-chan struct{}, conn *grpc.ClientConn) error {
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	is := runtimeapi.NewImageServiceClient(conn)
	return c.poll(ctx, exited, "CRI API", func(ctx context.Context) (bool, error) {
		if _, err := os.Stat(c.sock); err != nil {
			return false, err
		}
		_, err := rs.Version(ctx, &runtimeapi.VersionRequest{})
		if err == nil {
			_, err = is.ListImages(ctx, &runtimeapi.ListImagesRequest{})
		}
		// containerd serves gRPC only after every plugin loaded: a missing service now means the
		// CRI plugin failed to load, and waiting will not change that.
		if status.Code(err) == codes.Unimplemented {
			return true, fmt.Errorf("CRI API not served (CRI plugin failed to load?): %w", err)
		}
		return false, err
	})
}

// waitVersion polls containerd's version service until it answers, the process exits or
// readyTimeout passes.
func (c *Containerd) waitVersion(ctx context.Context, exited <-chan struct{}, conn *grpc.ClientConn) error {
	vs := versionapi.NewVersionClient(conn)
	return c.poll(ctx, exited, "version service", func(ctx context.Context) (bool, error) {
		_, err := vs.Version(ctx, &emptypb.Empty{})
		return false, err
	})
}

// poll calls probe every pollInterval, each call given 2 s, until it returns nil or an error it
// calls final (waiting will not change it), the process exits (exited closes) or readyTimeout
// passes; what names the service in the timeout's error.
func (c *Containerd) poll(ctx context.Context, exited <-chan struct{}, what string, probe func(context.Context) (final bool, err error)) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var last error
	for {
		select {
		case <-exited:
			return fmt.Errorf("daemon exited during start (%s)", c.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: last error: %w", what, readyTimeout, last)
		case <-time.After(pollInterval):
		}
		callCtx, callCancel := context.WithTimeout(ctx, 2*time.Second)
		final, err := probe(callCtx)
		callCancel()
		if err == nil || final {
			return err
		}
		last = err
	}
}

// Stop sends SIGTERM to the daemon's process group, SIGKILL after 15 s, and waits for it to exit.
// It is a no-op when the daemon is not running, and runs at test cleanup.
func (c *Containerd) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return
	}
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
	pid := c.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-c.exited
	}
	// Anything left in the group (a daemon child) goes too.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	c.cmd, c.exited = nil, nil
}

// Restart stops the daemon (when running) and starts it again on the same config.toml, root and
// socket: the way to make containerd read a changed config_path, which it reads only at start.
func (c *Containerd) Restart(t testing.TB) {
	t.Helper()
	c.Stop()
	c.Start(t)
}

// PID returns the daemon's process id, 0 when it is not running.
func (c *Containerd) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Started returns the wall-clock time just after the current process was spawned (zero when not
// running). The kernel's start time (/proc/<pid>/stat) is at most this.
func (c *Containerd) Started() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return time.Time{}
	}
	return c.started
}

// Socket returns the path of the daemon's gRPC socket (CRI, introspection, …).
func (c *Containerd) Socket() string { return c.sock }

// ConfigFile returns the path of the daemon's config.toml.
func (c *Containerd) ConfigFile() string { return c.configFile }

// Dir returns the directory holding config.toml, root/, state/ and containerd.log.
func (c *Containerd) Dir() string { return c.dir }

// Version returns the version the binary reports, without a leading "v", e.g. "2.4.2+unknown"
// or "1.7.35+unknown". containerd sends User-Agent "containerd/" + this.
func (c *Containerd) Version() string { return c.version }

// Major returns the major version (1 or 2).
func (c *Containerd) Major() int { return c.major }

// Schema returns the config.toml `version` that NewContainerd or WriteConfig wrote (2, 3 or 4).
func (c *Containerd) Schema() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.schema
}

// UserAgent returns the User-Agent the daemon sends to registries: "containerd/<Version>".
func (c *Containerd) UserAgent() string { return "containerd/" + c.version }

// Log returns the daemon's combined stdout and stderr across every start so far; each start
// begins with a "=== runtimetest: start #N" line.
func (c *Containerd) Log() string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", c.logFile, err)
	}
	return string(b)
}

// LogTail returns the last n lines of Log.
func (c *Containerd) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(c.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errNotRunning is returned by CRI calls on a stopped daemon.
var errNotRunning = errors.New("runtimetest: containerd is not running")

// Conn returns the gRPC connection to the running daemon's socket (nil when stopped); it is
// closed by Stop. Use it for services this package does not wrap.
func (c *Containerd) Conn() *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// ImageService returns a CRI ImageService client on the running daemon.
func (c *Containerd) ImageService() (runtimeapi.ImageServiceClient, error) {
	conn := c.Conn()
	if conn == nil {
		return nil, errNotRunning
	}
	return runtimeapi.NewImageServiceClient(conn), nil
}

// RuntimeService returns a CRI RuntimeService client on the running daemon (Status, Version).
func (c *Containerd) RuntimeService() (runtimeapi.RuntimeServiceClient, error) {
	conn := c.Conn()
	if conn == nil {
		return nil, errNotRunning
	}
	return runtimeapi.NewRuntimeServiceClient(conn), nil
}

// PullImage pulls ref (e.g. "upstream.test:5000/team/app:v1") through the CRI ImageService,
// exactly as the kubelet does, and returns the image id containerd reports.
func (c *Containerd) PullImage(ctx context.Context, ref string) (string, error) {
	is, err := c.ImageService()
	if err != nil {
		return "", fmt.Errorf("CRI PullImage %q: %w", ref, err)
	}
	resp, err := is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return "", fmt.Errorf("CRI PullImage %q: %w", ref, err)
	}
	return resp.GetImageRef(), nil
}

// PullImageWithAuth pulls ref like PullImage with the pull credentials the kubelet takes from
// a pod's imagePullSecrets (CRI PullImageRequest.Auth).
func (c *Containerd) PullImageWithAuth(ctx context.Context, ref string, auth *runtimeapi.AuthConfig) (string, error) {
	is, err := c.ImageService()
	if err != nil {
		return "", fmt.Errorf("CRI PullImage %q: %w", ref, err)
	}
	resp, err := is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Auth: auth})
	if err != nil {
		return "", fmt.Errorf("CRI PullImage %q: %w", ref, err)
	}
	return resp.GetImageRef(), nil
}

// RemoveImage removes ref (a reference or image id) through the CRI ImageService.
func (c *Containerd) RemoveImage(ctx context.Context, ref string) error {
	is, err := c.ImageService()
	if err != nil {
		return fmt.Errorf("CRI RemoveImage %q: %w", ref, err)
	}
	if _, err := is.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
		return fmt.Errorf("CRI RemoveImage %q: %w", ref, err)
	}
	return nil
}

// HasImage reports whether the daemon's CRI image store has ref.
func (c *Containerd) HasImage(ctx context.Context, ref string) (bool, error) {
	is, err := c.ImageService()
	if err != nil {
		return false, fmt.Errorf("CRI ImageStatus %q: %w", ref, err)
	}
	resp, err := is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return false, fmt.Errorf("CRI ImageStatus %q: %w", ref, err)
	}
	return resp.GetImage() != nil, nil
}

// daemonEnv drops proxy settings from env: the daemon must dial test hosts directly, never a
// proxy off the machine.
func daemonEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(k) {
		case "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// versionRE finds the version field of `containerd --version`, e.g.
// "containerd github.com/containerd/containerd/v2 2.4.2+unknown" or "... v1.7.35 <sha>".
var versionRE = regexp.MustCompile(`\sv?(\d+\.\d+\.\d+\S*)`)

// containerdVersion runs `bin --version` and returns the version without a leading "v".
func containerdVersion(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", bin, err, bytes.TrimSpace(out))
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: no version in %q", bin, bytes.TrimSpace(out))
	}
	return string(m[1]), nil
}

// majorOf returns the major number of a version like "2.4.2+unknown".
func majorOf(version string) (int, error) {
	s, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("version %q: major is not a number", version)
	}
	return n, nil
}
