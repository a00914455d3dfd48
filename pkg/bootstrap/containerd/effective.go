package containerd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Effective is a node's containerd configuration as the daemon computes it at start: the main
// file merged with its imports in containerd's load order, each file migrated to the daemon's
// schema on its own first. Read it with LoadEffective (or Load for an fs.FS and options).
//
// Sources of the rules: containerd v2.4.2 cmd/containerd/server/config (LoadConfigWithPlugins,
// resolveImports, mergeConfig), plugins/cri/images/plugin.go (configMigration, default
// config_path), internal/cri/config (ValidateImageConfig, CheckLocalImagePullConfigs); containerd
// v1.7.35 services/server/config (mergeConfig replaces each plugin table whole) and
// pkg/cri/config (ValidatePluginConfig).
type Effective struct {
	// Path is the main config file (host path).
	Path string `json:"path"`
	// Exists is false when the main file is absent: containerd then runs on built-in defaults.
	Exists bool `json:"exists"`
	// Schema is the main file's `version`: 1 when the key is missing, 0 when there is no file.
	Schema int `json:"schema"`
	// Files are the main file and every import in load order (main first; each file once; a
	// glob expands in name order). Missing globs contribute nothing; a missing plain import
	// makes Load fail, as it makes containerd fail.
	Files []ConfigFile `json:"files"`
	// Daemon is the containerd release whose loader rules were applied.
	Daemon Release `json:"daemon_version"`
	// DaemonAssumed is true when the release was not given and was assumed (newest 2.x rules).
	DaemonAssumed bool `json:"daemon_assumed,omitempty"`
	// PluginID is the plugin whose registry table applies: PluginImages (2.x) or PluginCRIv1 (1.x).
	PluginID string `json:"plugin"`
	// Registry is the merged registry table of PluginID.
	Registry Registry `json:"registry"`
	// ConfigPathFrom is the file whose config_path value wins (empty when no file sets it).
	ConfigPathFrom string `json:"config_path_from,omitempty"`
	// PluginFrom is, for 1.x, the last file that has a PluginID table at all: containerd 1.x
	// replaces the whole plugin table with that file's, so only it counts. Empty for 2.x or when
	// no file has the table.
	PluginFrom string `json:"plugin_from,omitempty"`
	// ConfigPath is the config_path the CRI image service runs with: the merged value, or on 2.x
	// DefaultConfigPath2x when it and mirrors are both empty.
	ConfigPath string `json:"config_path"`
	// HostDirs are the directories the CRI pull searches for <host>/hosts.toml, in order. In
	// transfer-service mode the whole ConfigPath is ONE directory even when it holds ':' (so a
	// list matches nothing); otherwise it is split at ':'. Empty: no hosts.toml is read.
	HostDirs []string `json:"host_dirs"`
	// TransferService is true when CRI pulls go through the transfer service (containerd >= 2.1
	// and local pull not forced).
	TransferService bool `json:"transfer_service"`
	// LocalPull lists why a containerd >= 2.1 pulls locally (CheckLocalImagePullConfigs order);
	// empty when it uses the transfer service or on 1.x.
	LocalPull []string `json:"local_pull,omitempty"`
	// GRPCAddress is the socket the daemon serves (schema-4 grpc plugin, else [grpc] address,
	// else DefaultSocket).
	GRPCAddress string `json:"grpc_address"`
	// Problems are reasons the CRI plugin would fail to load with this configuration (a legacy
	// table next to config_path). Empty when it loads.
	Problems []string `json:"problems,omitempty"`
}

// ConfigFile is one file of the effective configuration.
type ConfigFile struct {
	// Path is the host path.
	Path string `json:"path"`
	// ModTime is the file's modification time (whole seconds on most filesystems).
	ModTime time.Time `json:"mtime"`
	// Schema is the file's `version` (1 when missing).
	Schema int `json:"schema"`
	// RegistryTable is the header path, in this file's own schema, of the table that feeds the
	// effective registry: e.g. ["plugins", "io.containerd.grpc.v1.cri", "registry"] in a schema-2
	// file read by containerd 2.x (which migrates it).
	RegistryTable []string `json:"registry_table"`
	// HasPlugin is true when the file has a table for the plugin that feeds the registry.
	HasPlugin bool `json:"has_plugin,omitempty"`
	// ConfigPath is this file's registry config_path and ConfigPathSet whether the key is there.
	ConfigPath    string `json:"config_path,omitempty"`
	ConfigPathSet bool   `json:"config_path_set,omitempty"`
	// Mirrors lists the hosts of this file's non-empty legacy registry.mirrors entries.
	Mirrors []string `json:"mirrors,omitempty"`
	// ConfigsTLS lists the hosts with a legacy registry.configs.<host>.tls table.
	ConfigsTLS []string `json:"configs_tls,omitempty"`

	data []byte
	tree map[string]any
}

// Data returns the file's bytes as read.
func (f ConfigFile) Data() []byte { return f.data }

// Registry is the merged CRI registry table.
type Registry struct {
	// ConfigPath is the merged config_path as written ("" when unset).
	ConfigPath string `json:"config_path"`
	// Mirrors maps each host of a non-empty legacy mirrors entry to its endpoints.
	Mirrors map[string][]string `json:"mirrors,omitempty"`
	// ConfigsTLS maps each host with a legacy configs.<host>.tls table to it (1.x honours it).
	ConfigsTLS map[string]TLSConfig `json:"configs_tls,omitempty"`
	// ConfigsAuth lists hosts with configs.<host>.auth (legal next to config_path; kept).
	ConfigsAuth []string `json:"configs_auth,omitempty"`
	// Auths counts legacy auths entries.
	Auths int `json:"auths,omitempty"`
}

// TLSConfig is a legacy registry.configs.<host>.tls table (containerd 1.x).
type TLSConfig struct {
	InsecureSkipVerify bool   `toml:"insecure_skip_verify" json:"insecure_skip_verify,omitempty"`
	CAFile             string `toml:"ca_file" json:"ca_file,omitempty"`
	CertFile           string `toml:"cert_file" json:"cert_file,omitempty"`
	KeyFile            string `toml:"key_file" json:"key_file,omitempty"`
}

// LoadOptions tune Load.
type LoadOptions struct {
	// Daemon is the containerd release whose rules apply (activation.RuntimeVersion: the daemon's version service or build information). Zero: assume the
	// newest 2.x rules and set Effective.DaemonAssumed.
	Daemon Release
}

// assumedDaemon is the release assumed when none is given: the containerd this module builds
// against.
var assumedDaemon = Release{Major: 2, Minor: 4, Patch: 2}

// LoadEffective reads the configuration at host path path (usually DefaultConfig) under the host
// root root ("/" or --host-root), with the newest containerd 2.x rules unless opts says which
// release runs. It fails when a file does not parse or a plain import is missing (containerd
// would not start either); a missing main file is not an error (Exists false).
func LoadEffective(root, path string, opts ...LoadOptions) (*Effective, error) {
	if root == "" {
		root = "/"
	}
	var o LoadOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	return Load(os.DirFS(root), path, o)
}

// Load is LoadEffective over any fs.FS rooted at the host root (names without leading slash).
// Symbolic links are followed as the host follows them (bootstrap.Resolving): an absolute link
// target is read under the host root. File paths stay as containerd names them (a relative
// import is relative to the directory of the importing path, link or not).
func Load(fsys fs.FS, mainPath string, opts LoadOptions) (*Effective, error) {
	fsys = bootstrap.Resolving(fsys)
	e := &Effective{Path: mainPath, Daemon: opts.Daemon}
	if e.Daemon.IsZero() {
		e.Daemon, e.DaemonAssumed = assumedDaemon, true
	}
	d := e.Daemon
	e.PluginID = d.PluginID()

	files, err := loadFiles(fsys, mainPath, d)
	if err != nil {
		return nil, err
	}
	if len(files) > 0 {
		e.Exists = true
		e.Schema = files[0].Schema
	}

	merged := map[string]any{}
	var grpcAddr string
	for i := range files {
		if a := e.mergeFile(&files[i], merged); a != "" {
			grpcAddr = a
		}
	}
	if !d.V2() && e.PluginFrom != "" && e.ConfigPathFrom != e.PluginFrom {
		e.ConfigPathFrom = ""
	}
	e.Files = files

	if a, ok := d.field(asMap(merged[pluginGRPC]), "address").(string); ok && a != "" {
		grpcAddr = a
	}
	e.GRPCAddress = grpcAddr
	if e.GRPCAddress == "" {
		e.GRPCAddress = DefaultSocket
	}
	e.setRegistry(merged)
	return e, nil
}

// mergeFile reads one file's plugins table (migrated to the daemon's schema) into f's registry
// fields and into merged, as the daemon merges files: 2.x merges them deeply, 1.x takes each
// plugin from the last file that has it. It returns the file's [grpc] address ("" when none).
func (e *Effective) mergeFile(f *ConfigFile, merged map[string]any) string {
	d := e.Daemon
	orig := asMap(d.field(f.tree, "plugins"))
	plugins := map[string]any{}
	deepMerge(plugins, orig) // a copy: migration must not touch the file's own tree
	if d.V2() {
		if f.Schema < 2 {
			plugins = v1Rename(plugins)
		}
		if f.Schema < d.ConfigVersion() {
			migrateCRI(plugins)
		}
	}
	pl, has := plugins[e.PluginID].(map[string]any)
	f.HasPlugin = has
	f.RegistryTable = []string{"plugins", fileRegistryKey(orig, f.Schema, d), "registry"}
	if has {
		reg := asMap(d.field(pl, "registry"))
		if v, ok := d.lookup(reg, "config_path"); ok {
			f.ConfigPathSet = true
			f.ConfigPath, _ = v.(string)
		}
		f.Mirrors = nonEmptyMirrors(reg, d)
		f.ConfigsTLS = configsWithTLS(reg, d)
	}
	if d.V2() {
		deepMerge(merged, plugins)
	} else {
		for k, v := range plugins {
			merged[k] = v
		}
		if has {
			e.PluginFrom = f.Path
		}
	}
	if f.ConfigPathSet && (d.V2() || e.PluginFrom == f.Path) {
		e.ConfigPathFrom = f.Path
	}
	if a, ok := d.field(asMap(d.field(f.tree, "grpc")), "address").(string); ok && a != "" {
		return a
	}
	return ""
}

// setRegistry sets the effective registry settings from the merged plugins: the registry
// table, config_path (2.x's default when nothing configures the registry), how CRI pulls, and the
// hosts.toml directories it reads.
func (e *Effective) setRegistry(merged map[string]any) {
	d := e.Daemon
	images := asMap(merged[e.PluginID])
	reg := asMap(d.field(images, "registry"))
	e.Registry = registryView(reg, d)
	e.ConfigPath = e.Registry.ConfigPath
	if d.V2() && e.ConfigPath == "" && len(e.Registry.Mirrors) == 0 {
		e.ConfigPath = DefaultConfigPath2x
	}
	if d.TransferService() {
		e.LocalPull = localPullReasons(images, reg, d)
		e.TransferService = len(e.LocalPull) == 0
	}
	switch {
	case e.ConfigPath == "":
	case e.TransferService:
		e.HostDirs = []string{e.ConfigPath}
	default:
		e.HostDirs = filepath.SplitList(e.ConfigPath)
	}
	e.Problems = validate(e.Registry, d)
}

// validate returns what makes the CRI plugin refuse the registry table (1.7 ValidatePluginConfig,
// 2.x ValidateImageConfig).
func validate(r Registry, d Release) []string {
	var out []string
	if r.ConfigPath == "" {
		return nil
	}
	if len(r.Mirrors) > 0 {
		out = append(out, "`mirrors` cannot be set when `config_path` is provided")
	}
	if !d.V2() && len(r.ConfigsTLS) > 0 {
		out = append(out, "`configs.tls` cannot be set when `config_path` is provided")
	}
	return out
}

// localPullReasons mirrors containerd's CheckLocalImagePullConfigs over the merged image plugin
// table, with DefaultImageConfig's defaults (disable_snapshot_annotations true,
// max_concurrent_downloads 3).
func localPullReasons(images, reg map[string]any, d Release) []string {
	if !d.V2() {
		return nil
	}
	var out []string
	if b, _ := d.field(images, "use_local_image_pull").(bool); b {
		return []string{"use_local_image_pull = true"}
	}
	if b, ok := d.field(images, "disable_snapshot_annotations").(bool); ok && !b {
		out = append(out, "disable_snapshot_annotations = false")
	}
	if b, _ := d.field(images, "discard_unpacked_layers").(bool); b {
		out = append(out, "discard_unpacked_layers = true")
	}
	if len(asMap(d.field(reg, "mirrors"))) > 0 {
		out = append(out, "registry.mirrors is not empty")
	}
	if len(asMap(d.field(reg, "configs"))) > 0 || len(asMap(d.field(reg, "auths"))) > 0 {
		out = append(out, "registry.configs or registry.auths is not empty")
	}
	if n, ok := d.field(images, "max_concurrent_downloads").(int64); ok && n != 3 {
		out = append(out, fmt.Sprintf("max_concurrent_downloads = %d (not 3)", n))
	}
	if b, _ := d.field(images, "image_pull_with_sync_fs").(bool); b {
		out = append(out, "image_pull_with_sync_fs = true")
	}
	return out
}

func registryView(reg map[string]any, d Release) Registry {
	var r Registry
	r.ConfigPath, _ = d.field(reg, "config_path").(string)
	for host, v := range asMap(d.field(reg, "mirrors")) {
		var eps []string
		if arr, ok := d.field(asMap(v), "endpoint").([]any); ok {
			for _, ep := range arr {
				if s, ok := ep.(string); ok {
					eps = append(eps, s)
				}
			}
		}
		if r.Mirrors == nil {
			r.Mirrors = map[string][]string{}
		}
		r.Mirrors[host] = eps
	}
	for host, v := range asMap(d.field(reg, "configs")) {
		c := asMap(v)
		if t, ok := d.field(c, "tls").(map[string]any); ok {
			var tls TLSConfig
			if b, err := toml.Marshal(t); err == nil {
				_ = toml.Unmarshal(b, &tls)
			}
			if r.ConfigsTLS == nil {
				r.ConfigsTLS = map[string]TLSConfig{}
			}
			r.ConfigsTLS[host] = tls
		}
		if _, ok := d.lookup(c, "auth"); ok {
			r.ConfigsAuth = append(r.ConfigsAuth, host)
		}
	}
	sort.Strings(r.ConfigsAuth)
	r.Auths = len(asMap(d.field(reg, "auths")))
	return r
}

func nonEmptyMirrors(reg map[string]any, d Release) []string {
	var out []string
	for host := range asMap(d.field(reg, "mirrors")) {
		out = append(out, host)
	}
	sort.Strings(out)
	return out
}

func configsWithTLS(reg map[string]any, d Release) []string {
	var out []string
	for host, v := range asMap(d.field(reg, "configs")) {
		if _, ok := d.lookup(asMap(v), "tls"); ok {
			out = append(out, host)
		}
	}
	sort.Strings(out)
	return out
}

// tomlKind names the kind of a decoded TOML value in words (for a key of the wrong type).
func tomlKind(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("the text %q (quoted)", v)
	case float64:
		return fmt.Sprintf("the fraction %v", v)
	case bool:
		return fmt.Sprintf("%v (a boolean)", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a table"
	}
	return "a date or time"
}

// loadFiles reads the main file and its imports in containerd's order: breadth first, each path
// once, imports relative to the importing file's directory, a path with '*' globbed. d decides
// how `version` and `imports` are spelt (Release.lookup).
func loadFiles(fsys fs.FS, mainPath string, d Release) ([]ConfigFile, error) {
	var (
		out     []ConfigFile
		loaded  = map[string]bool{}
		pending = []string{path.Clean("/" + filepath.ToSlash(mainPath))}
		first   = true
	)
	for len(pending) > 0 {
		p := pending[0]
		pending = pending[1:]
		if loaded[p] {
			continue
		}
		data, exists, err := bootstrap.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		if !exists {
			if first {
				return nil, nil
			}
			return nil, refusal.Errorf("%s: imported but missing: containerd would not start", p)
		}
		first = false
		f := ConfigFile{Path: p, data: data}
		if fi, err := fs.Stat(fsys, bootstrap.FSName(p)); err == nil {
			f.ModTime = fi.ModTime()
		}
		if err := toml.Unmarshal(data, &f.tree); err != nil {
			var de *toml.DecodeError
			if errors.As(err, &de) {
				row, col := de.Position()
				return nil, refusal.Errorf("%s does not parse as TOML at row %d column %d: %v: containerd would not start", p, row, col, err)
			}
			return nil, refusal.Errorf("%s does not parse as TOML: %v", p, err)
		}
		f.Schema = 1 // containerd reads a file without `version` as version 1 (0 counts as 1)
		switch v := d.field(f.tree, "version").(type) {
		case nil:
		case int64:
			f.Schema = int(v)
		default:
			return nil, refusal.Errorf("%s: `version` must be a whole number such as %d, got %s: containerd would not start", p, 2, tomlKind(v))
		}
		loaded[p] = true
		out = append(out, f)
		imports, err := resolveImports(fsys, p, d.field(f.tree, "imports"))
		if err != nil {
			return nil, err
		}
		pending = append(pending, imports...)
	}
	return out, nil
}

func resolveImports(fsys fs.FS, parent string, raw any) ([]string, error) {
	list, _ := raw.([]any)
	var out []string
	for _, v := range list {
		s, ok := v.(string)
		if !ok {
			return nil, refusal.Errorf("%s: imports must be strings, got %v", parent, v)
		}
		p := path.Clean(filepath.ToSlash(s))
		if !path.IsAbs(p) {
			p = path.Join(path.Dir(parent), p)
		}
		if !strings.Contains(p, "*") {
			out = append(out, p)
			continue
		}
		matches, err := fs.Glob(fsys, bootstrap.FSName(p))
		if err != nil {
			return nil, refusal.Errorf("%s: import pattern %q: %v", parent, s, err)
		}
		for _, m := range matches {
			out = append(out, "/"+m)
		}
	}
	return out, nil
}

// v1Rename gives dotless schema-1 plugin names their full URI (server/config v1Migrate).
func v1Rename(plugins map[string]any) map[string]any {
	core := map[string]string{
		"cri": PluginCRIv1, "cgroups": "io.containerd.monitor.v1.cgroups", "linux": "io.containerd.runtime.v1.linux",
		"scheduler": "io.containerd.gc.v1.scheduler", "bolt": "io.containerd.metadata.v1.bolt",
		"task": "io.containerd.runtime.v2.task", "opt": "io.containerd.internal.v1.opt",
		"restart": "io.containerd.internal.v1.restart", "tracing": "io.containerd.internal.v1.tracing",
		"otlp": "io.containerd.tracing.processor.v1.otlp", "aufs": "io.containerd.snapshotter.v1.aufs",
		"btrfs": "io.containerd.snapshotter.v1.btrfs", "devmapper": "io.containerd.snapshotter.v1.devmapper",
		"native": "io.containerd.snapshotter.v1.native", "overlayfs": "io.containerd.snapshotter.v1.overlayfs",
		"zfs": "io.containerd.snapshotter.v1.zfs",
	}
	out := make(map[string]any, len(plugins))
	for k, v := range plugins {
		switch {
		case strings.Contains(k, "."):
		case core[k] != "":
			k = core[k]
		case strings.HasSuffix(k, "-service"):
			k = "io.containerd.service.v1." + k
		default:
			k = "io.containerd.grpc.v1." + k
		}
		out[k] = v
	}
	return out
}

// migrateCRI applies the CRI image plugin's migration of a pre-schema-3 file
// (plugins/cri/images/plugin.go configMigration): keys of io.containerd.grpc.v1.cri move into
// io.containerd.cri.v1.images. plugins is modified in place.
func migrateCRI(plugins map[string]any) {
	src, ok := plugins[PluginCRIv1].(map[string]any)
	if !ok {
		return
	}
	dst, ok := plugins[PluginImages].(map[string]any)
	if !ok {
		dst = map[string]any{}
	}
	pinned, ok := dst["pinned_images"].(map[string]any)
	if !ok {
		pinned = map[string]any{}
	}
	if s, ok := src["sandbox_image"]; ok {
		pinned["sandbox"] = s
	}
	if len(pinned) > 0 {
		dst["pinned_images"] = pinned
	}
	for _, k := range []string{"registry", "image_decryption", "max_concurrent_downloads",
		"image_pull_progress_timeout", "image_pull_with_sync_fs", "stats_collect_period"} {
		if v, ok := src[k]; ok {
			dst[k] = v
		}
	}
	if c, ok := src["containerd"].(map[string]any); ok {
		for _, k := range []string{"snapshotter", "disable_snapshot_annotations", "discard_unpacked_layers"} {
			if v, ok := c[k]; ok {
				dst[k] = v
			}
		}
	}
	plugins[PluginImages] = dst
}

// deepMerge merges src into dst the way containerd 2.x's mergo call does for plugin tables:
// tables merge key by key, any other value (including "", false, 0 and arrays) replaces.
func deepMerge(dst, src map[string]any) {
	for k, sv := range src {
		sm, sIsMap := sv.(map[string]any)
		dm, dIsMap := dst[k].(map[string]any)
		if sIsMap && dIsMap {
			deepMerge(dm, sm)
			continue
		}
		if sIsMap {
			cp := map[string]any{}
			deepMerge(cp, sm)
			dst[k] = cp
			continue
		}
		dst[k] = sv
	}
}

// fileRegistryKey returns the plugins key, as written in a file of the given schema, of the table
// whose registry feeds the effective one: the old CRI plugin when the daemon is 1.x, or when a
// 2.x daemon migrates the file and it has an old registry table (the migration then replaces the
// new one), or for a schema <= 2 file without either; else the 2.x image plugin.
func fileRegistryKey(orig map[string]any, schema int, d Release) string {
	old := originalKey(orig, PluginCRIv1)
	if !d.V2() {
		return old
	}
	_, hasOld := asMap(orig[old])["registry"]
	_, hasNew := d.lookup(asMap(orig[PluginImages]), "registry")
	switch {
	case schema < d.ConfigVersion() && hasOld:
		return old
	case hasNew:
		return PluginImages
	case schema <= 2:
		return old
	}
	return PluginImages
}

// originalKey returns the key of plugins as written in the file for a full plugin ID (a schema-1
// file may say "cri").
func originalKey(plugins map[string]any, id string) string {
	if _, ok := plugins[id]; ok {
		return id
	}
	if id == PluginCRIv1 {
		if _, ok := plugins["cri"]; ok {
			return "cri"
		}
	}
	return id
}

// lookup returns the value of the key of a TOML table m that containerd d decodes into the struct
// field tagged tag (a key of the file, the plugins table, a plugin's configuration, the registry
// table), and whether there is one: the key as the tag spells it, or another spelling the
// daemon's TOML decoder takes for it. containerd 2.x decodes with go-toml v2, which takes any key
// whose strings.ToLower is the tag, so `conFig_path` is config_path; of several such keys the one
// sorting last wins, since containerd re-encodes a plugin's table with sorted keys before decoding
// it (server/config Config.Decode), and the tag itself sorts last among ASCII spellings. containerd
// 1.x decodes with go-toml v1, which tries the tag, its lower case, its upper case and its first
// letter lowered: of a lower-case tag only CONFIG_PATH. Observed with `containerd config dump` of
// 2.4.2, 2.3.7 and 1.7.35 (TestKeySpellingLikeTheDaemon). Map keys are not field names and match
// exactly: plugin IDs, registry hosts, and the keys containerd 2.x's CRI migration moves
// (plugins/cri/images configMigration reads its map by exact key).
func (d Release) lookup(m map[string]any, tag string) (any, bool) {
	if !d.V2() {
		if v, ok := m[tag]; ok {
			return v, true
		}
		v, ok := m[strings.ToUpper(tag)]
		return v, ok
	}
	key, found := "", false
	for k := range m {
		if strings.ToLower(k) == tag && (!found || k > key) {
			key, found = k, true
		}
	}
	if !found {
		return nil, false
	}
	return m[key], true
}

// field is lookup's value alone (nil when there is none).
func (d Release) field(m map[string]any, tag string) any {
	v, _ := d.lookup(m, tag)
	return v
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// FileByPath returns the loaded file with host path p.
func (e *Effective) FileByPath(p string) (ConfigFile, bool) {
	i := slices.IndexFunc(e.Files, func(f ConfigFile) bool { return f.Path == p })
	if i < 0 {
		return ConfigFile{}, false
	}
	return e.Files[i], true
}

// Newest returns the most recently modified file (activation: a 2.0–2.3 daemon must have started
// strictly after it).
func (e *Effective) Newest() ConfigFile {
	var n ConfigFile
	for _, f := range e.Files {
		if f.ModTime.After(n.ModTime) {
			n = f
		}
	}
	return n
}

// SingleDirectory reports whether the CRI pull reads hosts.toml from exactly one directory
// (what gen makes sure of), and returns it.
func (e *Effective) SingleDirectory() (string, bool) {
	if len(e.HostDirs) != 1 || strings.Contains(e.HostDirs[0], ":") {
		return "", false
	}
	return e.HostDirs[0], true
}
