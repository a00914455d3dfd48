package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// runApp runs the CLI in process and returns the exit code main would use, stdout and stderr;
// stdin is empty.
func runApp(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runAppStdin(t, "", args...)
}

// runAppStdin is runApp with stdin.
func runAppStdin(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := newApp()
	app.Reader, app.Writer, app.ErrWriter = strings.NewReader(stdin), &out, &errOut
	err := app.RunContext(t.Context(), append([]string{"nodecache"}, args...))
	code := report(&errOut, err)
	return code, out.String(), errOut.String()
}

// runAppJSON runs the CLI (runApp), fails t unless it exits 0 with JSON on stdout, decodes that
// into v and returns stderr.
func runAppJSON(t *testing.T, v any, args ...string) string {
	t.Helper()
	code, stdout, stderr := runApp(t, args...)
	if code != 0 {
		t.Fatalf("%q: exit %d: %s", args, code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), v); err != nil {
		t.Fatalf("%q: json output: %v\n%s", args, err, stdout)
	}
	return stderr
}

// writeFile writes content to dir/name (mode 0600, as a settings or credentials file) and
// returns the path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newSilentMirror is a registry for the CLI to point at that must receive no request at all:
// the test fails at its end, when every (parallel) subtest has run, if what (the inputs the test
// gives) sent any.
func newSilentMirror(t *testing.T, what string) *mirrortest.Registry {
	t.Helper()
	mirror := mirrortest.NewRegistry(t)
	t.Cleanup(func() {
		if reqs := mirror.Requests(); len(reqs) != 0 {
			t.Errorf("%s sent %d requests to the mirror: %+v", what, len(reqs), reqs)
		}
	})
	return mirror
}

// startServe runs `nodecache serve args...` with env added to the test's environment, waits
// until readyURL answers 200 (client: nil for http.DefaultClient) and returns its stderr.
func startServe(t *testing.T, env []string, client *http.Client, readyURL string, args ...string) *mirrortest.LogBuffer {
	t.Helper()
	cmd, logs := launchServe(t, env, args...)
	waitReady(t, client, readyURL, cmd.Process)
	return logs
}

// launchServe starts `nodecache serve args...` with env added to the test's environment and
// returns at once, with the process and its stderr. The test's cleanup kills it (if it still
// runs) and, when the test failed, logs what it wrote.
func launchServe(t *testing.T, env []string, args ...string) (*exec.Cmd, *mirrortest.LogBuffer) {
	t.Helper()
	logs := &mirrortest.LogBuffer{}
	cmd := exec.Command(binary, append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("nodecache log:\n%s", logs.String())
		}
	})
	return cmd, logs
}

// waitReady waits up to 20 s for url to answer 200 through c (nil: http.DefaultClient); it
// fails t as soon as p has exited, and kills p when url never answers.
func waitReady(t *testing.T, c *http.Client, url string, p *os.Process) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	for range 400 {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p.Signal(syscall.Signal(0)) != nil {
			t.Fatalf("nodecache exited before %s answered", url)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.Kill()
	t.Fatalf("%s never became ready", url)
}
