package containerd_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// keySpellings are config files whose keys are spelt otherwise than containerd's field tags, with
// the registry config_path each containerd line decodes from them ("2.x", "1.x"; a line left out
// does not load the file). The daemons' answers are checked by TestKeySpellingLikeTheDaemon
// against the real binaries.
var keySpellings = []struct {
	name  string
	files map[string]string // host path -> content
	want  map[string]string
}{
	{"conFig_path (FuzzLoadEffective's input)", map[string]string{containerd.DefaultConfig: "version = 3\n[plugins.\"io.containerd.cri.v1.images\".registry]\nconFig_path = '/a'\n"},
		map[string]string{"2.x": "/a"}},
	{"VERSION, Registry, Config_Path", map[string]string{containerd.DefaultConfig: "VERSION = 3\n[plugins.\"io.containerd.cri.v1.images\".Registry]\nConfig_Path = '/b'\n"},
		map[string]string{"2.x": "/b"}},
	{"schema 2 Config_Path", map[string]string{containerd.DefaultConfig: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\nConfig_Path = '/c'\n"},
		map[string]string{"2.x": "/c", "1.x": ""}},
	{"schema 2 Registry is not migrated", map[string]string{containerd.DefaultConfig: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".Registry]\nconfig_path = '/d'\n"},
		map[string]string{"2.x": "", "1.x": ""}},
	{"Plugins", map[string]string{containerd.DefaultConfig: "version = 2\n[Plugins.\"io.containerd.grpc.v1.cri\".registry]\nconfig_path = '/e'\n"},
		map[string]string{"2.x": "/e", "1.x": ""}},
	{"CONFIG_PATH", map[string]string{containerd.DefaultConfig: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\nCONFIG_PATH = '/f'\n"},
		map[string]string{"2.x": "/f", "1.x": "/f"}},
	{"two spellings, the tag's wins", map[string]string{containerd.DefaultConfig: "version = 3\n[plugins.\"io.containerd.cri.v1.images\".registry]\nconfig_path = '/g'\nCONFIG_PATH = '/h'\n"},
		map[string]string{"2.x": "/g"}},
	{"IMPORTS", map[string]string{
		containerd.DefaultConfig:        "version = 2\nIMPORTS = ['conf.d/x.toml']\n",
		"/etc/containerd/conf.d/x.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\nconfig_path = '/i'\n",
	}, map[string]string{"2.x": "/i", "1.x": "/i"}},
	{"Imports", map[string]string{
		containerd.DefaultConfig:        "version = 2\nImports = ['conf.d/x.toml']\n",
		"/etc/containerd/conf.d/x.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\nconfig_path = '/j'\n",
	}, map[string]string{"2.x": "/j", "1.x": ""}},
}

// TestKeySpellingLikeTheDaemon (FuzzLoadEffective found it: a v3 file with `conFig_path = '/a'`,
// which containerd 2.x reads as config_path, was read as no config_path): LoadEffective takes a
// key spelt otherwise than containerd's field tag exactly when the daemon's TOML decoder does
// (go-toml v2 ignores case; go-toml v1 takes the upper-case form too), and the real containerd
// 2.4, 2.3 and 1.7 binaries (`config dump`, no daemon started) decode what keySpellings says.
func TestKeySpellingLikeTheDaemon(t *testing.T) {
	t.Parallel()
	for _, tc := range keySpellings {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := bootstraptest.HostRoot(t, tc.files)
			for line, want := range tc.want {
				d := v24
				if line == "1.x" {
					d = v17
				}
				eff, err := containerd.LoadEffective(root, containerd.DefaultConfig, containerd.LoadOptions{Daemon: d})
				if err != nil {
					t.Fatalf("%s rules: %v", line, err)
				}
				if eff.Registry.ConfigPath != want {
					t.Errorf("%s rules: config_path %q, the daemon decodes %q", line, eff.Registry.ConfigPath, want)
				}
			}
		})
	}
	for _, v := range runtimetest.Containerds() {
		t.Run("containerd-"+v.Name, func(t *testing.T) {
			t.Parallel()
			bin := runtimetest.Binary(t, v.Env)
			line, plugin := "2.x", containerd.PluginImages
			if strings.HasPrefix(v.Name, "1.") {
				line, plugin = "1.x", containerd.PluginCRIv1
			}
			for _, tc := range keySpellings {
				want, loads := tc.want[line]
				if !loads {
					continue
				}
				root := bootstraptest.HostRoot(t, tc.files)
				dump := exec.CommandContext(t.Context(), bin, "--config", filepath.Join(root, containerd.DefaultConfig), "config", "dump")
				var stdout, stderr bytes.Buffer
				dump.Stdout, dump.Stderr = &stdout, &stderr
				if err := dump.Run(); err != nil {
					t.Fatalf("%s: containerd %s config dump: %v\n%s", tc.name, v.Name, err, stderr.String())
				}
				var cfg struct {
					Plugins map[string]struct {
						Registry struct {
							ConfigPath string `toml:"config_path"`
						} `toml:"registry"`
					} `toml:"plugins"`
				}
				if err := toml.Unmarshal(stdout.Bytes(), &cfg); err != nil {
					t.Fatalf("%s: containerd %s config dump is not TOML: %v", tc.name, v.Name, err)
				}
				if got := cfg.Plugins[plugin].Registry.ConfigPath; got != want {
					t.Errorf("%s: containerd %s decodes config_path %q, keySpellings says %q", tc.name, v.Name, got, want)
				}
			}
		})
	}
}
