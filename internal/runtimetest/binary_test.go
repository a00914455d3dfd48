package runtimetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// stopRecorder is a testing.TB whose Skip and Fatal record the message and end the goroutine,
// so that a test can see how a helper stops the test it is given.
type stopRecorder struct {
	testing.TB
	msg string
}

func (r *stopRecorder) Helper()                          {}
func (r *stopRecorder) Skip(args ...any)                 { r.stop(strings.TrimSuffix(fmt.Sprintln(args...), "\n")) }
func (r *stopRecorder) Fatal(args ...any)                { r.stop(strings.TrimSuffix(fmt.Sprintln(args...), "\n")) }
func (r *stopRecorder) Skipf(format string, args ...any) { r.stop(fmt.Sprintf(format, args...)) }
func (r *stopRecorder) Fatalf(format string, args ...any) {
	r.stop(strings.TrimPrefix(fmt.Sprintf(format, args...), "CI=true and "))
}
func (r *stopRecorder) stop(msg string) { r.msg = msg; runtime.Goexit() }

// run calls f with a stopRecorder and returns f's result and the message it stopped with ("" when
// it did not stop).
func run(t *testing.T, f func(testing.TB) string) (got, stopped string) {
	t.Helper()
	r := &stopRecorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); got = f(r) }()
	<-done
	return got, r.msg
}

// TestFind (issue 26): a tool is found through its variable, else on $PATH — TestServeTLS said
// "NODECACHE_CURL is not set" while curl was on $PATH — and a missing one is told in one wording,
// the same for every test that needs it.
func TestFind(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("sh is not on $PATH: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODECACHE_TEST_TOOL", self)
	t.Setenv("NODECACHE_TEST_DIR", filepath.Dir(self))
	for _, tc := range []struct {
		name    string
		tool    Tool
		want    string
		stopped string
	}{
		{"variable set", Tool{Name: "sh", Env: "NODECACHE_TEST_TOOL"}, self, ""},
		{"variable unset, on $PATH", Tool{Name: "sh", Env: "NODECACHE_TEST_UNSET"}, sh, ""},
		{"no variable, on $PATH", Tool{Name: "sh"}, sh, ""},
		{"missing, with a variable", Tool{Name: "nodecache-no-such-tool", Env: "NODECACHE_TEST_UNSET", Install: "apt-get install x"}, "",
			"nodecache-no-such-tool not found: set NODECACHE_TEST_UNSET to its path or put it on $PATH (apt-get install x; .ci/build-tools.sh installs it)"},
		{"missing, without a variable", Tool{Name: "nodecache-no-such-tool", Install: "apt-get install x"}, "",
			"nodecache-no-such-tool not found: put it on $PATH (apt-get install x; .ci/build-tools.sh installs it)"},
		{"variable naming a directory", Tool{Name: "sh", Env: "NODECACHE_TEST_DIR"}, "",
			"NODECACHE_TEST_DIR=" + filepath.Dir(self) + " is not an executable file: " + buildHint},
	} {
		got, stopped := run(t, func(tb testing.TB) string { return Find(tb, tc.tool) })
		if got != tc.want || stopped != tc.stopped {
			t.Errorf("%s: Find = %q, stopped with %q\nwant %q, stopped with %q", tc.name, got, stopped, tc.want, tc.stopped)
		}
	}
}

// TestHostsLineIsBuildTools: the line RequireLoopbackName tells to add is the line
// .ci/build-tools.sh adds, and the reason names no single host, so that every test stopped by
// a missing entry shows the same reason.
func TestHostsLineIsBuildTools(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile(filepath.Join("..", "..", ".ci", "build-tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), `local line="`+HostsLine+`"`) {
		t.Errorf(".ci/build-tools.sh does not add %q to /etc/hosts", HostsLine)
	}
	_, a := run(t, func(tb testing.TB) string { RequireLoopbackName(tb, "nodecache-absent.test"); return "" })
	_, b := run(t, func(tb testing.TB) string { RequireLoopbackName(tb, "other-absent.test"); return "" })
	want := `/etc/hosts does not map the test names to loopback: add the line "` + HostsLine + `" to /etc/hosts (.ci/build-tools.sh adds it)`
	if a != want || b != want {
		t.Errorf("reasons\n%q\n%q\nwant both %q", a, b, want)
	}
}
