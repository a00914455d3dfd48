package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestGenContainerdCLI drives `gen containerd` end to end over a host root: a refused config
// exits 2 and stays untouched, --dry-run writes nothing, a run writes and reports
// restart_required in JSON, a second run changes nothing, --remove restores.
func TestGenContainerdCLI(t *testing.T) {
	t.Parallel()
	legacy := bootstraptest.CorpusFile(t, "containerd/legacy-mirrors", "/etc/containerd/config.toml")
	root := bootstraptest.HostRoot(t, map[string]string{"/etc/containerd/config.toml": string(legacy)})
	cfg := filepath.Join(root, "etc/containerd/config.toml")
	base := []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "1.7.35", "--log-level", "error"}

	// No config.toml yet: reported with the schema it is created with, not 0.
	code, stdout, stderr := runApp(t, "gen", "containerd", "--host-root", t.TempDir(), "--mirror", "http://10.0.0.5:5000", "--containerd-version", "1.7.35", "--dry-run")
	if code != 0 || !strings.Contains(stderr, "containerd config: /etc/containerd/config.toml (schema 2, containerd v1.7.35)") || !strings.HasPrefix(stdout, "--- /dev/null\n") {
		t.Fatalf("created config: exit %d\n%s\n%s", code, stdout, stderr)
	}

	code, _, stderr = runApp(t, base...)
	if code != exitUsage || !strings.Contains(stderr, "registry.mirrors") || !strings.Contains(stderr, "--migrate") {
		t.Fatalf("legacy mirrors: exit %d, stderr %q; want 2 naming the table and --migrate", code, stderr)
	}
	assertFile(t, cfg, legacy)

	code, stdout, stderr = runApp(t, append(base, "--migrate", "--dry-run")...)
	if code != 0 || !strings.Contains(stdout, "+++ b/etc/containerd/certs.d/docker.io/hosts.toml") || !strings.Contains(stdout, `-      [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]`) {
		t.Fatalf("dry-run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	assertFile(t, cfg, legacy)
	if _, err := os.Stat(filepath.Join(root, "etc/containerd/certs.d")); !os.IsNotExist(err) {
		t.Fatalf("dry-run created the certs dir: %v", err)
	}

	var rep struct {
		RestartRequired bool     `json:"restart_required"`
		EditedFile      string   `json:"edited_file"`
		ConfigPath      string   `json:"config_path"`
		Migrated        []string `json:"migrated"`
		Changes         []struct {
			Path   string `json:"path"`
			Action string `json:"action"`
		} `json:"changes"`
	}
	runAppJSON(t, &rep, append(base, "--migrate", "--output", "json")...)
	if !rep.RestartRequired || rep.EditedFile != "/etc/containerd/config.toml" || rep.ConfigPath != "/etc/containerd/certs.d" || len(rep.Migrated) != 2 {
		t.Fatalf("report %+v", rep)
	}
	if bak, _ := os.ReadFile(cfg + bootstrap.BackupSuffix); !bytes.Equal(bak, legacy) {
		t.Fatal("backup does not hold the original")
	}

	edited, _ := os.ReadFile(cfg)
	st1, _ := os.Stat(cfg)
	code, stdout, _ = runApp(t, append(base, "--migrate")...)
	if code != 0 || !strings.Contains(stdout, "restart_required: false") || strings.Contains(stdout, "create ") || strings.Contains(stdout, "update ") {
		t.Fatalf("second run: exit %d\n%s", code, stdout)
	}
	st2, _ := os.Stat(cfg)
	if !os.SameFile(st1, st2) || !st1.ModTime().Equal(st2.ModTime()) {
		t.Fatal("second run rewrote config.toml")
	}
	assertFile(t, cfg, edited)

	code, stdout, stderr = runApp(t, "gen", "containerd", "--remove", "--host-root", root, "--containerd-version", "1.7.35", "--log-level", "error")
	if code != 0 || !strings.Contains(stdout, "restart_required: true") {
		t.Fatalf("remove: exit %d\n%s\n%s", code, stdout, stderr)
	}
	assertFile(t, cfg, legacy)
	// newuser2 item 15: the certs.d gen created went with it, and a second --remove (no
	// containerd here, version unknown) is a short "nothing to remove", no version warning.
	if _, err := os.Stat(filepath.Join(root, "etc/containerd/certs.d")); !os.IsNotExist(err) {
		t.Fatalf("certs.d created by gen is still there after --remove: %v", err)
	}
	code, stdout, stderr = runApp(t, "gen", "containerd", "--remove", "--host-root", root)
	if want := "containerd: nothing to remove (no file of nodecache's, no config edit of its)\n"; code != 0 || stdout != want || stderr != "" {
		t.Fatalf("second remove: exit %d\nstdout %q\nstderr %q\nwant exit 0, %q and nothing on stderr", code, stdout, stderr, want)
	}
}

// TestGenContainerdSymlinkedConfig: the new-user report. config.toml is an absolute symbolic
// link under --host-root: gen edits the file it leads to (backup beside it), keeps the link, and
// --remove restores that file; a link to nothing exits 2 naming the link and its target.
func TestGenContainerdSymlinkedConfig(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	real := []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n")
	bootstraptest.WriteHostFile(t, root, "/opt/cfg/real.toml", real)
	link := filepath.Join(root, "etc/containerd/config.toml")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/cfg/real.toml", link); err != nil {
		t.Fatal(err)
	}
	base := []string{"gen", "containerd", "--host-root", root, "--containerd-version", "1.7.27", "--log-level", "error"}
	code, stdout, stderr := runApp(t, append(base, "--mirror", "http://10.0.0.5:5000", "--upstream", "docker.io")...)
	if code != 0 || strings.Contains(stdout, "create /etc/containerd/config.toml") ||
		!strings.Contains(stdout, "update /opt/cfg/real.toml (via symbolic link /etc/containerd/config.toml) (backup /opt/cfg/real.toml.nodecache.bak)") {
		t.Fatalf("gen: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if target, err := os.Readlink(link); err != nil || target != "/opt/cfg/real.toml" {
		t.Fatalf("link replaced: %q %v", target, err)
	}
	assertFile(t, filepath.Join(root, "opt/cfg/real.toml.nodecache.bak"), real)
	if got, _ := os.ReadFile(filepath.Join(root, "opt/cfg/real.toml")); !strings.Contains(string(got), `config_path = "/etc/containerd/certs.d"`) {
		t.Fatalf("target not edited:\n%s", got)
	}
	code, stdout, stderr = runApp(t, append(base, "--remove")...)
	if code != 0 || !strings.Contains(stdout, "restore /opt/cfg/real.toml") {
		t.Fatalf("remove: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if target, err := os.Readlink(link); err != nil || target != "/opt/cfg/real.toml" {
		t.Fatalf("link replaced by --remove: %q %v", target, err)
	}
	assertFile(t, filepath.Join(root, "opt/cfg/real.toml"), real)

	// A link to nothing under the host root.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/cfg/gone.toml", link); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runApp(t, append(base, "--mirror", "http://10.0.0.5:5000")...)
	if code != exitUsage || !strings.Contains(stderr, "/etc/containerd/config.toml is a symbolic link to /opt/cfg/gone.toml") {
		t.Fatalf("dangling link: exit %d, stderr %q", code, stderr)
	}
	if target, _ := os.Readlink(link); target != "/opt/cfg/gone.toml" {
		t.Fatal("dangling link replaced")
	}
}

// TestGenMirrorCAMessages: --mirror-ca is a host path read under --host-root; each failure exits
// 2 with one message naming the flag's path and the file looked at (no "<nil>", no repetition).
func TestGenMirrorCAMessages(t *testing.T) {
	t.Parallel()
	root := bootstraptest.HostRoot(t, map[string]string{"/etc/pki/not-pem.txt": "hello\n"})
	if err := os.MkdirAll(filepath.Join(root, "etc/pki/dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	under := filepath.Join(root, "etc/pki")
	for _, tc := range []struct {
		ca, want string
	}{
		{"/etc/pki/ca.pem", "--mirror-ca /etc/pki/ca.pem: " + under + "/ca.pem does not exist (a host path: read under --host-root " + root + ")"},
		{"/etc/pki/dir", "--mirror-ca /etc/pki/dir: " + under + "/dir is a directory; want a PEM CA certificate file"},
		{"/etc/pki/not-pem.txt", "--mirror-ca /etc/pki/not-pem.txt: " + under + "/not-pem.txt holds no PEM certificate"},
		{"ca.pem", `--mirror-ca "ca.pem": want an absolute path (a host path: read under --host-root ` + root + ")"},
	} {
		for rt, version := range map[string]string{"containerd": "--containerd-version=2.4.2", "crio": "--crio-version=1.31.0"} {
			code, _, stderr := runApp(t, "gen", rt, "--host-root", root, "--mirror", "https://cache.example:5443", "--mirror-ca", tc.ca,
				version, "--dry-run", "--log-level", "error")
			if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "<nil>") || strings.Count(stderr, tc.ca) != strings.Count(tc.want, tc.ca) {
				t.Errorf("gen %s --mirror-ca %s: exit %d, stderr %q; want 2 and %q", rt, tc.ca, code, stderr, tc.want)
			}
		}
	}
	_, stdout, _ := runApp(t, "gen", "containerd", "--help")
	if !strings.Contains(stdout, "read under --host-root") {
		t.Errorf("--help does not say --mirror-ca is read under --host-root:\n%s", stdout)
	}
}

func TestGenUsageErrors(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	// fileHost has a regular file where gen wants the directory certs.d/docker.io (newuser3 item 13).
	fileHost := t.TempDir()
	if err := os.MkdirAll(filepath.Join(fileHost, "etc/containerd/certs.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fileHost, "etc/containerd/certs.d/docker.io"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no-mirror", []string{"gen", "containerd", "--host-root", root}, "--mirror: required"},
		{"bad-mirror", []string{"gen", "crio", "--host-root", root, "--mirror", "ftp://x"}, "scheme"},
		{"mirror-with-path", []string{"gen", "talos", "--mirror", "http://10.0.0.5:5000/v2"}, `path "/v2" is not accepted`},
		{"bad-upstream", []string{"gen", "talos", "--mirror", "http://10.0.0.5:5000", "--upstream", "bad/name"}, "upstream"},
		{"bad-output", []string{"gen", "talos", "--mirror", "http://10.0.0.5:5000", "--output", "yaml"}, "--output"},
		{"skip-fallback-loopback", []string{"gen", "talos", "--mirror", "http://127.0.0.1:5000", "--skip-fallback"}, "loopback"},
		{"no-config-unknown-version", []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-config", "/nope/config.toml"}, "--containerd-version"},
		{"host-root-missing", []string{"gen", "crio", "--host-root", filepath.Join(root, "missing"), "--mirror", "http://10.0.0.5:5000"}, "--host-root"},
		{"certs-dir-relative", []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "2.4.2", "--certs-dir", "relative"}, `--certs-dir: want one absolute directory, e.g. /etc/containerd/certs.d; got "relative"`},
		{"certs-dir-climbing", []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "2.4.2", "--certs-dir", "../../../tmp/x"}, "--certs-dir: want one absolute directory, e.g. /etc/containerd/certs.d"},
		{"certs-dir-list", []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "2.4.2", "--certs-dir", "/a:/b"}, "--certs-dir: want one absolute directory, e.g. /etc/containerd/certs.d"},
		{"certs-dir-remove", []string{"gen", "containerd", "--host-root", root, "--remove", "--containerd-version", "2.4.2", "--certs-dir", "relative"}, "--certs-dir: want one absolute directory"},
		{"containerd-config-relative", []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "2.4.2", "--containerd-config", "config.toml"}, "--containerd-config: want an absolute file path"},
		{"registries-dir-relative", []string{"gen", "crio", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--crio-version", "1.31.0", "--registries-dir", "etc/containers/registries.conf.d"}, "--registries-dir: want one absolute directory"},
		{"host-dir-is-a-file", []string{"gen", "containerd", "--host-root", fileHost, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "2.4.2"},
			"/etc/containerd/certs.d/docker.io is a regular file where a directory is expected (on the way to /etc/containerd/certs.d/docker.io/hosts.toml)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runApp(t, tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr, tc.want)
			}
		})
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("refused runs wrote %v", ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(fileHost, "etc/containerd")); len(ents) != 1 {
		t.Fatalf("refused run wrote %v next to certs.d", ents)
	}
}

func TestGenTalosCLI(t *testing.T) {
	t.Parallel()
	code, stdout, _ := runApp(t, "gen", "talos", "--mirror", "http://10.0.0.5:5000", "--upstream", "docker.io", "--talos-version", "v1.11.2")
	if code != 0 || !strings.HasPrefix(stdout, mirrorapi.ManagedMarker+"\n") || !strings.Contains(stdout, "registries:") {
		t.Fatalf("exit %d\n%s", code, stdout)
	}
	out := filepath.Join(t.TempDir(), "patch.yaml")
	var res struct {
		Form  string `json:"form"`
		Patch string `json:"patch"`
		File  string `json:"file"`
	}
	runAppJSON(t, &res, "gen", "talos", "--mirror", "http://10.0.0.5:5000", "-o", out, "--output", "json")
	got, err := os.ReadFile(out)
	if err != nil || string(got) != res.Patch || res.Form != "documents" || !strings.Contains(res.Patch, "kind: RegistryMirrorConfig") {
		t.Fatalf("file %q err %v, result %+v", got, err, res)
	}
	// A file that is not nodecache's is not replaced.
	foreign := filepath.Join(t.TempDir(), "mine.yaml")
	if err := os.WriteFile(foreign, []byte("machine: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runApp(t, "gen", "talos", "--mirror", "http://10.0.0.5:5000", "-o", foreign)
	if code != exitUsage || !strings.Contains(stderr, "not managed by nodecache") {
		t.Fatalf("foreign -o file: exit %d %q", code, stderr)
	}
	// -o never creates directories, and a directory is no file.
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent-dir", "p.yaml")
	for _, dry := range []string{"--dry-run=false", "--dry-run"} {
		code, _, stderr = runApp(t, "gen", "talos", "--mirror", "http://10.0.0.5:5000", "-o", missing, dry)
		if code != exitUsage || !strings.Contains(stderr, "directory "+filepath.Dir(missing)+" does not exist") {
			t.Fatalf("-o in a missing directory (%s): exit %d %q", dry, code, stderr)
		}
	}
	if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
		t.Fatalf("-o created the directory: %v", err)
	}
	code, _, stderr = runApp(t, "gen", "talos", "--mirror", "http://10.0.0.5:5000", "-o", dir)
	if code != exitUsage || !strings.Contains(stderr, "is a directory") {
		t.Fatalf("-o a directory: exit %d %q", code, stderr)
	}
	// newuser2 item 6: a removal from a machine config without the mirror has nothing to do:
	// exit 0 as gen containerd --remove, no patch on stdout, -o FILE not written.
	node := writeFile(t, t.TempDir(), "n.yaml", "version: v1alpha1\nmachine:\n  type: worker\n")
	unpatch := filepath.Join(t.TempDir(), "unpatch.yaml")
	for _, extra := range [][]string{nil, {"-o", unpatch}} {
		code, stdout, stderr = runApp(t, append([]string{"gen", "talos", "--remove", "--mirror", "http://10.0.0.9:5000", "--machine-config", node}, extra...)...)
		if want := "the machine config lists no mirror with an endpoint at http://10.0.0.9:5000: nothing to remove\n"; code != 0 || stdout != "" || stderr != want {
			t.Fatalf("remove %v with nothing to remove: exit %d, stdout %q, stderr %q; want 0, nothing, %q", extra, code, stdout, stderr, want)
		}
	}
	if _, err := os.Stat(unpatch); !os.IsNotExist(err) {
		t.Fatalf("-o written with nothing to remove: %v", err)
	}
}

func TestGenCrioCLI(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var rep struct {
		AutoReload bool `json:"auto_reload"`
		Reload     struct {
			Skipped string `json:"skipped"`
		} `json:"reload"`
	}
	runAppJSON(t, &rep, "gen", "crio", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--crio-version", "1.31.1", "--no-reload", "--output", "json", "--log-level", "error")
	if !rep.AutoReload || rep.Reload.Skipped != "--no-reload" {
		t.Fatalf("report %+v", rep)
	}
	drop, err := os.ReadFile(filepath.Join(root, "etc/containers/registries.conf.d/90-nodecache.conf"))
	if err != nil || !strings.Contains(string(drop), "10.0.0.5:5000/docker.io") {
		t.Fatalf("drop-in %q %v", drop, err)
	}
	// newuser2 item 19: the summary of a CRI-O whose version is unknown says so in words.
	_, _, stderr := runApp(t, "gen", "crio", "--host-root", t.TempDir(), "--mirror", "http://10.0.0.5:5000", "--upstream", "docker.io", "--dry-run", "--log-level", "error")
	if !strings.HasPrefix(stderr, "crio (version unknown): mirror http://10.0.0.5:5000 for docker.io\n") {
		t.Fatalf("summary of an unknown version: %q", stderr)
	}
}

// TestGenCrioRemoveWithoutMirror: --remove needs no --mirror (it finds what is ours on disk),
// with and without --dry-run, and takes the CA copy of an https mirror away too.
func TestGenCrioRemoveWithoutMirror(t *testing.T) {
	t.Parallel()
	root := bootstraptest.HostRoot(t, map[string]string{"/etc/pki/mirror-ca.pem": string(bootstraptest.CA(t))})
	code, _, stderr := runApp(t, "gen", "crio", "--host-root", root, "--mirror", "https://cache.example:5443", "--mirror-ca", "/etc/pki/mirror-ca.pem",
		"--crio-version", "1.29.1", "--no-reload", "--log-level", "error")
	if code != 0 {
		t.Fatalf("gen: exit %d: %s", code, stderr)
	}
	drop := filepath.Join(root, "etc/containers/registries.conf.d/90-nodecache.conf")
	ca := filepath.Join(root, "etc/containers/certs.d/cache.example:5443/nodecache-mirror-ca.crt")
	for _, p := range []string{drop, ca} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("gen did not write %s: %v", p, err)
		}
	}
	base := []string{"gen", "crio", "--host-root", root, "--remove", "--crio-version", "1.29.1", "--no-reload", "--log-level", "error"}
	code, stdout, stderr := runApp(t, append(base, "--dry-run")...)
	if code != 0 || strings.Contains(stdout+stderr, "PANIC") || !strings.Contains(stderr, "would remove /etc/containers/registries.conf.d/90-nodecache.conf") ||
		!strings.Contains(stderr, "would remove /etc/containers/certs.d/cache.example:5443/nodecache-mirror-ca.crt") || strings.Contains(stdout, "would remove") {
		t.Fatalf("remove --dry-run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if _, err := os.Stat(drop); err != nil {
		t.Fatalf("--dry-run removed the drop-in: %v", err)
	}
	code, stdout, stderr = runApp(t, base...)
	if code != 0 || strings.Contains(stdout+stderr, "PANIC") {
		t.Fatalf("remove: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, p := range []string{drop, ca, filepath.Dir(ca)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s still there after --remove: %v", p, err)
		}
	}
}

func assertFile(t *testing.T, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s changed (err %v)", p, err)
	}
}

// TestGenWarnsClusterDNSMirror (issue 26): gen talos, containerd and crio given a Service's
// cluster DNS name as --mirror still generate (exit 0) but warn, naming the mirror, why the
// node cannot use it and what to give instead: the report's warning line, on stderr (stdout is
// the patch, the diff or the report), and its JSON warnings. An address, and any removal, get no such
// warning.
func TestGenWarnsClusterDNSMirror(t *testing.T) {
	t.Parallel()
	const svc = "http://nodecache-shared.nodecache.svc:5000"
	want := "warning: --mirror " + svc + " names a Kubernetes cluster DNS name, which only pods resolve"
	cmds := map[string]func(mirror string) []string{
		"talos": func(mirror string) []string { return []string{"gen", "talos", "--mirror", mirror} },
		"containerd": func(mirror string) []string {
			return []string{"gen", "containerd", "--host-root", t.TempDir(), "--mirror", mirror, "--containerd-version", "2.1.0", "--log-level", "error"}
		},
		"crio": func(mirror string) []string {
			return []string{"gen", "crio", "--host-root", t.TempDir(), "--mirror", mirror, "--crio-version", "1.34.0", "--no-reload", "--log-level", "error"}
		},
	}
	for runtime, args := range cmds {
		t.Run(runtime, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runApp(t, args(svc)...)
			if code != 0 || !strings.Contains(stdout+stderr, want) || !strings.Contains(stdout+stderr, "NodePort") {
				t.Errorf("%s: exit %d, want 0 and %q\nstdout:\n%s\nstderr:\n%s", svc, code, want, stdout, stderr)
			}
			// Every runtime, dry run or not: stdout is the patch, diff or report; the warning is
			// on stderr alone (issue 26: containerd and crio wrote it to stdout).
			if strings.Contains(stdout, "warning:") || !strings.Contains(stderr, want) {
				t.Errorf("gen %s: the warning is not on stderr alone:\nstdout:\n%s\nstderr:\n%s", runtime, stdout, stderr)
			}
			if runtime != "talos" {
				code, stdout, stderr := runApp(t, append(args(svc), "--dry-run")...)
				if code != 0 || strings.Contains(stdout, "warning:") || !strings.Contains(stderr, want) {
					t.Errorf("gen %s --dry-run: exit %d, want 0 and the warning on stderr alone:\nstdout:\n%s\nstderr:\n%s", runtime, code, stdout, stderr)
				}
			}
			var rep struct {
				Warnings []string `json:"warnings"`
			}
			runAppJSON(t, &rep, append(args(svc), "--output", "json")...)
			if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "names a Kubernetes cluster DNS name") }) {
				t.Errorf("--output json: warnings %q", rep.Warnings)
			}
			for _, other := range [][]string{args("http://10.0.0.5:5000"), append(args(svc), "--remove")} {
				if code, stdout, stderr := runApp(t, other...); code != 0 || strings.Contains(stdout+stderr, "cluster DNS") {
					t.Errorf("%v: exit %d, want 0 and no cluster DNS warning\n%s\n%s", other, code, stdout, stderr)
				}
			}
		})
	}
}
