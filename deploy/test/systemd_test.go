package test

import (
	"bufio"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// TestBareMetalStepsAgree: the install steps in the unit file's header and in docs/deploy.md's
// "Bare metal (systemd)" block, each run with install(1) into its own root (holding only
// /usr/local/bin and /etc/systemd/system, as every systemd host does), leave the same
// files with the same modes, and every step succeeds there (a `cp` into /etc/nodecache/ fails
// on a host without that directory). The binary, whatever a step names it, is the built one.
func TestBareMetalStepsAgree(t *testing.T) {
	t.Parallel()
	steps := func(text, prefix string) [][]string {
		var out [][]string
		for _, l := range strings.Split(text, "\n") {
			if rest, ok := strings.CutPrefix(l, prefix); ok && strings.HasPrefix(rest, "install ") {
				out = append(out, strings.Fields(rest))
			}
		}
		return out
	}
	unit := steps(string(readRepoFile(t, "examples/baremetal/nodecache.service")), "#   ")
	deploy := string(readRepoFile(t, "docs/deploy.md"))
	_, block, ok := strings.Cut(deploy, "## Bare metal (systemd)")
	if !ok {
		t.Fatal(`docs/deploy.md has no "## Bare metal (systemd)" section`)
	}
	block, _, _ = strings.Cut(block, "\n## ")
	docs := steps(block, "    ")
	if len(unit) == 0 || len(docs) == 0 {
		t.Fatalf("install steps: %d in the unit's header, %d in docs/deploy.md; want some in both", len(unit), len(docs))
	}
	source := func(name string) string {
		switch base := filepath.Base(name); {
		case base == "nodecache.yaml" || base == "nodecache.service":
			return filepath.Join(repoRoot, "examples/baremetal", base)
		case strings.HasPrefix(base, "nodecache"):
			return binary
		default:
			t.Fatalf("install step names %q: not the binary or an examples/baremetal file", name)
			return ""
		}
	}
	apply := func(what string, steps [][]string) map[string]os.FileMode {
		// An empty root with the directories every systemd host has (and not /etc/nodecache).
		root := t.TempDir()
		for _, dir := range []string{"usr/local/bin", "etc/systemd/system"} {
			if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range steps {
			args := slices.Clone(s[1:])
			n := len(args)
			args[n-2], args[n-1] = source(args[n-2]), filepath.Join(root, args[n-1])
			if out, err := exec.Command("install", args...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %s in an empty root: %v\n%s", what, strings.Join(s, " "), err, out)
			}
		}
		files := map[string]os.FileMode{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			files["/"+rel] = fi.Mode()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	u, d := apply("unit file header", unit), apply("docs/deploy.md", docs)
	if !maps.Equal(u, d) {
		t.Errorf("the install steps disagree:\nunit file header: %v\ndocs/deploy.md:   %v", u, d)
	}
	if len(u) != 3 {
		t.Errorf("installed %v; want the binary, the settings file and the unit", u)
	}
}
