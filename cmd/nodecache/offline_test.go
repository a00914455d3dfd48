package main

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// serveStoppable runs `nodecache serve args...` until it is ready, stopping it (SIGTERM, exit 0
// awaited) when stop is called or the test ends; logs holds its output.
func serveStoppable(t *testing.T, listen string, args ...string) (stop func(), logs *bytes.Buffer) {
	t.Helper()
	logs = &bytes.Buffer{}
	cmd := exec.Command(binary, append([]string{"serve", "--listen", listen, "--log-format", "json"}, args...)...)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := nodecachetest.Within(t, 30*time.Second, "serve after SIGTERM", func() error { return <-exited }); err != nil {
			t.Errorf("serve exit: %v\n%s", err, logs)
		}
	}
	t.Cleanup(stop)
	waitReady(t, nil, "http://"+listen+"/readyz", cmd.Process)
	return stop, logs
}

// TestServeOffline (issue 24): a serve process fills its root from a real upstream registry;
// the upstream stops; `serve --offline` over the same root, its --upstream URL now a listener
// that counts connections, serves the image by tag and by digest (a whole pull by
// go-containerregistry), answers a miss 404 MANIFEST_UNKNOWN at once, and never connects to
// the upstream's address.
func TestServeOffline(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 64*1024, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	dgst, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "root")
	listen := nodecachetest.FreeAddr(t)

	stop, _ := serveStoppable(t, listen, "--root", root, "--upstream", "upstream.test="+up.URL.String())
	if _, err := nodecachetest.PullValid(t.Context(), listen+"/upstream.test/team/app:v1"); err != nil {
		t.Fatalf("online: %v", err)
	}
	stop()
	up.Stop()

	// Where the upstream was: a listener that counts every connection made to it.
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = hole.Close() })

	listen = nodecachetest.FreeAddr(t)
	_, logs := serveStoppable(t, listen, "--root", root, "--offline", "--upstream", "upstream.test=http://"+hole.Addr().String())
	for _, r := range []string{listen + "/upstream.test/team/app:v1", listen + "/upstream.test/team/app@" + dgst.String()} {
		got, err := nodecachetest.PullValid(t.Context(), r)
		if err != nil {
			t.Fatalf("offline: %v\n%s", err, logs)
		}
		if d, _ := got.Digest(); d != dgst {
			t.Fatalf("pull %s offline: digest %s, want %s", r, d, dgst)
		}
	}
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		req, err := http.NewRequest(method, "http://"+listen+"/v2/team/app/manifests/v9?ns=upstream.test", nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if took := time.Since(start); resp.StatusCode != http.StatusNotFound || resp.Header.Get(mirrorapi.HeaderErrorCode) != "MANIFEST_UNKNOWN" || took > 250*time.Millisecond {
			t.Fatalf("%s of a tag not cached: %d %s in %s, want 404 MANIFEST_UNKNOWN at once", method, resp.StatusCode, resp.Header.Get(mirrorapi.HeaderErrorCode), took)
		}
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connections to the offline upstream's address", n)
	}
	if !strings.Contains(logs.String(), `"offline_upstreams":["upstream.test"]`) {
		t.Fatalf("the start does not say the upstream is offline:\n%s", logs)
	}
}

// TestServeOfflineRefused: a try at "offline" exits 2 naming the word and what is accepted.
func TestServeOfflineRefused(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"docker.io=ofline", "docker.io=off-line", "ghcr.io=none"} {
		out, err := exec.Command(binary, "serve", "--root", t.TempDir(), "--upstream", v).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "did you mean offline? want http://HOST[:PORT], https://HOST[:PORT], or offline") {
			t.Errorf("serve --upstream %s: %v, want exit 2 naming offline\n%s", v, err, out)
		}
	}
	out, err := exec.Command(binary, "serve", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--offline") || !strings.Contains(string(out), "NAME=offline") {
		t.Fatalf("serve --help does not teach --offline and NAME=offline: %v\n%s", err, out)
	}
}
