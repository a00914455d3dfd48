package containerd_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

func symlink(t *testing.T, root, link, target string) {
	t.Helper()
	full := filepath.Join(root, link)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, full); err != nil {
		t.Fatal(err)
	}
}

func assertLink(t *testing.T, root, link, target string) {
	t.Helper()
	got, err := os.Readlink(filepath.Join(root, link))
	if err != nil || got != target {
		t.Fatalf("%s: link %q (%v), want it kept pointing at %q", link, got, err, target)
	}
}

// TestPlanFollowsSymlinks: a config.toml, an import and a hosts directory that are symbolic
// links are read and edited where they lead (absolute targets under the host root), the links
// stay, the backup lies beside the target, and --remove restores the target byte for byte.
func TestPlanFollowsSymlinks(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	original := bootstraptest.CorpusFile(t, "containerd/schema2-no-registry", containerd.DefaultConfig)
	for _, tc := range []struct {
		name, target string // the link's text
	}{
		{name: "absolute", target: "/opt/cfg/real.toml"},
		{name: "relative", target: "../../opt/cfg/real.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			bootstraptest.WriteHostFile(t, root, "/opt/cfg/real.toml", original)
			symlink(t, root, containerd.DefaultConfig, tc.target)
			opts := containerd.Options{Mirror: m, Upstreams: []string{"docker.io"}, Daemon: v17}
			rep, err := containerd.Plan(os.DirFS(root), opts)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Schema != 2 || rep.ConfigPathAction != containerd.ConfigPathSet {
				t.Fatalf("the linked config was not read: schema %d action %s", rep.Schema, rep.ConfigPathAction)
			}
			var edit bootstrap.Change
			for _, c := range rep.Changes {
				if c.Via == containerd.DefaultConfig {
					edit = c
				}
			}
			if edit.Path != "/opt/cfg/real.toml" || edit.Action != bootstrap.ActionUpdate || edit.Backup != "/opt/cfg/real.toml"+bootstrap.BackupSuffix {
				t.Fatalf("config change %+v", rep.Changes)
			}
			bootstraptest.Apply(t, root, rep.Changes)
			assertLink(t, root, containerd.DefaultConfig, tc.target)
			if bak := bootstraptest.ReadHostFile(t, root, "/opt/cfg/real.toml"+bootstrap.BackupSuffix); !bytes.Equal(bak, original) {
				t.Fatal("backup beside the target does not hold the original")
			}
			// containerd's own loader, reading through the link.
			var cfg srvconfig.Config
			if err := srvconfig.LoadConfig(t.Context(), filepath.Join(root, "opt/cfg/real.toml"), &cfg); err != nil {
				t.Fatal(err)
			}
			var p criPlugin
			if _, err := cfg.Decode(t.Context(), containerd.PluginCRIv1, &p); err != nil || p.Registry.ConfigPath != containerd.DefaultCertsDir {
				t.Fatalf("edited target reads config_path %q (%v)", p.Registry.ConfigPath, err)
			}

			again, err := containerd.Plan(os.DirFS(root), opts)
			if err != nil || bootstrap.AnyChanged(again.Changes) {
				t.Fatalf("second run: %v %+v", err, again)
			}
			rm, err := containerd.PlanRemove(os.DirFS(root), containerd.Options{Daemon: v17})
			if err != nil {
				t.Fatal(err)
			}
			bootstraptest.Apply(t, root, rm.Changes)
			assertLink(t, root, containerd.DefaultConfig, tc.target)
			if got := bootstraptest.ReadHostFile(t, root, "/opt/cfg/real.toml"); !bytes.Equal(got, original) {
				t.Fatalf("target not restored: %s", got)
			}
		})
	}

	t.Run("linked import and hosts directory", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		main := "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n"
		imp := "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/etc/containerd/certs.d:/etc/docker/certs.d'\n"
		bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, []byte(main))
		bootstraptest.WriteHostFile(t, root, "/srv/site/registry.toml", []byte(imp))
		symlink(t, root, "/etc/containerd/conf.d/99-site.toml", "/srv/site/registry.toml")
		if err := os.MkdirAll(filepath.Join(root, "data/certs"), 0o755); err != nil {
			t.Fatal(err)
		}
		symlink(t, root, "/etc/containerd/certs.d", "/data/certs")
		rep, err := planDockerIO(root, m, v24)
		if err != nil {
			t.Fatal(err)
		}
		if rep.EditedFile != "/etc/containerd/conf.d/99-site.toml" {
			t.Fatalf("edited %q", rep.EditedFile)
		}
		bootstraptest.Apply(t, root, rep.Changes)
		assertLink(t, root, "/etc/containerd/conf.d/99-site.toml", "/srv/site/registry.toml")
		assertLink(t, root, "/etc/containerd/certs.d", "/data/certs")
		if got := string(bootstraptest.ReadHostFile(t, root, "/srv/site/registry.toml")); !strings.Contains(got, "config_path = '/etc/containerd/certs.d'\n") {
			t.Fatalf("import target not edited:\n%s", got)
		}
		if bootstraptest.ReadHostFile(t, root, "/data/certs/docker.io/hosts.toml") == nil {
			t.Fatal("hosts.toml not written into the linked directory's target")
		}
		rm, err := containerd.PlanRemove(os.DirFS(root), containerd.Options{Daemon: v24})
		if err != nil {
			t.Fatal(err)
		}
		bootstraptest.Apply(t, root, rm.Changes)
		if got := bootstraptest.ReadHostFile(t, root, "/srv/site/registry.toml"); string(got) != imp {
			t.Fatalf("import target not restored: %s", got)
		}
		if _, err := os.Stat(filepath.Join(root, "data/certs/docker.io")); !os.IsNotExist(err) {
			t.Fatalf("hosts.toml or its directory left in the linked directory: %v", err)
		}
		assertLink(t, root, "/etc/containerd/certs.d", "/data/certs")
	})

	t.Run("unsafe links refused", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			links map[string]string
			want  string
		}{
			// /etc/hostname exists on this machine, not under the host root.
			{name: "dangling", links: map[string]string{containerd.DefaultConfig: "/etc/hostname"}, want: "/etc/containerd/config.toml is a symbolic link to /etc/hostname"},
			{name: "loop", links: map[string]string{containerd.DefaultConfig: "config.toml.2", "/etc/containerd/config.toml.2": "config.toml"}, want: "symbolic links"},
		} {
			root := t.TempDir()
			for l, target := range tc.links {
				symlink(t, root, l, target)
			}
			_, err := planDockerIO(root, m, v17)
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s: %v, want a refusal containing %q", tc.name, err, tc.want)
			}
			for l, target := range tc.links {
				assertLink(t, root, l, target)
			}
		}
	})
}
