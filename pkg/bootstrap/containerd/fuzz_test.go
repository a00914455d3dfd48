package containerd_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// fuzzImport is where FuzzLoadEffective writes its second file: the import path of the
// corpus's import-overrides-registry shape, so its seeds load as the corpus does.
const fuzzImport = "/etc/containerd/conf.d/50-registry.toml"

// fuzzDaemons are the releases a fuzz input's daemon byte picks from (zero: not given, the
// newest 2.x rules assumed).
var fuzzDaemons = []containerd.Release{{}, v17, {Major: 2, Minor: 0, Patch: 7}, {Major: 2, Minor: 1, Patch: 5}, v24}

// FuzzLoadEffective: a node's containerd config.toml (main) with one import file (imp, at
// fuzzImport; none when empty), read by LoadEffective under one of fuzzDaemons' rules, is
// refused with a message or read, never a panic, and reading changes nothing under the host
// root. What it reads is consistent (the main file first, each file once, the directories
// containerd searches derived from config_path), the same on a second read, and, for files
// containerd 2.x loads without migrating (version 3, relative imports), has the config_path
// containerd's own loader decodes.
func FuzzLoadEffective(f *testing.F) {
	for _, shape := range bootstraptest.CorpusShapes(f, "containerd") {
		files := bootstraptest.Corpus(f, shape)
		f.Add(files[containerd.DefaultConfig], files[fuzzImport], uint8(0))
		f.Add(files[containerd.DefaultConfig], files[fuzzImport], uint8(1))
	}
	reg := "[plugins.\"io.containerd.cri.v1.images\".registry]\n"
	f.Add([]byte("version = 3\nimports = ['conf.d/*.toml']\n"+reg+"config_path = '/a'\n"), []byte("version = 3\n"+reg+"config_path = ''\n"), uint8(4))
	f.Add([]byte("version = 3\nimports = ['conf.d/50-registry.toml', 'config.toml']\n"), []byte("version = 3\nimports = ['../config.toml', '[']\n"), uint8(4))
	f.Add([]byte("version = 2\nimports = [1]\n"), []byte(nil), uint8(2))
	f.Add([]byte("version = 'x'\n"), []byte(nil), uint8(3))
	f.Fuzz(func(t *testing.T, main, imp []byte, daemon uint8) {
		d := fuzzDaemons[int(daemon)%len(fuzzDaemons)]
		root := t.TempDir()
		bootstraptest.WriteHostFile(t, root, containerd.DefaultConfig, main)
		if len(imp) > 0 {
			bootstraptest.WriteHostFile(t, root, fuzzImport, imp)
		}
		var eff *containerd.Effective
		if err := bootstraptest.ReadOnly(t, root, "LoadEffective", func() (err error) {
			eff, err = containerd.LoadEffective(root, containerd.DefaultConfig, containerd.LoadOptions{Daemon: d})
			return err
		}); err != nil {
			return
		}
		checkEffective(t, eff, main)
		again, err := containerd.LoadEffective(root, containerd.DefaultConfig, containerd.LoadOptions{Daemon: d})
		if err != nil {
			t.Fatalf("second read fails: %v", err)
		}
		if a, b := effJSON(t, eff), effJSON(t, again); a != b {
			t.Fatalf("two reads differ:\n%s\n%s", a, b)
		}
		if d == v24 {
			compareWithContainerd(t, root, eff, main, imp)
		}
	})
}

func checkEffective(t *testing.T, eff *containerd.Effective, main []byte) {
	t.Helper()
	if !eff.Exists || len(eff.Files) == 0 || eff.Files[0].Path != containerd.DefaultConfig || !bytes.Equal(eff.Files[0].Data(), main) {
		t.Fatalf("main file not read first as written: exists %v, files %d", eff.Exists, len(eff.Files))
	}
	if eff.Schema != eff.Files[0].Schema {
		t.Fatalf("schema %d, main file's %d", eff.Schema, eff.Files[0].Schema)
	}
	var seen []string
	for _, f := range eff.Files {
		if slices.Contains(seen, f.Path) {
			t.Fatalf("%s read twice", f.Path)
		}
		seen = append(seen, f.Path)
	}
	switch {
	case eff.ConfigPath == "" && len(eff.HostDirs) != 0:
		t.Fatalf("no config_path, but host directories %q", eff.HostDirs)
	case eff.ConfigPath != "" && len(eff.HostDirs) == 0:
		t.Fatalf("config_path %q, but no host directory", eff.ConfigPath)
	case eff.TransferService && (len(eff.HostDirs) != 1 || eff.HostDirs[0] != eff.ConfigPath):
		t.Fatalf("transfer service reads config_path %q as one directory, got %q", eff.ConfigPath, eff.HostDirs)
	}
	if eff.ConfigPathFrom != "" {
		if _, ok := eff.FileByPath(eff.ConfigPathFrom); !ok {
			t.Fatalf("config_path from %s, which was not read", eff.ConfigPathFrom)
		}
	}
}

func effJSON(t *testing.T, eff *containerd.Effective) string {
	t.Helper()
	b, err := json.Marshal(eff)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// compareWithContainerd loads the same files with containerd 2.x's own server config loader when
// they are files it reads as LoadEffective does without a migration — every file `version = 3`,
// every import relative (containerd's loader reads an absolute one on this machine, not under
// the root) — and, when containerd loads and decodes them, its image plugin's config_path must
// be LoadEffective's.
func compareWithContainerd(t *testing.T, root string, eff *containerd.Effective, files ...[]byte) {
	t.Helper()
	for _, data := range files {
		if len(data) == 0 {
			continue
		}
		var doc map[string]any
		if toml.Unmarshal(data, &doc) != nil {
			return
		}
		if v, _ := doc["version"].(int64); v != 3 {
			return
		}
		imports, _ := doc["imports"].([]any)
		for _, i := range imports {
			if s, _ := i.(string); path.IsAbs(s) || strings.HasPrefix(s, "~") {
				return
			}
		}
	}
	var cfg srvconfig.Config
	if err := srvconfig.LoadConfig(t.Context(), filepath.Join(root, containerd.DefaultConfig), &cfg); err != nil {
		return
	}
	var images criPlugin
	if _, err := cfg.Decode(t.Context(), containerd.PluginImages, &images); err != nil {
		return
	}
	if images.Registry.ConfigPath != eff.Registry.ConfigPath {
		t.Fatalf("containerd's loader reads config_path %q, LoadEffective %q", images.Registry.ConfigPath, eff.Registry.ConfigPath)
	}
}

// fuzzHostsDir is the per-host directory of FuzzSiteHostsTOML's registry in both of
// containerd's spellings (containerd docs/hosts.md, "Port Handling in Registry Host").
var fuzzHostsDir = map[bool]string{true: "registry.local:5000", false: "registry.local_5000_"}

// FuzzSiteHostsTOML: a site's own hosts.toml for an upstream (data, in the host:port or the
// host_port_ directory) read by `gen containerd` is refused with a message or adopted: then
// containerd's own hosts parser tries the mirror first, a second gen changes nothing, and
// `gen containerd --remove` gives the site's file back byte for byte. Planning writes nothing;
// status's reader of adopted files (AdoptedMirror) finds the mirror gen added.
func FuzzSiteHostsTOML(f *testing.F) {
	f.Add([]byte(siteHostsTOML), true)
	f.Add([]byte(siteHostsTOML), false)
	f.Add([]byte("server = \"http://registry.local:5000\"\n[host.\"http://10.0.0.5:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"), true)
	f.Add([]byte("# just a comment\n"), true)
	f.Add([]byte("[host]\n"), false)
	f.Add([]byte("server = 5\n"), true)
	f.Add([]byte("[host.\"https://a\"]\nca = 1\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, colon bool) {
		m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
		opts := containerd.Options{Mirror: m, Daemon: v24, Upstreams: []string{"registry.local:5000"}}
		root := siteRoot(t)
		file := siteCerts + "/" + fuzzHostsDir[colon] + "/hosts.toml"
		bootstraptest.WriteHostFile(t, root, file, data)
		_, _ = containerd.AdoptedMirror(data)
		var rep *containerd.Report
		if err := bootstraptest.ReadOnly(t, root, "Plan", func() (err error) {
			rep, err = containerd.Plan(os.DirFS(root), opts)
			return err
		}); err != nil {
			return
		}
		bootstraptest.Apply(t, root, rep.Changes)
		written := bootstraptest.ReadHostFile(t, root, file)
		if len(data) > 0 {
			if u, ok := containerd.AdoptedMirror(written); !ok || u != m.String() {
				t.Fatalf("status reads the adopted file's mirror as %q, %v; want %s\n%s", u, ok, m, written)
			}
		}
		hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: config.HostDirFromRoot(filepath.Join(root, siteCerts))})
		list, err := hosts("registry.local:5000")
		if err != nil && !strings.Contains(err.Error(), "unable to read") && !strings.Contains(err.Error(), "X509 key pair") {
			t.Fatalf("containerd's parser refuses what gen wrote: %v\n%s", err, written)
		}
		if err == nil && (len(list) == 0 || list[0].Scheme+"://"+list[0].Host != m.String()) {
			t.Fatalf("containerd tries %+v first, not the mirror\n%s", list, written)
		}
		again, err := containerd.Plan(os.DirFS(root), opts)
		if err != nil {
			t.Fatalf("second gen: %v", err)
		}
		for _, c := range again.Changes {
			if c.Changed() {
				t.Fatalf("second gen changes %s:\n%s", c.Path, c.New)
			}
		}
		rm, err := containerd.PlanRemove(os.DirFS(root), opts)
		if err != nil {
			t.Fatalf("--remove: %v", err)
		}
		bootstraptest.Apply(t, root, rm.Changes)
		if got := bootstraptest.ReadHostFile(t, root, file); len(data) > 0 && !bytes.Equal(got, data) {
			t.Fatalf("after --remove the site's hosts.toml is\n%q\nwant\n%q", got, data)
		}
	})
}
