package test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestQuickStartOffline (newuser F1): README's offline quick start as written — `make
// local-registry` (distribution's registry; installed into ~/.cache/nodecache-ci by the Makefile
// when missing), an image pushed to it as library/alpine:3.20, and serve with
// NODECACHE_UPSTREAM=docker.io=http://<it> — answers the quick start's ?ns=docker.io and
// /v2/docker.io/ requests from it. Ports and directories are the test's own.
func TestQuickStartOffline(t *testing.T) {
	t.Parallel()
	makeTool := needTool(t, "make", ".ci/run (Debian package make)")
	regAddr, dir := freePort(t), t.TempDir()
	reg := exec.Command(makeTool, "-s", "-C", repoRoot, "local-registry",
		"REGISTRY_LISTEN="+regAddr, "REGISTRY_ROOT="+filepath.Join(dir, "registry"))
	reg.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var regLog lockedLog
	reg.Stdout, reg.Stderr = &regLog, &regLog
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-reg.Process.Pid, syscall.SIGTERM); _ = reg.Wait() })
	waitFor(t, "http://"+regAddr+"/v2/", 5*time.Minute, &regLog) // a first go install takes a while

	ref, err := name.ParseReference(regAddr+"/library/alpine:3.20", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithContext(t.Context())); err != nil {
		t.Fatalf("push to make local-registry: %v", err)
	}

	listen := freePort(t)
	serve := exec.Command(binary, "serve", "--root", filepath.Join(dir, "cache"), "--listen", listen)
	serve.Env = append(os.Environ(), "NODECACHE_UPSTREAM=docker.io=http://"+regAddr)
	var serveLog lockedLog
	serve.Stderr = &serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = serve.Process.Kill(); _ = serve.Wait() })
	waitFor(t, "http://"+listen+"/readyz", 30*time.Second, &serveLog)
	for _, path := range []string{"/v2/library/alpine/tags/list?ns=docker.io", "/v2/docker.io/library/alpine/tags/list"} {
		resp, err := http.Get("http://" + listen + path)
		if err != nil {
			t.Fatal(err)
		}
		var tags struct{ Tags []string }
		err = json.NewDecoder(resp.Body).Decode(&tags)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !slices.Contains(tags.Tags, "3.20") {
			t.Errorf("GET %s: %d, %v, tags %v; want 3.20 from the local registry\n%s", path, resp.StatusCode, err, tags.Tags, serveLog.String())
		}
	}
}

// waitFor polls url until it answers 200, failing with log after d.
func waitFor(t *testing.T, url string, d time.Duration, log *lockedLog) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
	}
	t.Fatalf("%s never answered 200 in %s:\n%s", url, d, log.String())
}

// lockedLog collects a process's output while the test may read it.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
