package runtimetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
)

// criImages is the part of the CRI images plugin config these tests read back.
type criImages struct {
	Snapshotter string `toml:"snapshotter"`
	Registry    struct {
		ConfigPath string `toml:"config_path"`
	} `toml:"registry"`
	UseLocalImagePull bool `toml:"use_local_image_pull"`
}

// TestContainerdConfigLoadsWithContainerdsLoader renders configs and reads them back with
// containerd 2.4's own loader: the schema, paths and the CRI table the daemon will see.
func TestContainerdConfigLoadsWithContainerdsLoader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		major          int
		cfg            ContainerdConfig
		wantVersion    int
		wantConfigPath string
		wantLocalPull  bool
	}{
		{name: "2.x default, no config_path", major: 2, wantVersion: 3},
		{name: "2.x config_path", major: 2, cfg: ContainerdConfig{ConfigPath: "/etc/containerd/certs.d"},
			wantVersion: 3, wantConfigPath: "/etc/containerd/certs.d"},
		{name: "2.x schema 4", major: 2, cfg: ContainerdConfig{Schema: 4, ConfigPath: "/a:/b"},
			wantVersion: 4, wantConfigPath: "/a:/b"},
		{name: "2.x Set merges into generated table", major: 2, cfg: ContainerdConfig{
			ConfigPath: "/x",
			Set: map[string]any{"plugins": map[string]any{
				tableCRIImages: map[string]any{"use_local_image_pull": true},
			}},
		}, wantVersion: 3, wantConfigPath: "/x", wantLocalPull: true},
		{name: "2.x AppendTOML adds a table", major: 2, cfg: ContainerdConfig{
			AppendTOML: "# appended\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/y'\n",
		}, wantVersion: 3, wantConfigPath: "/y"},
		{name: "1.x schema 2", major: 1, cfg: ContainerdConfig{ConfigPath: "/etc/containerd/certs.d"},
			wantVersion: 2, wantConfigPath: "/etc/containerd/certs.d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			sock := filepath.Join(dir, "c.sock")
			out, schema, err := containerdConfigTOML(tt.cfg, tt.major, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			if schema != tt.wantVersion {
				t.Errorf("schema = %d, want %d", schema, tt.wantVersion)
			}
			file := filepath.Join(dir, "config.toml")
			if err := os.WriteFile(file, out, 0o644); err != nil {
				t.Fatal(err)
			}
			var cfg srvconfig.Config
			if err := srvconfig.LoadConfig(t.Context(), file, &cfg); err != nil {
				t.Fatalf("containerd LoadConfig:\n%s\n%v", out, err)
			}
			if cfg.Version != tt.wantVersion {
				t.Errorf("version = %d, want %d", cfg.Version, tt.wantVersion)
			}
			// containerd 2.x migrates schema 2 and 3 to 4 at start, moving [grpc] into the
			// server plugins; the running daemon sees the result of that.
			migrated := cfg
			if tt.major >= 2 {
				if err := migrated.MigrateConfig(t.Context()); err != nil {
					t.Fatalf("migrate: %v", err)
				}
				var grpcSrv, ttrpcSrv struct {
					Address string `toml:"address"`
				}
				if _, err := migrated.Decode(t.Context(), tableGRPCServer, &grpcSrv); err != nil {
					t.Fatal(err)
				}
				if _, err := migrated.Decode(t.Context(), tableTTRPCServer, &ttrpcSrv); err != nil {
					t.Fatal(err)
				}
				if grpcSrv.Address != sock || ttrpcSrv.Address != sock+".ttrpc" {
					t.Errorf("after migration grpc, ttrpc = %q, %q; want %q, %q.ttrpc", grpcSrv.Address, ttrpcSrv.Address, sock, sock)
				}
			} else if addr := cfg.GRPC.Address; addr != sock { //nolint:staticcheck // SA1019: schema 2 (containerd 1.7) still has [grpc] address, which is what is checked here
				t.Errorf("grpc address = %q, want %q", addr, sock)
			}
			if cfg.Root != filepath.Join(dir, "root") || cfg.State != filepath.Join(dir, "state") {
				t.Errorf("root/state = %q %q, want under %s", cfg.Root, cfg.State, dir)
			}
			// Schema 2 is what containerd 1.7 reads; containerd 2.x would migrate it, so read
			// its table as written.
			id := tableCRIImages
			if tt.major < 2 {
				id = tableCRILegacy
			}
			var got criImages
			if tt.major < 2 {
				var legacy struct {
					Containerd struct {
						Snapshotter string `toml:"snapshotter"`
					} `toml:"containerd"`
					Registry struct {
						ConfigPath string `toml:"config_path"`
					} `toml:"registry"`
				}
				if _, err := cfg.Decode(t.Context(), id, &legacy); err != nil {
					t.Fatalf("decode %s: %v", id, err)
				}
				got.Snapshotter, got.Registry.ConfigPath = legacy.Containerd.Snapshotter, legacy.Registry.ConfigPath
			} else if _, err := cfg.Decode(t.Context(), id, &got); err != nil {
				t.Fatalf("decode %s: %v", id, err)
			}
			if got.Snapshotter != snapshotter {
				t.Errorf("snapshotter = %q, want %q", got.Snapshotter, snapshotter)
			}
			if got.Registry.ConfigPath != tt.wantConfigPath {
				t.Errorf("config_path = %q, want %q", got.Registry.ConfigPath, tt.wantConfigPath)
			}
			if got.UseLocalImagePull != tt.wantLocalPull {
				t.Errorf("use_local_image_pull = %v, want %v", got.UseLocalImagePull, tt.wantLocalPull)
			}
			if tt.major >= 2 {
				var transfer struct {
					UnpackConfig []struct {
						Platform    string `toml:"platform"`
						Snapshotter string `toml:"snapshotter"`
					} `toml:"unpack_config"`
				}
				if _, err := cfg.Decode(t.Context(), tableTransfer, &transfer); err != nil {
					t.Fatalf("decode %s: %v", tableTransfer, err)
				}
				if len(transfer.UnpackConfig) != 1 || transfer.UnpackConfig[0].Snapshotter != snapshotter ||
					!strings.HasPrefix(transfer.UnpackConfig[0].Platform, "linux/") {
					t.Errorf("unpack_config = %+v, want one linux/<arch> entry with %s", transfer.UnpackConfig, snapshotter)
				}
			}
		})
	}
}

func TestContainerdConfigRejectsBadAppendTOML(t *testing.T) {
	t.Parallel()
	// Redefining a table the generated document has is invalid TOML.
	_, _, err := containerdConfigTOML(ContainerdConfig{AppendTOML: "[grpc]\naddress = '/x'\n"}, 2, "/r", "/s", "/c.sock")
	if err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("err = %v, want a parse error", err)
	}
}

func TestHostsMapsToLoopback(t *testing.T) {
	t.Parallel()
	hosts := `# comment upstream.test
127.0.0.1 localhost
127.0.0.1 upstream.test registry.hub.test # trailing comment cdn.test
::1 v6.test
10.1.2.3 remote.test
127.0.0.1 both.test
10.1.2.3 both.test
notanip bad.test
`
	tests := []struct {
		name string
		want bool
	}{
		{"upstream.test", true},
		{"UPSTREAM.test", true},
		{"registry.hub.test", true},
		{"v6.test", true},
		{"cdn.test", false},    // only in a comment
		{"remote.test", false}, // not loopback
		{"both.test", false},   // one non-loopback address is enough to leave the machine
		{"bad.test", false},
		{"missing.test", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := hostsMapsToLoopback([]byte(hosts), tt.name); got != tt.want {
				t.Errorf("hostsMapsToLoopback(%q) = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}

func TestVersionParsing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		out, want string
		major     int
	}{
		{"containerd github.com/containerd/containerd/v2 2.4.2+unknown\n", "2.4.2+unknown", 2},
		{"containerd github.com/containerd/containerd v1.7.35 abcdef0\n", "1.7.35", 1},
		{"containerd containerd.io 1.7.28 05044ec0a9a75232cad458027ca83437aae3f4da\n", "1.7.28", 1},
	}
	for _, tt := range tests {
		m := versionRE.FindStringSubmatch(tt.out)
		if m == nil || m[1] != tt.want {
			t.Errorf("version of %q = %v, want %q", tt.out, m, tt.want)
			continue
		}
		if got, err := majorOf(m[1]); err != nil || got != tt.major {
			t.Errorf("majorOf(%q) = %d, %v; want %d", m[1], got, err, tt.major)
		}
	}
}
