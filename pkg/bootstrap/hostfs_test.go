package bootstrap_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// hostTree builds a host root: files (host path -> content) and links (host path -> target,
// written verbatim).
func hostTree(t *testing.T, files, links map[string]string) string {
	t.Helper()
	root := bootstraptest.HostRoot(t, files)
	for p, target := range links {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestResolve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		files  map[string]string
		links  map[string]string
		path   string
		want   string // resolved host path
		refuse string // substring of a refusal
	}{
		{name: "plain file", files: map[string]string{"/etc/a.toml": "x"}, path: "/etc/a.toml", want: "/etc/a.toml"},
		{name: "missing tail kept", files: map[string]string{"/etc/a.toml": "x"}, path: "/etc/new/dir/f", want: "/etc/new/dir/f"},
		{name: "absolute target under the host root", files: map[string]string{"/opt/cfg/real.toml": "x"},
			links: map[string]string{"/etc/containerd/config.toml": "/opt/cfg/real.toml"}, path: "/etc/containerd/config.toml", want: "/opt/cfg/real.toml"},
		{name: "relative target", files: map[string]string{"/opt/cfg/real.toml": "x"},
			links: map[string]string{"/etc/containerd/config.toml": "../../opt/cfg/real.toml"}, path: "/etc/containerd/config.toml", want: "/opt/cfg/real.toml"},
		{name: "dotdot stops at the host root", files: map[string]string{"/opt/cfg/real.toml": "x"},
			links: map[string]string{"/etc/containerd/config.toml": "../../../../../../../opt/cfg/real.toml"}, path: "/etc/containerd/config.toml", want: "/opt/cfg/real.toml"},
		{name: "linked directory with a missing tail", files: map[string]string{"/data/certs/keep": ""},
			links: map[string]string{"/etc/containerd/certs.d": "/data/certs"}, path: "/etc/containerd/certs.d/docker.io/hosts.toml", want: "/data/certs/docker.io/hosts.toml"},
		{name: "chain of links", files: map[string]string{"/opt/c.toml": "x"},
			links: map[string]string{"/etc/a": "b", "/etc/b": "/var/c", "/var/c": "../opt/c.toml"}, path: "/etc/a", want: "/opt/c.toml"},
		{name: "dotdot after a linked directory is physical", files: map[string]string{"/data/x/f": "x", "/data/g": "y"},
			links: map[string]string{"/etc/d": "/data/x"}, path: "/etc/d/../g", want: "/data/g"},
		// /etc/hostname exists on this machine but not under the host root: the link must not
		// be followed out of the host root.
		{name: "absolute target absent under the host root", links: map[string]string{"/etc/containerd/config.toml": "/etc/hostname"},
			path: "/etc/containerd/config.toml", refuse: "/etc/containerd/config.toml is a symbolic link to /etc/hostname, which does not exist"},
		{name: "dangling directory link", links: map[string]string{"/etc/containerd/certs.d": "/data/nowhere"},
			path: "/etc/containerd/certs.d/docker.io/hosts.toml", refuse: "/etc/containerd/certs.d is a symbolic link to /data/nowhere"},
		{name: "regular file where a directory goes", files: map[string]string{"/etc/containerd/certs.d/docker.io": ""},
			path: "/etc/containerd/certs.d/docker.io/hosts.toml", refuse: "/etc/containerd/certs.d/docker.io is a regular file where a directory is expected (on the way to /etc/containerd/certs.d/docker.io/hosts.toml)"},
		{name: "link to a regular file where a directory goes", files: map[string]string{"/data/f": ""}, links: map[string]string{"/etc/containerd/certs.d": "/data/f"},
			path: "/etc/containerd/certs.d/docker.io/hosts.toml", refuse: "/data/f is a regular file where a directory is expected"},
		{name: "dotdot after a regular file", files: map[string]string{"/etc/f": "", "/etc/g": ""}, path: "/etc/f/../g", refuse: "/etc/f is a regular file where a directory is expected"},
		{name: "loop", links: map[string]string{"/etc/a": "b", "/etc/b": "a"}, path: "/etc/a", refuse: "more than 40 symbolic links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := hostTree(t, tc.files, tc.links)
			for _, fsys := range []fs.FS{os.DirFS(root), bootstrap.HostFS(root)} {
				got, err := bootstrap.Resolve(fsys, tc.path)
				if tc.refuse != "" {
					if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.refuse) {
						t.Fatalf("Resolve(%s) = %q, %v; want a refusal containing %q", tc.path, got, err, tc.refuse)
					}
					continue
				}
				if err != nil || got != tc.want {
					t.Fatalf("Resolve(%s) = %q, %v; want %q", tc.path, got, err, tc.want)
				}
			}
		})
	}
}

// TestHostFSReadsUnderTheRoot: reads through HostFS reach the link's target under the host
// root, where os.DirFS would read this machine's own file.
func TestHostFSReadsUnderTheRoot(t *testing.T) {
	t.Parallel()
	outside := filepath.Join(t.TempDir(), "outside.toml")
	if err := os.WriteFile(outside, []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := hostTree(t, map[string]string{outside: "inside"}, map[string]string{"/etc/c.toml": outside})
	if b, _, err := bootstrap.ReadFile(bootstrap.HostFS(root), "/etc/c.toml"); err != nil || string(b) != "inside" {
		t.Fatalf("HostFS read %q, %v; want the file under the host root", b, err)
	}
	if b, _, _ := bootstrap.ReadFile(os.DirFS(root), "/etc/c.toml"); string(b) != "outside" {
		t.Fatalf("the test does not set up the escape it guards against: os.DirFS read %q", b)
	}
	ents, err := fs.ReadDir(bootstrap.HostFS(root), "etc")
	if err != nil || len(ents) != 1 || ents[0].Type()&fs.ModeSymlink == 0 {
		t.Fatalf("ReadDir shows the link itself: %v %v", ents, err)
	}
}

// TestApplyEditsLinkTargets: ResolveChanges points an edit at the link's target (backup beside
// it), Apply keeps the link, and a link that appears after planning stops Apply.
func TestApplyEditsLinkTargets(t *testing.T) {
	t.Parallel()
	root := hostTree(t, map[string]string{"/opt/cfg/real.toml": "a = 1\n"}, map[string]string{"/etc/app/config.toml": "../../opt/cfg/real.toml"})
	fsys := bootstrap.HostFS(root)
	old, _, err := bootstrap.ReadFile(fsys, "/etc/app/config.toml")
	if err != nil || string(old) != "a = 1\n" {
		t.Fatalf("read through the link: %q %v", old, err)
	}
	cs, err := bootstrap.ResolveChanges(fsys, []bootstrap.Change{bootstrap.PlanEdit("/etc/app/config.toml", old, []byte("a = 2\n"))})
	if err != nil {
		t.Fatal(err)
	}
	if cs[0].Path != "/opt/cfg/real.toml" || cs[0].Via != "/etc/app/config.toml" || cs[0].Backup != "/opt/cfg/real.toml"+bootstrap.BackupSuffix {
		t.Fatalf("resolved change %+v", cs[0])
	}
	bootstraptest.Apply(t, root, cs)
	if target, err := os.Readlink(filepath.Join(root, "etc/app/config.toml")); err != nil || target != "../../opt/cfg/real.toml" {
		t.Fatalf("link replaced: %q %v", target, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "opt/cfg/real.toml")); string(b) != "a = 2\n" {
		t.Fatalf("target %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "opt/cfg/real.toml"+bootstrap.BackupSuffix)); string(b) != "a = 1\n" {
		t.Fatalf("backup %q", b)
	}

	// Two changes reaching one file are refused.
	if _, err := bootstrap.ResolveChanges(fsys, []bootstrap.Change{
		bootstrap.PlanEdit("/etc/app/config.toml", old, []byte("x")), bootstrap.PlanEdit("/opt/cfg/real.toml", old, []byte("y")),
	}); !errors.Is(err, bootstrap.ErrRefused) {
		t.Fatalf("two changes of one file: %v", err)
	}

	// A plan made before a directory became a link is not applied.
	if err := os.MkdirAll(filepath.Join(root, "etc/new"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := bootstrap.PlanOwned(fsys, "/etc/new/f.conf", 0o644, []byte(mirrorapi.ManagedMarker+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "etc/new")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt", filepath.Join(root, "etc/new")); err != nil {
		t.Fatal(err)
	}
	if err := (bootstrap.Applier{Root: root}).Apply(t.Context(), []bootstrap.Change{c}); !errors.Is(err, bootstrap.ErrStale) {
		t.Fatalf("apply through a new link: %v, want ErrStale", err)
	}
	if _, err := os.Stat(filepath.Join(root, "opt/f.conf")); !os.IsNotExist(err) {
		t.Fatal("written through the new link")
	}
}

// TestPruneOnlyOwnDirectories: removing a file through a linked directory keeps the directory
// the link leads to; under a linked parent the file's own directory still goes when empty.
func TestPruneOnlyOwnDirectories(t *testing.T) {
	t.Parallel()
	mine := mirrorapi.ManagedMarker + "\n"
	root := hostTree(t, map[string]string{"/data/dio/hosts.toml": mine, "/data/certs/ghcr.io/hosts.toml": mine},
		map[string]string{"/etc/certs.d/docker.io": "/data/dio", "/etc/linked.d": "/data/certs"})
	fsys := bootstrap.HostFS(root)
	var cs []bootstrap.Change
	for _, p := range []string{"/etc/certs.d/docker.io/hosts.toml", "/etc/linked.d/ghcr.io/hosts.toml"} {
		c, ok, _, err := bootstrap.PlanRemoveOwned(fsys, p, true)
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", p, ok, err)
		}
		cs = append(cs, c)
	}
	cs, err := bootstrap.ResolveChanges(fsys, cs)
	if err != nil {
		t.Fatal(err)
	}
	bootstraptest.Apply(t, root, cs)
	if fi, err := os.Stat(filepath.Join(root, "data/dio")); err != nil || !fi.IsDir() {
		t.Fatalf("the directory a link leads to was pruned: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "data/certs/ghcr.io")); !os.IsNotExist(err) {
		t.Fatalf("own empty directory under a linked parent kept: %v", err)
	}
}

// TestApplyRefusesLinkedBackup (issue 20, item 2): a backup that is a symbolic link is refused
// (ErrRefused, naming the link and its target) when the changes are resolved, and when it became
// a link after planning, by Apply before it writes anything: a restore would have renamed
// /srv/data/important.toml over the config, an update would have taken it as the original. A
// restore whose backup became a directory is refused too. The files stay byte for byte.
func TestApplyRefusesLinkedBackup(t *testing.T) {
	t.Parallel()
	const (
		cfg       = "/etc/app/config.toml"
		bak       = cfg + bootstrap.BackupSuffix
		important = "/srv/data/important.toml"
	)
	files := map[string]string{cfg: "edited = true\n", bak: "original = true\n", important: "original = true\n"}
	restore := bootstrap.Change{Path: cfg, Action: bootstrap.ActionRestore, Old: []byte(files[cfg]), New: []byte(files[bak]), Backup: bak}
	update := bootstrap.PlanEdit(cfg, []byte(files[cfg]), []byte("edited = 2\n"))
	linkBackup := func(t *testing.T, root string) {
		t.Helper()
		if err := os.Remove(filepath.Join(root, bak)); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(important, filepath.Join(root, bak)); err != nil {
			t.Fatal(err)
		}
	}
	unchanged := func(t *testing.T, root string) {
		t.Helper()
		for _, p := range []string{cfg, important} {
			if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != files[p] {
				t.Fatalf("%s now %q (%v), want %q", p, b, err, files[p])
			}
		}
	}
	const refusal = bak + " is a symbolic link to " + important
	for _, c := range []bootstrap.Change{restore, update} {
		t.Run(string(c.Action), func(t *testing.T) {
			t.Parallel()
			root := hostTree(t, files, nil)
			fsys := bootstrap.HostFS(root)
			cs, err := bootstrap.ResolveChanges(fsys, []bootstrap.Change{c})
			if err != nil {
				t.Fatal(err)
			}
			linkBackup(t, root)
			if _, err := bootstrap.ResolveChanges(fsys, []bootstrap.Change{c}); !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), refusal) {
				t.Fatalf("resolve with a linked backup: %v; want a refusal saying %q", err, refusal)
			}
			err = (bootstrap.Applier{Root: root}).Apply(t.Context(), cs)
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), refusal) {
				t.Fatalf("apply after the backup became a link: %v; want a refusal saying %q", err, refusal)
			}
			unchanged(t, root)
			if target, err := os.Readlink(filepath.Join(root, bak)); err != nil || target != important {
				t.Fatalf("backup link now %q (%v)", target, err)
			}
		})
	}
	t.Run("restore from a directory", func(t *testing.T) {
		t.Parallel()
		root := hostTree(t, files, nil)
		cs, err := bootstrap.ResolveChanges(bootstrap.HostFS(root), []bootstrap.Change{restore})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(root, bak)); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(root, bak), 0o755); err != nil {
			t.Fatal(err)
		}
		err = (bootstrap.Applier{Root: root}).Apply(t.Context(), cs)
		if want := "backup " + bak + " is a directory"; !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), want) {
			t.Fatalf("apply with a directory as the backup: %v; want a refusal saying %q", err, want)
		}
		unchanged(t, root)
	})
}
