package test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnit: `systemd-analyze verify --root` accepts examples/baremetal/nodecache.service
// in a temporary root that holds the built binary at its ExecStart path, the settings file and
// the host's systemd units, with no warning at all (an unknown key is only a warning); and the
// ExecStart command line is accepted by the binary's flag set.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	analyze := needTool(t, "systemd-analyze", ".ci/run (Debian package systemd)")
	const units = "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(units, "multi-user.target")); err != nil {
		t.Fatalf("systemd's own units are not in %s: %v", units, err)
	}
	root := t.TempDir()
	unit := readRepoFile(t, "examples/baremetal/nodecache.service")
	settings := readRepoFile(t, "examples/baremetal/nodecache.yaml")
	bin, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "etc/systemd/system/nodecache.service"), string(unit))
	writeFile(t, filepath.Join(root, "etc/nodecache/nodecache.yaml"), string(settings))
	writeFile(t, filepath.Join(root, "usr/local/bin/nodecache"), string(bin))
	if err := os.Chmod(filepath.Join(root, "usr/local/bin/nodecache"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "usr/lib/systemd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", units, filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy systemd units: %v\n%s", err, out)
	}
	verify := func() (string, error) {
		out, err := exec.CommandContext(t.Context(), analyze, "verify", "--root="+root, "/etc/systemd/system/nodecache.service").CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := verify(); err != nil || out != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	// The check can fail: without the binary at ExecStart's path it must.
	if err := os.Rename(filepath.Join(root, "usr/local/bin/nodecache"), filepath.Join(root, "usr/local/bin/moved")); err != nil {
		t.Fatal(err)
	}
	if out, err := verify(); err == nil && out == "" {
		t.Fatal("systemd-analyze verify passed without the binary: this check proves nothing")
	}

	var exec0 []string
	sc := bufio.NewScanner(strings.NewReader(string(unit)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ExecStart="); ok {
			exec0 = strings.Fields(v)
		}
	}
	if len(exec0) < 2 || exec0[0] != "/usr/local/bin/nodecache" {
		t.Fatalf("ExecStart %v: want /usr/local/bin/nodecache COMMAND …", exec0)
	}
	// --config FILE as one word (withHelp keeps only the flags), the file read from the root.
	args := strings.Fields(strings.ReplaceAll(strings.Join(exec0[1:], " "),
		"--config /etc/nodecache/nodecache.yaml", "--config="+filepath.Join(root, "etc/nodecache/nodecache.yaml")))
	if !strings.Contains(strings.Join(args, " "), "--config="+root) {
		t.Fatalf("ExecStart %v does not read /etc/nodecache/nodecache.yaml", exec0)
	}
	if out, err := exec.CommandContext(t.Context(), binary, withHelp(args)...).CombinedOutput(); err != nil {
		t.Fatalf("ExecStart %v refused: %v\n%s", args, err, out)
	}
}
