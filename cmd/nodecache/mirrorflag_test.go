package main

import (
	"strings"
	"testing"
)

// TestMirrorFlagEveryCommand (issue 8): one table of --mirror values fed to gen, status, warm and
// agent through the CLI. Every command accepts or refuses each value alike, a refusal exits 2
// with the same message (pkg/name's one parser), and nothing is dialled: an accepted value is
// followed by a refusal of another flag where the command would otherwise reach the mirror.
func TestMirrorFlagEveryCommand(t *testing.T) {
	t.Parallel()
	const want = "want http://HOST[:PORT] or https://HOST[:PORT]"
	for _, tc := range []struct {
		value string
		url   string // the normalised mirror for an accepted value
		msg   string // the refusal, from "--mirror" to the end of its line
	}{
		{value: "http://h:5000", url: "http://h:5000"},
		{value: "http://h:5000/", url: "http://h:5000"},
		{value: "HTTP://H:5000", url: "http://h:5000"},
		{value: "http://[::1]:5000", url: "http://[::1]:5000"},
		{value: "http://h:0", msg: `--mirror "http://h:0": port 0 is out of range: want 1 to 65535`},
		{value: "http://h:65536", msg: `--mirror "http://h:65536": port 65536 is out of range: want 1 to 65535`},
		{value: "http://10.0.0.5:99999", msg: `--mirror "http://10.0.0.5:99999": port 99999 is out of range: want 1 to 65535`},
		{value: "http://h:5000#x", msg: `--mirror "http://h:5000#x": a fragment is not accepted: ` + want},
		{value: "http://user:secret@h:5000", msg: `--mirror "http://user:xxxxx@h:5000": credentials (user:password@) are not accepted: ` + want + `; nodecache pulls anonymously`},
		{value: "http://h:5000/v2", msg: `--mirror "http://h:5000/v2": path "/v2" is not accepted: ` + want + ` (the registry API is at /v2/ of the host)`},
		{value: "10.0.0.5:5000", msg: `--mirror "10.0.0.5:5000": no scheme: did you mean http://10.0.0.5:5000?`},
		{value: "registry.local:5000", msg: `--mirror "registry.local:5000": no scheme: did you mean http://registry.local:5000?`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			for _, cmd := range []struct {
				name string
				args []string
				// accepted checks an accepted value's run; "" when it passed.
				accepted func(code int, stdout, stderr string) string
			}{
				{"gen", []string{"gen", "talos", "--mirror", tc.value}, func(code int, stdout, _ string) string {
					if code != exitOK || !strings.Contains(stdout, tc.url) {
						return "want exit 0 and a patch naming " + tc.url
					}
					return ""
				}},
				// --runtime talos on a host root that is not Talos: not applicable (3), no runtime is
				// evaluated, so no mirror is asked.
				{"status", []string{"status", "--host-root", root, "--runtime", "talos", "--mirror", tc.value}, func(code int, stdout, _ string) string {
					if code != exitUnknown || strings.Contains(stdout, "traffic") {
						return "want exit 3 (--runtime talos is not applicable here) and no traffic row (the mirror is not asked)"
					}
					return ""
				}},
				// --concurrency 0 is refused too, so warm sends nothing.
				{"warm", []string{"warm", "--mirror", tc.value, "--concurrency", "0", "nginx"}, func(code int, _, stderr string) string {
					if code != exitUsage || !strings.Contains(stderr, "--concurrency 0") {
						return "want exit 2 for --concurrency 0 alone"
					}
					return ""
				}},
				// A refused --warm image stops the agent before it serves or configures anything.
				{"agent", []string{"agent", "--host-root", root, "--listen", "127.0.0.1:0", "--mirror", tc.value, "--warm", "Bad//Image"}, func(code int, _, stderr string) string {
					if code != exitUsage || !strings.Contains(stderr, "--warm") {
						return "want exit 2 for --warm alone"
					}
					return ""
				}},
			} {
				code, stdout, stderr := runApp(t, cmd.args...)
				got := ""
				if i := strings.Index(stderr, "--mirror"); i >= 0 {
					got, _, _ = strings.Cut(stderr[i:], "\n")
				}
				if tc.msg != "" {
					if code != exitUsage || got != tc.msg {
						t.Errorf("%s --mirror %q: exit %d, message %q; want exit 2 and %q\nstderr: %s", cmd.name, tc.value, code, got, tc.msg, stderr)
					}
					continue
				}
				if got != "" {
					t.Errorf("%s --mirror %q refused it: %s", cmd.name, tc.value, got)
				}
				if why := cmd.accepted(code, stdout, stderr); why != "" {
					t.Errorf("%s --mirror %q: exit %d: %s\nstdout: %s\nstderr: %s", cmd.name, tc.value, code, why, stdout, stderr)
				}
			}
		})
	}
}
