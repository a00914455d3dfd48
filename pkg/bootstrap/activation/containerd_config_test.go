package activation

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fixturesDir returns the shared real-config fixtures ($NODECACHE_FIXTURES, default
// ../shared/fixtures from the repository root). Outside CI a missing folder skips with the
// reason; with CI=true it fails.
func fixturesDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("NODECACHE_FIXTURES")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "..", "shared", "fixtures")
	}
	if _, err := os.Stat(dir); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("fixtures %s: %v (CI=true: fixtures are required)", dir, err)
		}
		t.Skipf("fixtures %s not found (%v): set NODECACHE_FIXTURES", dir, err)
	}
	return dir
}

// Real node configurations read the way each containerd generation reads them.
func TestReadContainerdConfigFixtures(t *testing.T) {
	t.Parallel()
	fx := fixturesDir(t)
	tests := []struct {
		file      string
		version   int
		v1Path    string
		v2Path    string
		localPull string // a reason expected in V2.LocalPull, "" for transfer mode
		grpc      string
		legacy    bool
	}{
		{file: "eks-al2023-nodeadm-v3.toml", version: 3, v2Path: "/etc/containerd/certs.d:/etc/docker/certs.d", localPull: "discard_unpacked_layers = true", grpc: "/run/foo/foo.sock"},
		{file: "eks-al2023-nodeadm-v2.toml", version: 2, v1Path: "/etc/containerd/certs.d:/etc/docker/certs.d", v2Path: "/etc/containerd/certs.d:/etc/docker/certs.d", grpc: "/run/foo/foo.sock"},
		{file: "aks-ubuntu-gb-nvidia-v2.toml", version: 2, v1Path: "/etc/containerd/certs.d", v2Path: "/etc/containerd/certs.d"},
		{file: "containerd-1.7-config-default-v2.toml", version: 2, grpc: "/run/containerd/containerd.sock"},
		{file: "microk8s-template-v2-legacy-mirrors.toml", version: 2, localPull: "registry.mirrors is set", legacy: true},
		{file: "talos-merged-parts-v2.toml", version: 2, v1Path: "/etc/cri/conf.d/hosts", v2Path: "/etc/cri/conf.d/hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			b, err := os.ReadFile(filepath.Join(fx, "containerd", "config", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(root, "etc", "containerd", "config.toml")
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := readContainerdConfig(root, "/etc/containerd/config.toml")
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if c.Version != tt.version || c.V1.ConfigPath != tt.v1Path || c.V2.ConfigPath != tt.v2Path {
				t.Fatalf("version %d v1 %q v2 %q; want %d %q %q", c.Version, c.V1.ConfigPath, c.V2.ConfigPath, tt.version, tt.v1Path, tt.v2Path)
			}
			if tt.localPull == "" && len(c.V2.LocalPull) > 0 || tt.localPull != "" && !slices.Contains(c.V2.LocalPull, tt.localPull) {
				t.Fatalf("local pull reasons %q, want %q", c.V2.LocalPull, tt.localPull)
			}
			if tt.grpc != "" && c.GRPCAddress != tt.grpc {
				t.Fatalf("grpc address %q, want %q", c.GRPCAddress, tt.grpc)
			}
			if (len(c.V1.Legacy) > 0) != tt.legacy {
				t.Fatalf("legacy %q, want %v", c.V1.Legacy, tt.legacy)
			}
		})
	}
}

// An imported registry table replaces the main file's (containerd merges plugin tables whole),
// globs are expanded in name order and relative imports resolve against the importing file.
func TestReadContainerdConfigImports(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(p, s string) {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("/etc/containerd/config.toml", `version = 3
imports = ["conf.d/*.toml", "/etc/containerd/extra.toml"]
[plugins."io.containerd.cri.v1.images"]
  max_concurrent_downloads = 5
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "/main"
`)
	write("/etc/containerd/conf.d/10-a.toml", "version = 3\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"/a\"\n")
	write("/etc/containerd/conf.d/20-b.toml", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/b\"\n")
	write("/etc/containerd/extra.toml", "version = 3\nimports = [\"/etc/containerd/config.toml\"]\n[grpc]\n  address = \"/run/x.sock\"\n")
	c, err := readContainerdConfig(root, "/etc/containerd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range c.Files {
		names = append(names, f.Path)
	}
	wantFiles := "/etc/containerd/config.toml /etc/containerd/conf.d/10-a.toml /etc/containerd/conf.d/20-b.toml /etc/containerd/extra.toml"
	if strings.Join(names, " ") != wantFiles {
		t.Fatalf("files %q, want %q", names, wantFiles)
	}
	// 20-b (schema 2, migrated by 2.x) is the last to define the images table; the whole table
	// replaces the main file's, so max_concurrent_downloads = 5 is gone with it.
	if c.V2.ConfigPath != "/b" || len(c.V2.LocalPull) != 0 || c.GRPCAddress != "/run/x.sock" {
		t.Fatalf("v2 %+v grpc %q", c.V2, c.GRPCAddress)
	}
	// containerd 1.7 reads only schema <= 2 tables.
	if c.V1.ConfigPath != "/b" {
		t.Fatalf("v1 %+v", c.V1)
	}
}
