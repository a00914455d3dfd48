package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

// TestGenContainerdRemoveRefusesLinkedBackup (issue 20, item 2): after gen, config.toml's backup
// is replaced by a symbolic link to /srv/data/important.toml holding the original's bytes (so
// the restore test passes for it). --remove used to rename that file over config.toml; it now
// exits 2 naming the link and its target, and moves nothing: important.toml, config.toml and
// gen's hosts.toml byte for byte as they were, the link still there. With an absolute and a
// relative link.
func TestGenContainerdRemoveRefusesLinkedBackup(t *testing.T) {
	t.Parallel()
	for _, target := range []string{"/srv/data/important.toml", "../../srv/data/important.toml"} {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			original := []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n")
			bootstraptest.WriteHostFile(t, root, "/etc/containerd/config.toml", original)
			base := []string{"gen", "containerd", "--host-root", root, "--containerd-version", "1.7.35", "--log-level", "error"}
			if code, stdout, stderr := runApp(t, append(base, "--mirror", "http://10.0.0.5:5000", "--upstream", "docker.io")...); code != 0 {
				t.Fatalf("gen: exit %d\n%s\n%s", code, stdout, stderr)
			}
			cfg := filepath.Join(root, "etc/containerd/config.toml")
			bak := cfg + bootstrap.BackupSuffix
			assertFile(t, bak, original)
			bootstraptest.WriteHostFile(t, root, "/srv/data/important.toml", original)
			if err := os.Remove(bak); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, bak); err != nil {
				t.Fatal(err)
			}
			edited, err := os.ReadFile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			hosts := filepath.Join(root, "etc/containerd/certs.d/docker.io/hosts.toml")
			hostsBefore, err := os.ReadFile(hosts)
			if err != nil {
				t.Fatal(err)
			}

			code, stdout, stderr := runApp(t, append(base, "--remove")...)
			want := "/etc/containerd/config.toml.nodecache.bak is a symbolic link to " + target
			if code != exitUsage || !strings.Contains(stderr, want) || !strings.Contains(stderr, "nothing was changed") {
				t.Fatalf("remove: exit %d\nstdout %s\nstderr %s\nwant exit %d and %q", code, stdout, stderr, exitUsage, want)
			}
			assertFile(t, filepath.Join(root, "srv/data/important.toml"), original)
			assertFile(t, cfg, edited)
			assertFile(t, hosts, hostsBefore)
			if got, err := os.Readlink(bak); err != nil || got != target {
				t.Fatalf("backup link now %q (%v); want it left pointing at %q", got, err, target)
			}
		})
	}
}
