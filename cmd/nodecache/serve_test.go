package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// binary is the nodecache binary built once for the process-level tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodecache-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "nodecache")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build nodecache: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type slowWriter struct {
	http.ResponseWriter
	delay time.Duration
}

func (s slowWriter) Write(p []byte) (int, error) {
	time.Sleep(s.delay)
	return s.ResponseWriter.Write(p)
}

func httpGet(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp, b
}

// TestServeProcess (i): settings from the YAML file and the environment (env beats file), the
// cache header going miss then hit, /metrics, and SIGTERM during a large blob GET: the response
// completes and the process exits 0.
func TestServeProcess(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 12*mirrortest.MiB, 1, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	ls, _ := img.Layers()
	dgst, _ := ls[0].Digest()
	small := mirrortest.Image(t, 4096, 1, "linux/amd64")
	up.PushImage(t, "team/small", "v1", small)
	sls, _ := small.Layers()
	sdgst, _ := sls[0].Digest()
	up.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, dgst.String()) && r.Method == http.MethodGet {
				next.ServeHTTP(slowWriter{w, 4 * time.Millisecond}, r) // ~1.5 s for the big layer
				return
			}
			next.ServeHTTP(w, r)
		})
	})

	dir := t.TempDir()
	fileListen, envListen := nodecachetest.FreeAddr(t), nodecachetest.FreeAddr(t)
	cfg := writeFile(t, dir, "nodecache.yaml", fmt.Sprintf("listen: %q\nroot: %q\nupstream:\n  - upstream.test=%s\nlog-format: json\nupstream-timeout: 5s\n",
		fileListen, filepath.Join(dir, "root"), up.URL))
	var logs bytes.Buffer
	cmd := exec.Command(binary, "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), "NODECACHE_LISTEN="+envListen)
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	base := "http://" + envListen
	waitReady(t, nil, base+"/readyz", cmd.Process)
	if c, err := net.DialTimeout("tcp", fileListen, time.Second); err == nil {
		c.Close()
		t.Fatalf("listening on the file's address %s although NODECACHE_LISTEN overrides it", fileListen)
	}

	smallURL := base + "/v2/team/small/blobs/" + sdgst.String() + "?ns=upstream.test"
	resp, _ := httpGet(t, smallURL)
	if c := resp.Header.Get(mirrorapi.HeaderCache); resp.StatusCode != http.StatusOK || c != mirrorapi.CacheMiss {
		t.Fatalf("first GET: %d cache=%q, want 200 miss", resp.StatusCode, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, _ = httpGet(t, smallURL)
		if resp.Header.Get(mirrorapi.HeaderCache) == mirrorapi.CacheHit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("blob never served as a hit: %q", resp.Header.Get(mirrorapi.HeaderCache))
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, metrics := httpGet(t, base+"/metrics")
	for _, want := range []string{
		`nodecache_requests_total{cache="miss",code="200",kind="blob",method="GET",upstream="upstream.test"}`,
		`nodecache_requests_total{cache="hit",code="200",kind="blob",method="GET",upstream="upstream.test"}`,
		`nodecache_upstream_fetch_duration_seconds_count{kind="blob",result="ok",tier="upstream",upstream="upstream.test"}`,
		`nodecache_served_bytes_total{source="cache",upstream="upstream.test"}`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}

	// SIGTERM while a large cold blob streams.
	bigResp, err := http.Get(base + "/v2/upstream.test/team/app/blobs/" + dgst.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, bigResp.Body)
	bigResp.Body.Close()
	if err != nil || "sha256:"+hex.EncodeToString(h.Sum(nil)) != dgst.String() {
		t.Fatalf("blob GET during shutdown: %d bytes, err %v, digest mismatch=%v", n, err, "sha256:"+hex.EncodeToString(h.Sum(nil)) != dgst.String())
	}
	if err := nodecachetest.Within(t, 30*time.Second, "serve after SIGTERM", func() error { return <-exited }); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), `"message":"request"`) {
		t.Fatalf("no access-log line in the output:\n%s", logs.String())
	}
}

// TestServeRefusesBadInput: bad settings exit 2 with a message naming the setting.
func TestServeRefusesBadInput(t *testing.T) {
	t.Parallel()
	badYAML := writeFile(t, t.TempDir(), "bad.yaml", "listen: [unclosed\n")
	typoYAML := writeFile(t, t.TempDir(), "typo.yaml", "lsiten: \":5000\"\n")
	rootFile := writeFile(t, t.TempDir(), "file", "")
	peerKey := writeFile(t, t.TempDir(), "peer.key", strings.Repeat("k", 40)+"\n")
	shortKey := writeFile(t, t.TempDir(), "short.key", "too short\n")
	// A link to nothing and a loop of links (newuser3 item 14: were "mkdir …: file exists", exit 1).
	links := t.TempDir()
	dangling, loop := filepath.Join(links, "dangling"), filepath.Join(links, "loop-a")
	for link, target := range map[string]string{dangling: "/nonexistent/cache", loop: "loop-b", filepath.Join(links, "loop-b"): "loop-a"} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"empty upstream", []string{"serve", "--upstream", ""}, nil, "--upstream is empty (an empty --upstream or NODECACHE_UPSTREAM= gives none): want NAME[=URL]"},
		{"empty upstream from env", []string{"serve"}, []string{"NODECACHE_UPSTREAM="}, "--upstream is empty"},
		{"root is a file", []string{"serve", "--root", rootFile}, nil, "--root " + rootFile + ": is a regular file, not a directory: want a directory (created if missing)"},
		{"root under a file", []string{"serve", "--root", rootFile + "/cache"}, nil, "a part of the path is not a directory"},
		{"root a dangling link", []string{"serve", "--root", dangling}, nil, "--root " + dangling + ": is a symbolic link to /nonexistent/cache, which does not exist: want a directory (created if missing), or a link to one"},
		{"root under a dangling link", []string{"serve", "--root", dangling + "/cache"}, nil, "--root " + dangling + "/cache: " + dangling + " is a symbolic link to /nonexistent/cache, which does not exist"},
		{"root a loop of links", []string{"serve", "--root", loop}, nil, "--root " + loop + ": a loop of symbolic links: want a directory (created if missing), or a link to one"},
		{"root under a loop of links", []string{"serve", "--root", loop + "/cache"}, nil, "--root " + loop + "/cache: a loop of symbolic links"},
		{"fill-timeout zero", []string{"serve", "--fill-timeout", "0s"}, nil, "--fill-timeout 0s: want a positive duration such as 2h"},
		{"upstream scheme", []string{"serve", "--upstream", "ghcr.io=ftp://ghcr.io"}, nil, "scheme"},
		{"upstream name", []string{"serve", "--upstream", "bad name=https://x"}, nil, "registry name"},
		{"upstream from env", []string{"serve"}, []string{"NODECACHE_UPSTREAM=a.test=http://127.0.0.1:1,a.test=http://127.0.0.1:2"}, "configured twice"},
		{"default upstream", []string{"serve", "--upstream", "a.test=http://127.0.0.1:1", "--default-upstream", "b.test"}, nil, "not among"},
		{"log format", []string{"serve", "--log-format", "xml"}, nil, "--log-format"},
		{"listen port", []string{"serve", "--listen", "127.0.0.1:99999"}, nil, "--listen"},
		{"listen form", []string{"serve", "--listen", "nonsense"}, nil, "HOST:PORT"},
		{"listen empty port", []string{"serve", "--listen", ":"}, nil, "--listen"},
		{"metrics listen", []string{"serve", "--metrics-listen", "bogus"}, nil, "--metrics-listen"},
		{"metrics listen on the listen port", []string{"serve", "--listen", "127.0.0.1:5024", "--metrics-listen", "127.0.0.1:5024"}, nil, "would bind the same port"},
		{"peer-listen without a key", []string{"serve", "--peers", "127.0.0.1:5101", "--peer-listen", "127.0.0.1:5101"}, nil, "--peer-listen needs --peer-key-file"},
		{"peers without a key", []string{"serve", "--peers", "127.0.0.1:5101"}, nil, "--peers needs --peer-key-file"},
		{"peer-listen without peers", []string{"serve", "--peer-listen", "127.0.0.1:5101"}, nil, "--peer-listen needs --peers"},
		{"peer-listen on the listen port", []string{"serve", "--listen", "127.0.0.1:5025", "--peers", "127.0.0.1:5025", "--peer-listen", "127.0.0.1:5025", "--peer-key-file", peerKey}, nil, "would bind the same port"},
		{"peers source", []string{"serve", "--peers", "ftp:x", "--peer-key-file", peerKey}, nil, "--peers"},
		{"peer key too short", []string{"serve", "--peers", "127.0.0.1:5101", "--peer-key-file", shortKey}, nil, "--peer-key-file"},
		{"peer key without peers", []string{"serve", "--peer-key-file", peerKey}, nil, "--peer-key-file is set but --peers is not"},
		{"idle-timeout negative", []string{"serve", "--idle-timeout", "-1s"}, nil, "--idle-timeout -1s: want a positive duration"},
		{"upstream-concurrency negative", []string{"serve", "--upstream-concurrency", "-1"}, nil, "--upstream-concurrency -1: want a positive number"},
		{"client-max-conns negative", []string{"serve", "--client-max-conns", "-1"}, nil, "--client-max-conns -1: want a positive number"},
		{"peers refresh zero", []string{"serve", "--peers", "127.0.0.1:5101", "--peer-key-file", peerKey, "--peers-refresh", "0s"}, nil, "want positive durations"},
		{"peer list missing at start", []string{"serve", "--peers", "file:/nonexistent/members", "--peer-key-file", peerKey}, nil, "--peers file:/nonexistent/members"},
		{"max-size decimal unit", []string{"serve", "--max-size", "30GB"}, nil, "did you mean 30GiB?"},
		{"max-size share", []string{"serve", "--max-size", "150%"}, nil, "--max-size"},
		{"extra argument", []string{"serve", "extra"}, nil, "takes no arguments"},
		{"duration", []string{"serve", "--upstream-timeout", "abc"}, nil, `--upstream-timeout "abc": want a duration such as 500ms, 30s`},
		{"unknown config key", []string{"serve", "--config", typoYAML}, nil, "lsiten"},
		{"unknown command", []string{"bogus"}, nil, "unknown command"},
		{"unknown gen command", []string{"gen", "bogus"}, nil, "unknown command"},
		{"unknown help topic", []string{"help", "nosuch"}, nil, `nodecache: unknown command "nosuch"; commands: serve, gen,`},
		{"unknown gen help topic", []string{"gen", "help", "nosuch"}, nil, `nodecache: unknown command "nosuch" for gen; want one of: talos, containerd, crio` + "\n"},
		{"close help topic", []string{"help", "serv"}, nil, `unknown command "serv": did you mean serve?`},
		{"unknown flag", []string{"serve", "--no-such-flag"}, nil, "no-such-flag"},
		{"config file", []string{"serve", "--config", badYAML}, nil, "--config"},
		{"missing config file", []string{"serve", "--config", "/nonexistent/nodecache.yaml"}, nil, "--config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(binary, tc.args...)
			cmd.Env = append(os.Environ(), tc.env...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("%v: err %v, want exit 2\n%s", tc.args, err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("%v: output lacks %q:\n%s", tc.args, tc.want, out)
			}
		})
	}
}

// TestServeAddressInUse: a --listen or --metrics-listen address another process holds stops
// serve with exit 1 (not input serve could refuse up front) and one line naming the flag and
// what to do (fresh-clone trial: was "listen ADDR: listen tcp ADDR: bind: address already in
// use").
func TestServeAddressInUse(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Close() })
	busy := held.Addr().String()
	for _, tc := range []struct{ flag, other string }{{"--listen", "--metrics-listen"}, {"--metrics-listen", "--listen"}} {
		cmd := exec.Command(binary, "serve", "--root", t.TempDir(), tc.flag, busy, tc.other, nodecachetest.FreeAddr(t), "--upstream", "upstream.test=offline")
		out := nodecachetest.Within(t, 30*time.Second, "serve on a busy port", func() []byte { b, _ := cmd.CombinedOutput(); return b })
		want := "nodecache: " + tc.flag + " " + busy + ": another process listens there: stop it, or give " + tc.flag + " another port (listen tcp " + busy + ": bind: address already in use)\n"
		if code := cmd.ProcessState.ExitCode(); code != exitNegative || !strings.HasSuffix(string(out), want) {
			t.Errorf("%s on a busy port: exit %d, want 1 ending with %q:\n%s", tc.flag, code, want, out)
		}
	}
	// 192.0.2.1 (TEST-NET-1, RFC 5737) is on no interface here.
	cmd := exec.Command(binary, "serve", "--root", t.TempDir(), "--listen", "192.0.2.1:5000", "--upstream", "upstream.test=offline")
	out := nodecachetest.Within(t, 30*time.Second, "serve on an address not this host's", func() []byte { b, _ := cmd.CombinedOutput(); return b })
	if code := cmd.ProcessState.ExitCode(); code != exitNegative || !strings.Contains(string(out), "--listen 192.0.2.1:5000: no interface of this host has that address: give one of its addresses, or :PORT for all of them") {
		t.Errorf("--listen on an address not this host's: exit %d, want 1 naming --listen:\n%s", code, out)
	}
}

// TestBaremetalExampleConfig: the shipped settings file is accepted by serve.
func TestBaremetalExampleConfig(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "serve", "--config", "../../examples/baremetal/nodecache.yaml",
		"--root", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	var out lockedBuffer
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// SIGTERM once serve listens (its signal handling is set by then), not after a fixed time: a
	// loaded machine started it too late for 1.5 s once, and the signal killed it.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), `"message":"listening"`); {
		select {
		case err := <-done:
			t.Fatalf("serve with the example settings exited: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve with the example settings did not listen within 30 s:\n%s", out.String())
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `"upstreams":["docker.io","ghcr.io","registry.k8s.io","quay.io","gcr.io"]`) {
		t.Fatalf("example upstreams not in effect:\n%s", out.String())
	}
	if !strings.Contains(out.String(), `"tag_ttl":"0s","fill_timeout":"2h"`) { // newuser2 item 18: the start log names it
		t.Fatalf("start log lacks fill_timeout:\n%s", out.String())
	}
}

// TestHelp: help and --version answer with exit 0.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"help"}, "serve"},
		{[]string{"help", "serve"}, "--upstream-timeout"},
		{[]string{"serve", "--help"}, "--default-upstream"},
		{[]string{"gen", "--help"}, "containerd"},
		{[]string{"--version"}, "nodecache version"},
		// Each cache command states its own exit codes (fresh-clone trial: all five shared one
		// text listing every command's).
		{[]string{"cache", "ls", "--help"}, "Exit codes: 0 listed; 1 serve unreachable"},
		{[]string{"cache", "rm", "--help"}, "Exit codes: 0 evicted; 1 not cached, pinned"},
		{[]string{"cache", "verify", "--help"}, "Exit codes: 0 every stored blob matched its digest;"},
		{[]string{"cache", "pin", "--help"}, "Exit codes: 0 pinned (or already pinned); 1 not cached"},
		{[]string{"cache", "unpin", "--help"}, "Exit codes: 0 unpinned; 1 not pinned"},
		{[]string{"cache", "import", "--help"}, "Exit codes: 0 every image stored and pinned; 1 a blob of the bundle"},
	} {
		out, err := exec.Command(binary, tc.args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("nodecache %v: err %v, output lacks %q:\n%s", tc.args, err, tc.want, out)
		}
	}
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
