package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestLinuxOnlyOnDarwin: a darwin build refuses status and agent with exit 2 and "Linux only",
// before touching anything; gen talos, warm's flag checks and version still run, and --help
// still answers.
func TestLinuxOnlyOnDarwin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status"}, exitUsage, "nodecache status is Linux only"},
		{[]string{"status", "--runtime", "containerd", "--output", "json"}, exitUsage, "Linux only"},
		{[]string{"agent", "--listen", "127.0.0.1:0"}, exitUsage, "nodecache agent is Linux only"},
		{[]string{"status", "--help"}, exitOK, "--containerd-socket"},
		{[]string{"gen", "talos", "--mirror", "http://10.0.0.5:5000"}, exitOK, "RegistryMirrorConfig"},
		{[]string{"version"}, exitOK, "distribution"},
		{[]string{"warm"}, exitUsage, "--mirror"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			app := newApp()
			guardLinuxOnly(app.Commands, "darwin")
			var out, errOut bytes.Buffer
			app.Writer, app.ErrWriter = &out, &errOut
			code := report(&errOut, app.RunContext(t.Context(), append([]string{"nodecache"}, tc.args...)))
			if code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.want) {
				t.Fatalf("exit %d, want %d; output lacks %q:\n%s%s", code, tc.code, tc.want, out.String(), errOut.String())
			}
		})
	}
}
