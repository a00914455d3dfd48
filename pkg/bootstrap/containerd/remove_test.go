package containerd_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// TestRemoveRestoresEmptyConfigAnyVersion (newuser3 item 2): an empty or comments-only
// config.toml that gen gave the `version` of one release (2 for 1.x, 3 for 2.0–2.2, 4 from 2.3)
// is restored byte for byte by --remove whatever release is given then (each pair across the
// schema boundaries, and none with no daemon to ask), the backup goes, nothing is warned; a file
// changed since gen is left with a warning, whichever release is given.
func TestRemoveRestoresEmptyConfigAnyVersion(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://127.0.0.1:5000")
	releases := []containerd.Release{
		{Major: 1, Minor: 7, Patch: 35}, {Major: 2, Minor: 0, Patch: 5}, {Major: 2, Minor: 2, Patch: 1}, {Major: 2, Minor: 4, Patch: 2},
	}
	originals := map[string][]byte{"empty": {}, "comments only": []byte("# site defaults\n# nothing set")}
	for origName, orig := range originals {
		for _, genV := range releases {
			for _, rmV := range append(releases, containerd.Release{}) {
				for _, userEdit := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/gen %s/remove %s/user edit %v", origName, genV, rmV, userEdit), func(t *testing.T) {
						t.Parallel()
						root := t.TempDir()
						bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, orig)
						planApply(t, root, containerd.Options{Mirror: m, Daemon: genV, Upstreams: []string{"docker.io"}}, false)
						gen := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig)
						if bytes.Equal(gen, orig) || bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig+bootstrap.BackupSuffix) == nil {
							t.Fatalf("gen did not edit config.toml with a backup: %q", gen)
						}
						edited := append(bytes.Clone(gen), "\n# tuned by hand\n"...)
						if userEdit {
							bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, edited)
						}
						rep := planApply(t, root, containerd.Options{Daemon: rmV}, true)
						got := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig)
						if userEdit {
							if !bytes.Equal(got, edited) || !hasWarning(rep, "changed since nodecache edited it") {
								t.Fatalf("user's edit: config.toml now %q, warnings %q; want it left with a warning", got, rep.Warnings)
							}
							return
						}
						if !bytes.Equal(got, orig) || got == nil {
							t.Fatalf("config.toml = %q, want the original %q (warnings %q)", got, orig, rep.Warnings)
						}
						if bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig+bootstrap.BackupSuffix) != nil {
							t.Fatal("backup left after restore")
						}
						if len(rep.Warnings) != 0 || !rep.RestartRequired {
							t.Fatalf("warnings %q, restart_required %v; want none, true", rep.Warnings, rep.RestartRequired)
						}
					})
				}
			}
		}
	}
}

func hasWarning(rep *containerd.Report, part string) bool {
	for _, w := range rep.Warnings {
		if strings.Contains(w, part) {
			return true
		}
	}
	return false
}

// TestRemoveAfterPatchWarnsAboutConfigPath (newuser3 item 3): after `gen --dry-run | patch -p1`
// (the same files as gen writes, but no config.toml.nodecache.bak), --remove deletes the
// hosts.toml files and the directory gen created, leaves config.toml (nothing tells whether the
// config_path line is gen's or the site's) and warns naming the file, the line and what to do. A
// site's own config_path naming its own directory, and a config.toml gen created, get no warning.
func TestRemoveAfterPatchWarnsAboutConfigPath(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://127.0.0.1:5000")
	opts := containerd.Options{Mirror: m, Daemon: containerd.Release{Major: 2, Minor: 0, Patch: 5}, Upstreams: []string{"docker.io"}}
	for _, tc := range []struct {
		name     string
		config   []byte // nil: none
		siteDir  bool   // certs.d exists before gen
		wantWarn bool
	}{
		{"empty config.toml", []byte{}, false, true},
		{"registry table without config_path", []byte("version = 3\n\n[plugins.'io.containerd.cri.v1.images'.registry]\n"), false, true},
		{"site's config_path and directory", []byte(siteConfig), true, false},
		{"no config.toml: gen creates it", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			if tc.config != nil {
				bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, tc.config)
			}
			if tc.siteDir {
				bootstraptest.WriteHostFile(t, root, siteCerts+"/quay.io/hosts.toml", []byte("server = \"https://quay.io\"\n"))
			}
			planApply(t, root, opts, false)
			// What `patch -p1` of the dry-run leaves: the same files, no backup.
			if err := os.Remove(filepath.Join(root, containerd.DefaultConfig+bootstrap.BackupSuffix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			patched := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig)
			rep := planApply(t, root, containerd.Options{Daemon: opts.Daemon}, true)
			if got := bootstraptest.ReadHostFile(t, root, siteCerts+"/docker.io/hosts.toml"); got != nil {
				t.Fatalf("hosts.toml left: %q", got)
			}
			var warned []string
			for _, w := range rep.Warnings {
				if strings.Contains(w, "config_path") {
					warned = append(warned, w)
				}
			}
			if !tc.wantWarn {
				if len(warned) != 0 {
					t.Fatalf("warnings %q, want none about config_path", warned)
				}
				return
			}
			want := []string{containerd.DefaultConfig + " keeps config_path = \"" + siteCerts + "\" in [plugins.\"io.containerd.cri.v1.images\".registry]",
				"no " + containerd.DefaultConfig + bootstrap.BackupSuffix, "delete that line", "restart containerd"}
			if len(warned) != 1 || !containsAll(warned[0], want) {
				t.Fatalf("warnings %q, want one saying %q", rep.Warnings, want)
			}
			if got := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig); !bytes.Equal(got, patched) {
				t.Fatalf("config.toml without backup changed by --remove: %q, was %q", got, patched)
			}
			if _, err := os.Stat(filepath.Join(root, siteCerts)); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("%s left after --remove (%v)", siteCerts, err)
			}
		})
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// snapshot returns every regular file and link under root (host path -> content, or "-> target"
// for a link), to show that a refused run changed nothing.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			out[rel] = "-> " + target
			return err
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLinkedBackupRefused (issue 20, item 2): a <file>.nodecache.bak that is a symbolic link to
// another file (/srv/data/important.toml, holding the original's bytes, so it passes the restore
// test) is refused, naming the link and its target, by every plan that would read it, move it or
// write it: --remove of an edited config.toml, --remove of an adopted site hosts.toml, and gen
// of a config.toml whose backup is yet to be written; nothing on the host changes.
func TestLinkedBackupRefused(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	const important = "/srv/data/important.toml"
	original := []byte("version = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n")
	siteFile := siteCerts + "/registry.local:5000/hosts.toml"
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, root string) (backup string, content []byte) // the backup to turn into a link
		remove bool
	}{
		{"remove: config.toml's backup", func(t *testing.T, root string) (string, []byte) {
			bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, original)
			planApply(t, root, containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"docker.io"}}, false)
			return containerd.DefaultConfig + bootstrap.BackupSuffix, original
		}, true},
		{"remove: an adopted site hosts.toml's backup", func(t *testing.T, root string) (string, []byte) {
			bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, []byte(siteConfig))
			bootstraptest.WriteHostFile(t, root, siteFile, []byte(siteHostsTOML))
			planApply(t, root, containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"docker.io", "registry.local:5000"}}, false)
			return siteFile + bootstrap.BackupSuffix, []byte(siteHostsTOML)
		}, true},
		{"gen: config.toml's backup to be written", func(t *testing.T, root string) (string, []byte) {
			bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, original)
			bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig+bootstrap.BackupSuffix, original)
			return containerd.DefaultConfig + bootstrap.BackupSuffix, original
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			bak, content := tc.setup(t, root)
			if got := bootstraptest.ReadHostFile(t, root, bak); !bytes.Equal(got, content) {
				t.Fatalf("setup: %s holds %q, want %q", bak, got, content)
			}
			bootstraptest.WriteHostFile(t, root, important, content)
			if err := os.Remove(filepath.Join(root, bak)); err != nil {
				t.Fatal(err)
			}
			symlink(t, root, bak, important)
			before := snapshot(t, root)

			var err error
			if tc.remove {
				_, err = containerd.PlanRemove(os.DirFS(root), containerd.Options{Daemon: v24})
			} else {
				_, err = containerd.Plan(os.DirFS(root), containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"docker.io"}})
			}
			want := bak + " is a symbolic link to " + important
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), want) {
				t.Fatalf("plan: %v; want a refusal saying %q", err, want)
			}
			if after := snapshot(t, root); !maps.Equal(after, before) {
				t.Fatalf("the host changed:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}
