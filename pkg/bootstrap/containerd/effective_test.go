package containerd_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	srvversion "github.com/containerd/containerd/v2/version"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestMergeMatchesContainerd2 compares the effective registry of LoadEffective (2.x rules) with
// containerd 2.x's own loader over main files with relative imports (so containerd's loader
// sees the same files): deep merge, empty values overriding, globs in name order, each file once.
func TestMergeMatchesContainerd2(t *testing.T) {
	t.Parallel()
	reg := `[plugins."io.containerd.cri.v1.images".registry]` + "\n"
	cases := []struct {
		name  string
		files map[string]string // host path under /etc/containerd -> content
		want  string
	}{
		{"main only", map[string]string{"config.toml": "version = 3\n" + reg + "config_path = '/a'\n"}, "/a"},
		{"import overrides", map[string]string{
			"config.toml":   "version = 3\nimports = ['conf.d/x.toml']\n" + reg + "config_path = '/a'\n",
			"conf.d/x.toml": "version = 3\n" + reg + "config_path = '/b'\n",
		}, "/b"},
		{"import empty value overrides", map[string]string{
			"config.toml":   "version = 3\nimports = ['conf.d/x.toml']\n" + reg + "config_path = '/a'\n",
			"conf.d/x.toml": "version = 3\n" + reg + "config_path = ''\n",
		}, ""},
		{"import without the key keeps it", map[string]string{
			"config.toml":   "version = 3\nimports = ['conf.d/x.toml']\n" + reg + "config_path = '/a'\n",
			"conf.d/x.toml": "version = 3\n" + `[plugins."io.containerd.cri.v1.images".registry.headers]` + "\nX = ['y']\n",
		}, "/a"},
		{"glob in name order, last wins", map[string]string{
			"config.toml":   "version = 3\nimports = ['conf.d/*.toml']\n",
			"conf.d/b.toml": "version = 3\n" + reg + "config_path = '/b'\n",
			"conf.d/a.toml": "version = 3\n" + reg + "config_path = '/a'\n",
		}, "/b"},
		{"nested import, circular once", map[string]string{
			"config.toml":   "version = 3\nimports = ['conf.d/a.toml']\n",
			"conf.d/a.toml": "version = 3\nimports = ['b.toml', '../config.toml']\n" + reg + "config_path = '/a'\n",
			"conf.d/b.toml": "version = 3\n" + reg + "config_path = '/nested'\n",
		}, "/nested"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			for p, c := range tc.files {
				bootstraptest.WriteHostFile(t, root, "/etc/containerd/"+p, []byte(c))
			}
			eff, err := containerd.LoadEffective(root, containerd.DefaultConfig, containerd.LoadOptions{Daemon: v24})
			if err != nil {
				t.Fatal(err)
			}
			var cfg srvconfig.Config
			if err := srvconfig.LoadConfig(t.Context(), filepath.Join(root, containerd.DefaultConfig), &cfg); err != nil {
				t.Fatal(err)
			}
			var images criPlugin
			if _, err := cfg.Decode(t.Context(), containerd.PluginImages, &images); err != nil {
				t.Fatal(err)
			}
			if images.Registry.ConfigPath != tc.want || eff.Registry.ConfigPath != tc.want {
				t.Fatalf("containerd reads %q, LoadEffective %q, want %q", images.Registry.ConfigPath, eff.Registry.ConfigPath, tc.want)
			}
		})
	}
}

// TestImportRules: which file wins and which one gen edits, under 1.x and 2.x rules.
func TestImportRules(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")

	t.Run("1.x replaces the whole plugin table: the import is edited", func(t *testing.T) {
		t.Parallel()
		root := bootstraptest.HostRoot(t, map[string]string{
			"/etc/containerd/config.toml":         "version = 2\nimports = ['/etc/containerd/conf.d/*.toml']\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\nconfig_path = '/etc/containerd/certs.d'\n",
			"/etc/containerd/conf.d/10-snap.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nsnapshotter = 'native'\n",
		})
		eff, err := containerd.LoadEffective(root, containerd.DefaultConfig, containerd.LoadOptions{Daemon: v17})
		if err != nil {
			t.Fatal(err)
		}
		if eff.Registry.ConfigPath != "" || eff.PluginFrom != "/etc/containerd/conf.d/10-snap.toml" {
			t.Fatalf("1.x: config_path %q from %q, want dropped by the import's plugin table", eff.Registry.ConfigPath, eff.PluginFrom)
		}
		// 2.x deep-merges: the main file's value stands.
		eff2, err := containerd.LoadEffective(root, containerd.DefaultConfig, containerd.LoadOptions{Daemon: v24})
		if err != nil {
			t.Fatal(err)
		}
		if eff2.Registry.ConfigPath != "/etc/containerd/certs.d" || eff2.ConfigPathFrom != "/etc/containerd/config.toml" {
			t.Fatalf("2.x: %q from %q", eff2.Registry.ConfigPath, eff2.ConfigPathFrom)
		}
		rep, err := planDockerIO(root, m, v17)
		if err != nil {
			t.Fatal(err)
		}
		if rep.EditedFile != "/etc/containerd/conf.d/10-snap.toml" || rep.ConfigPathAction != containerd.ConfigPathSet {
			t.Fatalf("edited %q action %s, want the import set", rep.EditedFile, rep.ConfigPathAction)
		}
		for _, c := range rep.Changes {
			if c.Path == "/etc/containerd/config.toml" && c.Changed() {
				t.Fatal("main file edited although the import's table wins")
			}
		}
	})

	t.Run("2.x import sets a list: the import is edited, main untouched", func(t *testing.T) {
		t.Parallel()
		root := bootstraptest.HostRoot(t, map[string]string{
			"/etc/containerd/config.toml":        "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/etc/containerd/certs.d'\n",
			"/etc/containerd/conf.d/99-eks.toml": "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/etc/containerd/certs.d:/etc/docker/certs.d'\n",
		})
		rep, err := planDockerIO(root, m, v24)
		if err != nil {
			t.Fatal(err)
		}
		if rep.EditedFile != "/etc/containerd/conf.d/99-eks.toml" || !rep.RestartRequired || rep.ConfigPath != "/etc/containerd/certs.d" || !rep.TransferService {
			t.Fatalf("report %+v", rep)
		}
		idx := slices.IndexFunc(rep.Changes, func(c bootstrap.Change) bool { return c.Path == "/etc/containerd/conf.d/99-eks.toml" })
		if idx < 0 || rep.Changes[idx].Backup != "/etc/containerd/conf.d/99-eks.toml.nodecache.bak" {
			t.Fatalf("changes %+v", rep.Changes)
		}
	})

	// newuser2 items 10 and 11: a config.toml gen creates, or finds without any setting (empty,
	// comments only: containerd runs on its defaults), gets the version the release loads
	// without migrating (version.ConfigVersion: 2 for 1.x, 3 for 2.0-2.2, 4 from 2.3; 2.4.2 warned
	// "Configuration migrated from version 3" at every start) and config_path in its table.
	for _, existing := range []struct {
		name string
		data []byte // nil: no file
	}{{"no config.toml", nil}, {"empty config.toml", []byte{}}, {"config.toml of comments", []byte("# site: defaults\n")}} {
		t.Run(existing.name+": written for the known version", func(t *testing.T) {
			t.Parallel()
			testConfigForVersion(t, m, existing.data)
		})
	}

	t.Run("version of the wrong type refused as such", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, []byte("version = \"2\"\n"))
		_, err := planDockerIO(root, m, v24)
		if want := containerd.DefaultConfig + ": `version` must be a whole number such as 2, got the text \"2\" (quoted): containerd would not start"; err == nil || err.Error() != want || !errors.Is(err, bootstrap.ErrRefused) {
			t.Fatalf("err %v\nwant refused: %s", err, want)
		}
	})

	t.Run("settings without version: the way out of each release", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, []byte("[plugins.cri]\n  sandbox_image = 'registry.k8s.io/pause:3.10'\n"))
		for _, tc := range []struct {
			v             containerd.Release
			want, wantNot string
		}{
			{v17, "containerd v1.7.35 reads it as the deprecated version 1: add `version = 2` as its first line", "config migrate"},
			{v24, "containerd v2.4.2 reads it as version 1 and migrates it at every start: convert it with `containerd config migrate > /etc/containerd/config.toml.new`", "cannot load"},
		} {
			_, err := planDockerIO(root, m, tc.v)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.wantNot) || !errors.Is(err, bootstrap.ErrRefused) {
				t.Errorf("%v: err %v\nwant refused, saying %q, not %q", tc.v, err, tc.want, tc.wantNot)
			}
		}
	})

	t.Run("k3s and Talos refused", func(t *testing.T) {
		t.Parallel()
		for _, host := range []struct {
			what  string
			files map[string]string
		}{
			{"k3s node", map[string]string{"/var/lib/rancher/k3s/agent/etc/containerd/config.toml": "version = 2\n"}},
			{"config.toml.tmpl", map[string]string{"/etc/containerd/config.toml": "version = 2\n", "/etc/containerd/config.toml.tmpl": "{{ template \"base\" . }}\n"}},
			{"Talos", map[string]string{"/etc/os-release": "NAME=Talos\nID=talos\n"}},
		} {
			if _, err := planDockerIO(bootstraptest.HostRoot(t, host.files), m, v24); err == nil {
				t.Fatalf("%s accepted", host.what)
			}
		}
	})
}

// planDockerIO plans gen containerd for mirror m and upstream docker.io, on containerd v, over
// the host root root.
func planDockerIO(root string, m name.Mirror, v containerd.Release) (*containerd.Report, error) {
	return containerd.Plan(os.DirFS(root), containerd.Options{Mirror: m, Upstreams: []string{"docker.io"}, Daemon: v})
}

// testConfigForVersion plans gen over a host whose config.toml holds existing (nil: none) for
// containerd 1.7, 2.2, 2.3 and 2.4 and checks the file written: the version that release loads
// natively, config_path in that schema's table as containerd's own loader reads it, the
// existing bytes kept in front.
func testConfigForVersion(t *testing.T, m name.Mirror, existing []byte) {
	root := t.TempDir()
	if existing != nil {
		bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, existing)
	}
	for _, tc := range []struct {
		v      containerd.Release
		schema int
	}{{v17, 2}, {containerd.Release{Major: 2, Minor: 2}, 3}, {containerd.Release{Major: 2, Minor: 3, Patch: 7}, 4}, {v24, srvversion.ConfigVersion}} {
		rep, err := planDockerIO(root, m, tc.v)
		if err != nil {
			t.Fatalf("%v: %v", tc.v, err)
		}
		if want := map[bool]containerd.ConfigPathAction{true: containerd.ConfigPathCreated, false: containerd.ConfigPathSet}[existing == nil]; rep.ConfigPathAction != want || !rep.RestartRequired {
			t.Fatalf("%v: action %s, want %s: %+v", tc.v, rep.ConfigPathAction, want, rep)
		}
		if rep.Schema != tc.schema {
			t.Fatalf("%v: config reported as schema %d, want %d (the version it is written with)", tc.v, rep.Schema, tc.schema)
		}
		dir := t.TempDir()
		for _, c := range rep.Changes {
			if c.Path == containerd.DefaultConfig {
				if existing != nil && (!bytes.HasPrefix(c.New, existing) || c.Backup == "") {
					t.Fatalf("%v: the existing bytes %q are not kept in front, or no backup: %+v", tc.v, existing, c)
				}
				bootstraptest.WriteHostFile(t, dir, "config.toml", c.New)
			}
		}
		var cfg srvconfig.Config
		if err := srvconfig.LoadConfig(t.Context(), filepath.Join(dir, "config.toml"), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Version != tc.schema {
			t.Fatalf("%v: file has version %d, want %d", tc.v, cfg.Version, tc.schema)
		}
		plugin := containerd.PluginImages
		if tc.v.Major < 2 {
			plugin = containerd.PluginCRIv1
		}
		var p criPlugin
		if _, err := cfg.Decode(t.Context(), plugin, &p); err != nil || p.Registry.ConfigPath != containerd.DefaultCertsDir {
			t.Fatalf("%v: config reads config_path %q (%v)", tc.v, p.Registry.ConfigPath, err)
		}
	}
}
