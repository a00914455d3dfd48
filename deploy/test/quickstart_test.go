package test

import (
	"archive/tar"
	"encoding/json"
	"errors"
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
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/mod/modfile"
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
	t.Run("README's crane lines", func(t *testing.T) {
		t.Parallel()
		craneLines(t, regAddr, listen, &serveLog)
	})
}

// craneLines (issue 26): the README's crane lines, as written but for the registry's address,
// make a two-platform image from a tar of files in the registry at regAddr; serve at listen
// answers its index with linux/amd64 and linux/arm64, and warm fetches one platform of it.
func craneLines(t *testing.T, regAddr, listen string, serveLog *lockedLog) {
	bash := needTool(t, "bash", "Debian")
	crane := os.Getenv("NODECACHE_CRANE")
	if crane == "" {
		var err error
		if crane, err = exec.LookPath("crane"); err != nil {
			// internal/runtimetest.Find's words, which this module cannot import.
			msg := "crane not found: set NODECACHE_CRANE to its path or put it on $PATH (the README's go install line; .ci/build-tools.sh installs it)"
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI=true and %s", msg)
			}
			t.Skip(msg)
		}
	}
	dir := t.TempDir()
	writeTar(t, filepath.Join(dir, "rootfs.tar"), map[string]string{"etc/motd": "offline\n"})
	script := readmeBlock(t, "crane append")
	if !strings.Contains(script, "127.0.0.1:5001") {
		t.Fatalf("README's crane lines do not name make local-registry's 127.0.0.1:5001:\n%s", script)
	}
	cmd := exec.Command(bash, "-e", "-c", strings.ReplaceAll(script, "127.0.0.1:5001", regAddr))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(crane)+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README's crane lines: %v\n%s\n%s", err, script, out)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+listen+"/v2/library/alpine/manifests/3.20?ns=docker.io", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", string(types.OCIImageIndex))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	index, err := v1.ParseIndexManifest(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("serve's answer for alpine:3.20: %d, %v\n%s", resp.StatusCode, err, serveLog.String())
	}
	var platforms []string
	for _, m := range index.Manifests {
		if m.Platform != nil {
			platforms = append(platforms, m.Platform.String())
		}
	}
	if slices.Sort(platforms); !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("the index serve answers holds the platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
	out, err := exec.Command(binary, "warm", "--mirror", "http://"+listen, "--platform", "linux/arm64", "alpine:3.20").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "docker.io/library/alpine:3.20 (from alpine:3.20) linux/arm64: 2 blobs fetched") {
		t.Errorf("warm --platform linux/arm64 alpine:3.20: %v\n%s", err, out)
	}
}

// readmeBlock returns the README's sh code block that contains marker.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	for _, block := range strings.Split(string(readRepoFile(t, "README.md")), "```sh\n")[1:] {
		if body, _, ok := strings.Cut(block, "```"); ok && strings.Contains(body, marker) {
			return body
		}
	}
	t.Fatalf("README.md has no sh block with %q", marker)
	return ""
}

// writeTar writes a tar holding files (name: content) at path.
func writeTar(t *testing.T, path string, files map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(tw.Close(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestCraneIsGoModsVersion: the crane the README installs and .ci/build-tools.sh builds is the
// go-containerregistry release nodecache's go.mod requires: one version in three places.
func TestCraneIsGoModsVersion(t *testing.T) {
	t.Parallel()
	mod, err := modfile.ParseLax("go.mod", readRepoFile(t, "go.mod"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for _, r := range mod.Require {
		if r.Mod.Path == "github.com/google/go-containerregistry" {
			want = r.Mod.Version
		}
	}
	if want == "" {
		t.Fatal("go.mod does not require github.com/google/go-containerregistry")
	}
	for file, pattern := range map[string]string{
		"README.md":          "go install github.com/google/go-containerregistry/cmd/crane@" + want + "`",
		".ci/build-tools.sh": `local cranev="${NODECACHE_CRANE_VERSION:-` + want + `}"`,
	} {
		if !strings.Contains(string(readRepoFile(t, file)), pattern) {
			t.Errorf("%s does not name crane %s (go.mod's go-containerregistry): want %q in it", file, want, pattern)
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
