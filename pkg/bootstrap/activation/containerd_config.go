package activation

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// Reading a node's effective containerd configuration, the way the daemon reads it: the main
// file, then every import (relative paths against the importing file's directory, globs
// expanded, each file once), each file migrated to the daemon's schema on its own, plugin tables
// replaced whole by a later file (containerd's mergeConfig: "maps merged by keys, but values are
// replaced entirely"), so an imported registry table beats the main file's.
//
// TODO(gen): switch to pkg/bootstrap/containerd's exported reader once it lands; this minimal
// reader covers only what activation needs.

// Plugin table names (containerd plugins/types.go and the CRI plugins).
const (
	criV1Table     = "io.containerd.grpc.v1.cri"   // containerd 1.x, schema 2
	criImagesTable = "io.containerd.cri.v1.images" // containerd 2.x, schema 3 and 4
	grpcV4Table    = "io.containerd.server.v1.grpc"
)

// defaultV2ConfigPath is what containerd 2.x on Linux uses when config_path and mirrors are both
// empty (plugins/cri/images/plugin.go): a list, which the transfer service reads as ONE path.
const defaultV2ConfigPath = "/etc/containerd/certs.d:/etc/docker/certs.d"

// defaultContainerdConfig is containerd's default --config.
const defaultContainerdConfig = "/etc/containerd/config.toml"

// defaultContainerdSocket is containerd's default --address.
const defaultContainerdSocket = "/run/containerd/containerd.sock"

// configFile is one file of the effective configuration with its modification time.
type configFile struct {
	Path    string    `json:"path"`
	ModTime time.Time `json:"mtime"`
}

// imageSettings is the CRI image configuration as one containerd major version reads it.
type imageSettings struct {
	// ConfigPath is registry.config_path as written (empty when unset).
	ConfigPath string
	// Legacy lists the deprecated registry tables present (mirrors, configs, auths).
	Legacy []string
	// LocalPull lists why a containerd >= 2.1 pulls without the transfer service (empty: it
	// uses the transfer service). Source: containerd's CheckLocalImagePullConfigs.
	LocalPull []string
}

// containerdConfig is what activation needs of the effective configuration.
type containerdConfig struct {
	// Files are the main file and its imports in load order (host paths, without host root).
	Files []configFile
	// Version is the main file's schema version (missing = 1).
	Version int
	// GRPCAddress is the socket path set in the file ([grpc] address, or the v4 grpc plugin).
	GRPCAddress string
	// V1 is the image configuration as containerd 1.x reads it, V2 as containerd 2.x does.
	V1, V2 imageSettings
}

// Newest returns the latest modification time among the files.
func (c *containerdConfig) Newest() configFile {
	var n configFile
	for _, f := range c.Files {
		if f.ModTime.After(n.ModTime) {
			n = f
		}
	}
	return n
}

// readContainerdConfig reads the effective configuration whose main file is path (a host path,
// read under hostRoot). os.ErrNotExist (wrapped) when the main file is missing.
func readContainerdConfig(hostRoot, path string) (*containerdConfig, error) {
	out := &containerdConfig{}
	v1 := map[string]any{}
	v2 := map[string]any{}
	loaded := map[string]bool{}
	pending := []string{path}
	for len(pending) > 0 {
		p := pending[0]
		pending = pending[1:]
		if loaded[p] {
			continue
		}
		loaded[p] = true
		host := filepath.Join(hostRoot, p)
		st, err := os.Stat(host)
		if err != nil {
			return nil, fmt.Errorf("read containerd config %s: %w", p, err)
		}
		b, err := os.ReadFile(host)
		if err != nil {
			return nil, fmt.Errorf("read containerd config %s: %w", p, err)
		}
		var doc map[string]any
		if err := toml.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("parse containerd config %s: %w", p, err)
		}
		out.Files = append(out.Files, configFile{Path: p, ModTime: st.ModTime()})
		version := 1
		if v, ok := doc["version"].(int64); ok {
			version = int(v)
		}
		if p == path {
			out.Version = version
		}
		plugins, _ := doc["plugins"].(map[string]any)
		if version == 1 {
			plugins = v1Rename(plugins)
		}
		if g, ok := doc["grpc"].(map[string]any); ok {
			if a, ok := g["address"].(string); ok && a != "" {
				out.GRPCAddress = a
			}
		}
		if g, ok := plugins[grpcV4Table].(map[string]any); ok {
			if a, ok := g["address"].(string); ok && a != "" {
				out.GRPCAddress = a
			}
		}
		// 1.x view: tables as written (1.7 refuses schema 3, so only <= 2 files count).
		if version <= 2 {
			for k, v := range plugins {
				v1[k] = v
			}
		}
		// 2.x view: schema <= 2 files migrated to the images table first.
		migrated := map[string]any{}
		for k, v := range plugins {
			migrated[k] = v
		}
		if version <= 2 {
			if cri, ok := plugins[criV1Table].(map[string]any); ok {
				migrated[criImagesTable] = migrateCRIImages(cri, asMap(plugins[criImagesTable]))
			}
		}
		for k, v := range migrated {
			v2[k] = v
		}
		imports, err := resolveImports(hostRoot, p, doc["imports"])
		if err != nil {
			return nil, err
		}
		pending = append(pending, imports...)
	}
	out.V1 = imageSettingsFrom(asMap(v1[criV1Table]), false)
	out.V2 = imageSettingsFrom(asMap(v2[criImagesTable]), true)
	return out, nil
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// v1Rename maps schema-1 short plugin names to full ids (only the CRI plugin matters here).
func v1Rename(plugins map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range plugins {
		if k == "cri" {
			k = criV1Table
		}
		out[k] = v
	}
	return out
}

// migrateCRIImages copies the keys containerd 2.x's images plugin migration moves from the
// schema-2 CRI table (plugins/cri/images/plugin.go migrateConfig).
func migrateCRIImages(src, dst map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range dst {
		out[k] = v
	}
	for _, k := range []string{"registry", "image_decryption", "max_concurrent_downloads",
		"image_pull_progress_timeout", "image_pull_with_sync_fs", "stats_collect_period"} {
		if v, ok := src[k]; ok {
			out[k] = v
		}
	}
	if c, ok := src["containerd"].(map[string]any); ok {
		for _, k := range []string{"snapshotter", "disable_snapshot_annotations", "discard_unpacked_layers"} {
			if v, ok := c[k]; ok {
				out[k] = v
			}
		}
	}
	return out
}

func imageSettingsFrom(t map[string]any, v2 bool) imageSettings {
	var s imageSettings
	reg := asMap(t["registry"])
	s.ConfigPath, _ = reg["config_path"].(string)
	for _, k := range []string{"mirrors", "configs", "auths"} {
		if m := asMap(reg[k]); len(m) > 0 {
			s.Legacy = append(s.Legacy, k)
		}
	}
	if !v2 {
		return s
	}
	for _, k := range s.Legacy {
		s.LocalPull = append(s.LocalPull, "registry."+k+" is set")
	}
	if b, _ := t["use_local_image_pull"].(bool); b {
		s.LocalPull = append(s.LocalPull, "use_local_image_pull = true")
	}
	if n, ok := t["max_concurrent_downloads"].(int64); ok && n != 3 {
		s.LocalPull = append(s.LocalPull, fmt.Sprintf("max_concurrent_downloads = %d (not 3)", n))
	}
	if b, _ := t["image_pull_with_sync_fs"].(bool); b {
		s.LocalPull = append(s.LocalPull, "image_pull_with_sync_fs = true")
	}
	if b, _ := t["discard_unpacked_layers"].(bool); b {
		s.LocalPull = append(s.LocalPull, "discard_unpacked_layers = true")
	}
	if b, ok := t["disable_snapshot_annotations"].(bool); ok && !b {
		s.LocalPull = append(s.LocalPull, "disable_snapshot_annotations = false")
	}
	return s
}

// resolveImports resolves the imports of the file at parent the way containerd does: relative
// paths against the parent's directory, "*" patterns globbed (sorted), others kept even when
// missing (containerd then fails to start, and so does this reader).
func resolveImports(hostRoot, parent string, raw any) ([]string, error) {
	if raw == nil {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("containerd config %s: imports: want a list of paths", parent)
	}
	var out []string
	for i, v := range list {
		s, ok := v.(string)
		if !ok || s == "" {
			return nil, fmt.Errorf("containerd config %s: imports[%d]: want a non-empty path", parent, i)
		}
		s = filepath.Clean(s)
		if !filepath.IsAbs(s) {
			s = filepath.Join(filepath.Dir(parent), s)
		}
		if !strings.Contains(s, "*") {
			out = append(out, s)
			continue
		}
		matches, err := filepath.Glob(filepath.Join(hostRoot, s))
		if err != nil {
			return nil, fmt.Errorf("containerd config %s: imports[%d] %q: %w", parent, i, s, err)
		}
		sort.Strings(matches)
		for _, m := range matches {
			rel, err := filepath.Rel(hostRoot, m)
			if err != nil {
				return nil, err
			}
			out = append(out, filepath.Join("/", rel))
		}
	}
	return out, nil
}

// splitConfigPath splits a config_path the way local pull does (":"-separated list).
func splitConfigPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, ":") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

var errNoConfig = errors.New("no containerd config file")
