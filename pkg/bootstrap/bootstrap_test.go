package bootstrap_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestApplyFailurePartWayNamesWhatWasDone (newuser2 item 16): when a change fails after others
// were applied, the error names the failing file and the files already written, which stay.
// Here the first change creates a file where the second needs a directory, so the second
// fails only while applying, after every check passed.
func TestApplyFailurePartWayNamesWhatWasDone(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	data := []byte(mirrorapi.ManagedMarker + "\n")
	changes := []bootstrap.Change{
		{Path: "/etc/certs.d/docker.io/hosts.toml", Action: bootstrap.ActionCreate, New: data, Mode: 0o644},
		{Path: "/etc/certs.d/ghcr.io", Action: bootstrap.ActionCreate, New: data, Mode: 0o644},
		{Path: "/etc/certs.d/ghcr.io/hosts.toml", Action: bootstrap.ActionCreate, New: data, Mode: 0o644},
	}
	err := bootstrap.Applier{Root: root}.Apply(t.Context(), changes)
	want := "; already done before it, and left in place (no rollback): create /etc/certs.d/docker.io/hosts.toml, create /etc/certs.d/ghcr.io (run again once the cause is fixed, or with --remove to undo)"
	if err == nil || !strings.HasPrefix(err.Error(), "create directory for /etc/certs.d/ghcr.io/hosts.toml: ") || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("err %v\nwant the failing file first, ending %q", err, want)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/certs.d/docker.io/hosts.toml")); err != nil {
		t.Fatalf("the file written before the failure is gone: %v", err)
	}
}

func TestApplyWritesBacksUpOnceAndRefusesStale(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	a := bootstrap.Applier{Root: root}
	cfg := filepath.Join(root, "etc/app/config.toml")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o755); err != nil {
		t.Fatal(err)
	}
	orig := []byte("a = 1\n")
	if err := os.WriteFile(cfg, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	fsys := os.DirFS(root)

	// Edit 1: backup written with the original, mode kept.
	old, _, _ := bootstrap.ReadFile(fsys, "/etc/app/config.toml")
	c := bootstrap.PlanEdit("/etc/app/config.toml", old, []byte("a = 2\n"))
	if c.Action != bootstrap.ActionUpdate || c.Backup != "/etc/app/config.toml.nodecache.bak" {
		t.Fatalf("plan %+v", c)
	}
	if err := a.Apply(t.Context(), []bootstrap.Change{c}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cfg + ".nodecache.bak"); string(b) != string(orig) {
		t.Fatalf("backup %q", b)
	}
	if fi, _ := os.Stat(cfg); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want the file's own 0600", fi.Mode().Perm())
	}

	// Edit 2: the backup is never overwritten.
	old, _, _ = bootstrap.ReadFile(fsys, "/etc/app/config.toml")
	if err := a.Apply(t.Context(), []bootstrap.Change{bootstrap.PlanEdit("/etc/app/config.toml", old, []byte("a = 3\n"))}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cfg + ".nodecache.bak"); string(b) != string(orig) {
		t.Fatalf("backup overwritten: %q", b)
	}

	// Unchanged bytes: no write (inode and mtime stay).
	st1, _ := os.Stat(cfg)
	old, _, _ = bootstrap.ReadFile(fsys, "/etc/app/config.toml")
	same := bootstrap.PlanEdit("/etc/app/config.toml", old, old)
	if same.Changed() {
		t.Fatal("unchanged content planned as a change")
	}
	if err := a.Apply(t.Context(), []bootstrap.Change{same}); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(cfg)
	if !os.SameFile(st1, st2) || !st1.ModTime().Equal(st2.ModTime()) {
		t.Fatal("unchanged file rewritten")
	}

	// A file changed after planning: nothing at all is applied.
	stale := bootstrap.PlanEdit("/etc/app/config.toml", []byte("a = 1\n"), []byte("a = 9\n"))
	other, err := bootstrap.PlanOwned(fsys, "/etc/app/new.conf", 0o644, []byte(mirrorapi.ManagedMarker+"\nx\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(t.Context(), []bootstrap.Change{other, stale}); !errors.Is(err, bootstrap.ErrStale) {
		t.Fatalf("want ErrStale, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/app/new.conf")); !os.IsNotExist(err) {
		t.Fatal("a change was applied although a later one was stale")
	}

	// Restore moves the backup back.
	cur, _, _ := bootstrap.ReadFile(fsys, "/etc/app/config.toml")
	r := bootstrap.Change{Path: "/etc/app/config.toml", Action: bootstrap.ActionRestore, Old: cur, New: orig, Backup: "/etc/app/config.toml.nodecache.bak"}
	if err := a.Apply(t.Context(), []bootstrap.Change{r}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cfg); string(b) != string(orig) {
		t.Fatalf("restored %q", b)
	}
	if _, err := os.Stat(cfg + ".nodecache.bak"); !os.IsNotExist(err) {
		t.Fatal("backup still there after restore")
	}
	// No temp files left behind.
	ents, _ := os.ReadDir(filepath.Dir(cfg))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".nodecache-") {
			t.Fatalf("temp file left: %s", e.Name())
		}
	}
}

func TestOwnedFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	fsys := os.DirFS(root)
	mine := []byte(mirrorapi.ManagedMarker + "\nv = 1\n")
	if _, err := bootstrap.PlanOwned(fsys, "/x.conf", 0o644, []byte("no marker\n")); err == nil {
		t.Fatal("content without the marker accepted")
	}
	if err := os.WriteFile(filepath.Join(root, "x.conf"), []byte("user's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.PlanOwned(fsys, "/x.conf", 0o644, mine); !errors.Is(err, bootstrap.ErrRefused) {
		t.Fatalf("a user's file would be replaced: %v", err)
	}
	_, ok, note, err := bootstrap.PlanRemoveOwned(fsys, "/x.conf", false)
	if err != nil || ok || !strings.Contains(note, "not managed") {
		t.Fatalf("a user's file would be removed: %v %v %q", ok, err, note)
	}
	if err := os.WriteFile(filepath.Join(root, "x.conf"), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	c, ok, _, err := bootstrap.PlanRemoveOwned(fsys, "/x.conf", false)
	if err != nil || !ok || c.Action != bootstrap.ActionRemove {
		t.Fatalf("own file not removed: %+v %v %v", c, ok, err)
	}
	d, err := bootstrap.Diff([]bootstrap.Change{c})
	if err != nil || !strings.Contains(d, "+++ /dev/null") || !strings.Contains(d, "-v = 1") {
		t.Fatalf("diff %q %v", d, err)
	}
}

func TestParseVersion(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bootstrap.Version{
		"2.4.2": {2, 4, 2},
		"v1.7":  {1, 7, 0},
		"containerd github.com/containerd/containerd/v2 v2.4.2 1b2c3d4":            {2, 4, 2},
		"containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da": {1, 7, 27},
		"crio version 1.30.2\n":                                             {1, 30, 2},
		"Version:        1.31.0\nGitCommit: abc\n":                          {1, 31, 0},
		"containerd github.com/containerd/containerd 1.6.2~ds1 1.6.2~ds1-1": {1, 6, 2},
	} {
		got, err := bootstrap.ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "latest", "v2", "0.0.0"} {
		if _, err := bootstrap.ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) accepted", bad)
		}
	}
}

// TestParseVersionFlag (newuser trial 2, F12): a version flag is exactly MAJOR.MINOR[.PATCH];
// what ParseVersion would find inside a longer text is refused.
func TestParseVersionFlag(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bootstrap.Version{
		"2.4.2": {2, 4, 2}, "v2.4.2": {2, 4, 2}, "1.7": {1, 7, 0}, "2.1.0-rc.1": {2, 1, 0}, " 2.3.7 ": {2, 3, 7},
		"2.4.2+unknown": {2, 4, 2}, "v2.1.0-rc.1+abc.1": {2, 1, 0},
	} {
		if got, err := bootstrap.ParseVersionFlag(in, "2.4.2"); err != nil || got != want {
			t.Errorf("ParseVersionFlag(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "latest", "v2", "0.0.0", "2.0.junk", "2.4.-1", "2.4.2.9", "containerd 2.4.2", "2.4.2x"} {
		if _, err := bootstrap.ParseVersionFlag(bad, "1.34.1"); err == nil || !strings.Contains(err.Error(), "e.g. 1.34.1") {
			t.Errorf("ParseVersionFlag(%q): %v, want a refusal showing the example", bad, err)
		}
	}
}

func TestUpstreamNames(t *testing.T) {
	t.Parallel()
	def, err := bootstrap.UpstreamNames(nil)
	if err != nil || strings.Join(def, ",") != "docker.io,ghcr.io,registry.k8s.io,quay.io,gcr.io" {
		t.Fatalf("defaults %v %v", def, err)
	}
	got, err := bootstrap.UpstreamNames([]string{"Docker.IO=http://other-cache:5000", "localhost:5001"})
	if err != nil || strings.Join(got, ",") != "docker.io,localhost:5001" {
		t.Fatalf("%v %v", got, err)
	}
	if _, err := bootstrap.UpstreamNames([]string{"ghcr.io", "ghcr.io"}); !errors.Is(err, bootstrap.ErrRefused) {
		t.Fatalf("duplicate accepted: %v", err)
	}
}
