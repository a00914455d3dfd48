package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

// TestStatusAgentRefusals: status and agent refuse a --host-root that does not exist or is not a
// directory, agent refuses a non-positive --interval and an unknown --readiness, all with exit 2
// and a message that names the flag (with its dashes) and what it accepts.
func TestStatusAgentRefusals(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nonexistent")
	file := filepath.Join(bootstraptest.HostRoot(t, map[string]string{"/file": "x"}), "file")
	root := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		says []string
	}{
		{"status host root missing", []string{"status", "--host-root", missing}, []string{`--host-root "` + missing + `" does not exist`, "such as / or /host"}},
		{"status host root is a file", []string{"status", "--host-root", file}, []string{`--host-root "` + file + `" is not a directory`}},
		{"status relative containerd config", []string{"status", "--host-root", root, "--containerd-config", "etc/containerd/config.toml"}, []string{"--containerd-config", "absolute"}},
		{"status runtime", []string{"status", "--host-root", root, "--runtime", "docker"}, []string{`--runtime "docker"`, "auto, containerd, crio or talos"}},
		{"status upstream", []string{"status", "--host-root", root, "--upstream", "https://docker.io"}, []string{"--upstream: ", `registry name "https://docker.io": want a host such as ghcr.io`}},
		{"agent host root missing", []string{"agent", "--host-root", missing}, []string{`--host-root "` + missing + `" does not exist`}},
		{"agent interval zero", []string{"agent", "--host-root", root, "--interval", "0"}, []string{"--interval 0s", "positive duration"}},
		{"agent interval negative", []string{"agent", "--host-root", root, "--interval", "-5s"}, []string{"--interval -5s", "positive duration"}},
		{"agent interval not a duration", []string{"agent", "--host-root", root, "--interval", "abc"}, []string{`--interval "abc": want a duration such as 500ms, 30s`}},
		{"agent readiness", []string{"agent", "--host-root", root, "--readiness", "foo"}, []string{`--readiness "foo"`, "want serving", "or activation"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runApp(t, tc.args...)
			if code != exitUsage {
				t.Fatalf("exit %d, want 2; stdout %q stderr %q", code, stdout, stderr)
			}
			for _, s := range tc.says {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr %q does not say %q", stderr, s)
				}
			}
		})
	}
}

// TestStatusTalosAbsent: --runtime talos on a host that is not Talos cannot be judged (exit 3),
// and says what /etc/os-release says instead of suggesting the Talos patch.
func TestStatusTalosAbsent(t *testing.T) {
	t.Parallel()
	root := bootstraptest.HostRoot(t, map[string]string{"/etc/os-release": "NAME=\"Debian GNU/Linux\"\nID=debian\n"})
	code, stdout, stderr := runApp(t, "status", "--runtime", "talos", "--host-root", root)
	if code != exitUnknown {
		t.Fatalf("exit %d, want 3; stdout %q stderr %q", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "NOT APPLICABLE") || !strings.Contains(stdout, "no Talos found under --host-root "+root+": /etc/os-release says ID=debian") {
		t.Errorf("stdout does not say why:\n%s", stdout)
	}
	if strings.Contains(stdout, "patch") {
		t.Errorf("suggests a Talos patch on a host that is not Talos:\n%s", stdout)
	}
}
