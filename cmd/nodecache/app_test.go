package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
