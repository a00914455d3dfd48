package containerd_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/pelletier/go-toml/v2"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

var (
	v17 = containerd.Release{Major: 1, Minor: 7, Patch: 35}
	v24 = containerd.Release{Major: 2, Minor: 4, Patch: 2}
)

// criRegistry is the CRI registry table as containerd decodes it (internal/cri/config Registry,
// 1.7 pkg/cri/config Registry): the fields gen reads or must keep legal.
type criRegistry struct {
	ConfigPath string `toml:"config_path"`
	Mirrors    map[string]struct {
		Endpoints []string `toml:"endpoint"`
	} `toml:"mirrors"`
	Configs map[string]struct {
		Auth map[string]any `toml:"auth"`
		TLS  map[string]any `toml:"tls"`
	} `toml:"configs"`
	Headers map[string][]string `toml:"headers"`
}

type criPlugin struct {
	Registry criRegistry `toml:"registry"`
}

// outcome of one fixture under one containerd release.
type outcome struct {
	action   containerd.ConfigPathAction // when not refused
	hostsDir string
	edited   bool   // config file changes (restart_required)
	refused  string // substring of the refusal
	migrated []string
	// editedFile, when set, is the file the edit must land in (an import whose table wins).
	editedFile string
	// migratedHTTP: migrated registries (not upstreams) whose first host must be their plain-http
	// endpoint; migratedSkipVerify: whose first host must skip TLS verification.
	migratedHTTP, migratedSkipVerify []string
}

// fixtureCase is a third-party file from $NODECACHE_FIXTURES under one containerd release.
type fixtureCase struct {
	name    string
	fixture string
	daemon  containerd.Release
	migrate bool
	// extra host files: host path -> fixture
	extra map[string]string
	want  outcome
}

// planCase is one host tree under one containerd release, from the corpus or the fixtures.
type planCase struct {
	name    string
	host    func(t *testing.T) map[string][]byte // host path -> content; DefaultConfig among them
	daemon  containerd.Release
	migrate bool
	want    outcome
}

func (c fixtureCase) planCase() planCase {
	return planCase{name: c.name, daemon: c.daemon, migrate: c.migrate, want: c.want, host: func(t *testing.T) map[string][]byte {
		files := map[string][]byte{containerd.DefaultConfig: bootstraptest.Fixture(t, "containerd/config/"+c.fixture)}
		for p, fx := range c.extra {
			files[p] = bootstraptest.Fixture(t, "containerd/config/"+fx)
		}
		return files
	}}
}

var fixtureCases = []fixtureCase{
	{name: "aks-1.7", fixture: "aks-ubuntu-gb-nvidia-v2.toml", daemon: v17, want: outcome{action: containerd.ConfigPathAdopted, hostsDir: "/etc/containerd/certs.d"}},
	{name: "aks-2.4", fixture: "aks-ubuntu-gb-nvidia-v2.toml", daemon: v24, want: outcome{action: containerd.ConfigPathAdopted, hostsDir: "/etc/containerd/certs.d"}},
	{name: "default-1.7", fixture: "containerd-1.7-config-default-v2.toml", daemon: v17, want: outcome{action: containerd.ConfigPathSet, hostsDir: "/etc/containerd/certs.d", edited: true}},
	{name: "default-2.4", fixture: "containerd-1.7-config-default-v2.toml", daemon: v24, want: outcome{action: containerd.ConfigPathSet, hostsDir: "/etc/containerd/certs.d", edited: true}},
	{name: "eks-al2-2x-v3", fixture: "eks-al2-containerd2-v3.toml", daemon: v24, want: outcome{action: containerd.ConfigPathFirstOfList, hostsDir: "/etc/containerd/certs.d"}},
	{name: "eks-al2-v2-1.7", fixture: "eks-al2-v2.toml", daemon: v17, want: outcome{action: containerd.ConfigPathFirstOfList, hostsDir: "/etc/containerd/certs.d"}},
	{name: "eks-al2-v2-2.4", fixture: "eks-al2-v2.toml", daemon: v24, want: outcome{action: containerd.ConfigPathFirstOfList, hostsDir: "/etc/containerd/certs.d"}},
	{name: "al2023-v2-1.7", fixture: "eks-al2023-nodeadm-v2.toml", daemon: v17, want: outcome{action: containerd.ConfigPathFirstOfList, hostsDir: "/etc/containerd/certs.d"}},
	{name: "al2023-v2-2.4-transfer", fixture: "eks-al2023-nodeadm-v2.toml", daemon: v24, want: outcome{action: containerd.ConfigPathSet, hostsDir: "/etc/containerd/certs.d", edited: true}},
	{name: "al2023-v3", fixture: "eks-al2023-nodeadm-v3.toml", daemon: v24, want: outcome{action: containerd.ConfigPathFirstOfList, hostsDir: "/etc/containerd/certs.d"}},
	{name: "al2023-nvidia-v3", fixture: "eks-al2023-nvidia-v3.toml", daemon: v24, want: outcome{action: containerd.ConfigPathFirstOfList, hostsDir: "/etc/containerd/certs.d"}},
	{name: "kind-1.7", fixture: "kind-node-v2.toml", daemon: v17, want: outcome{action: containerd.ConfigPathSet, hostsDir: "/etc/containerd/certs.d", edited: true}},
	{name: "kind-2.4", fixture: "kind-node-v2.toml", daemon: v24, want: outcome{action: containerd.ConfigPathSet, hostsDir: "/etc/containerd/certs.d", edited: true}},
	{name: "microk8s-1.7-refused", fixture: "microk8s-template-v2-legacy-mirrors.toml", daemon: v17, want: outcome{refused: `"io.containerd.grpc.v1.cri".registry.mirrors`}},
	{name: "microk8s-2.4-refused", fixture: "microk8s-template-v2-legacy-mirrors.toml", daemon: v24, want: outcome{refused: "--migrate"}},
	{name: "microk8s-1.7-migrated", fixture: "microk8s-template-v2-legacy-mirrors.toml", daemon: v17, migrate: true, want: outcome{action: containerd.ConfigPathSet, hostsDir: "/etc/containerd/certs.d", edited: true, migrated: []string{"docker.io", "localhost:32000"}, migratedHTTP: []string{"localhost:32000"}}},
	{name: "microk8s-2.4-migrated", fixture: "microk8s-template-v2-legacy-mirrors.toml", daemon: v24, migrate: true, want: outcome{action: containerd.ConfigPathSet, hostsDir: "/etc/containerd/certs.d", edited: true, migrated: []string{"docker.io", "localhost:32000"}, migratedHTTP: []string{"localhost:32000"}}},
	{name: "nvidia-v1-refused", fixture: "nvidia-toolkit-testdata-v1.toml", daemon: v24, want: outcome{refused: "containerd config migrate"}},
	{name: "talos-main-import-missing", fixture: "talos-cri-containerd-v3.toml", daemon: v24, want: outcome{refused: "/etc/cri/conf.d/cri.toml: imported but missing"}},
	{name: "talos-main-with-import", fixture: "talos-cri-containerd-v3.toml", daemon: v24, extra: map[string]string{"/etc/cri/conf.d/cri.toml": "talos-merged-parts-v2.toml"}, want: outcome{action: containerd.ConfigPathAdopted, hostsDir: "/etc/cri/conf.d/hosts"}},
	{name: "talos-parts-1.7", fixture: "talos-merged-parts-v2.toml", daemon: v17, want: outcome{action: containerd.ConfigPathAdopted, hostsDir: "/etc/cri/conf.d/hosts"}},
	{name: "talos-parts-2.4", fixture: "talos-merged-parts-v2.toml", daemon: v24, want: outcome{action: containerd.ConfigPathAdopted, hostsDir: "/etc/cri/conf.d/hosts"}},
}

// TestEveryFixtureHasACase fails when a fixture is added without an expected outcome.
func TestEveryFixtureHasACase(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(bootstraptest.Fixtures(t), "containerd", "config")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) == 0 {
		t.Fatalf("no fixtures in %s", dir)
	}
	for _, e := range ents {
		if !slices.ContainsFunc(fixtureCases, func(c fixtureCase) bool { return c.fixture == e.Name() }) {
			t.Errorf("fixture %s has no case in fixtureCases", e.Name())
		}
	}
}

// TestPlanFixtures runs every third-party config in $NODECACHE_FIXTURES through Plan, the
// applier, containerd's loader and hosts parser, a second Plan and --remove. Without the folder
// it skips once, with one reason; TestPlanCorpus covers the same shapes on every clone.
func TestPlanFixtures(t *testing.T) {
	t.Parallel()
	bootstraptest.Fixtures(t)
	cases := make([]planCase, len(fixtureCases))
	for i, c := range fixtureCases {
		cases[i] = c.planCase()
	}
	runPlanCases(t, cases)
}

// runPlanCases plans each case's host tree, checks the outcome, applies it and checks the result
// with containerd's own config loader and hosts.toml parser, plans again (nothing to do), and
// removes (config.toml and backups restored, hosts.toml files gone).
func runPlanCases(t *testing.T, cases []planCase) {
	t.Helper()
	reg := mirrortest.NewRegistry(t)
	reg.PushImage(t, "library/alpine", "latest", mirrortest.Image(t, 512, 1, "linux/amd64"))
	m := bootstraptest.Mirror(t, reg.URL.String())
	upstreams := []string{"docker.io", "ghcr.io", "registry.k8s.io", "localhost:5001"}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			files := tc.host(t)
			for p, b := range files {
				bootstraptest.WriteHostFile(t, root, p, b)
			}
			original := files[containerd.DefaultConfig]
			opts := containerd.Options{Mirror: m, Upstreams: upstreams, Daemon: tc.daemon, Migrate: tc.migrate}
			rep, err := containerd.Plan(os.DirFS(root), opts)
			if tc.want.refused != "" {
				if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.want.refused) {
					t.Fatalf("want refusal containing %q, got %v", tc.want.refused, err)
				}
				if got := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig); !bytes.Equal(got, original) {
					t.Fatal("refused config was modified")
				}
				return
			}
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if rep.ConfigPathAction != tc.want.action || rep.HostsDir != tc.want.hostsDir || rep.RestartRequired != tc.want.edited {
				t.Fatalf("got action=%s hostsDir=%s restart=%v, want %s %s %v (warnings %v)", rep.ConfigPathAction, rep.HostsDir, rep.RestartRequired, tc.want.action, tc.want.hostsDir, tc.want.edited, rep.Warnings)
			}
			if !slices.Equal(rep.Migrated, tc.want.migrated) {
				t.Fatalf("migrated %v, want %v", rep.Migrated, tc.want.migrated)
			}
			bootstraptest.Apply(t, root, rep.Changes)
			edited := rep.EditedFile
			if tc.want.edited {
				if edited == "" {
					t.Fatal("restart required but no edited file named")
				}
				bak := bootstraptest.ReadHostFile(t, root, edited+bootstrap.BackupSuffix)
				if bak == nil {
					t.Fatalf("no backup of %s", edited)
				}
				assertMinimalEdit(t, bak, bootstraptest.ReadHostFile(t, root, edited), tc.migrate)
				if tc.want.editedFile != "" && edited != tc.want.editedFile {
					t.Fatalf("edited %s, want %s", edited, tc.want.editedFile)
				}
				for p, b := range files {
					if p != edited && !bytes.Equal(bootstraptest.ReadHostFile(t, root, p), b) {
						t.Fatalf("%s changed, but the edit belongs in %s", p, edited)
					}
				}
			} else if got := bootstraptest.ReadHostFile(t, root, containerd.DefaultConfig); !bytes.Equal(got, original) {
				t.Fatalf("config.toml changed although no restart is required")
			}

			// containerd's own loader over the result, imports included.
			checkWithContainerdLoader(t, root, files, tc.daemon, rep)

			// containerd's hosts.toml parser: mirror first, then the real registry.
			checkHosts(t, reg, root, rep.HostsDir, upstreams, m)
			// Migrated settings as containerd's hosts parser reads them back.
			hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: config.HostDirFromRoot(filepath.Join(root, rep.HostsDir))})
			for _, h := range tc.want.migratedHTTP {
				rh, err := hosts(h)
				if err != nil || len(rh) == 0 || rh[0].Host != h || rh[0].Scheme != "http" {
					t.Fatalf("migrated %s: first host %+v %v, want http://%s", h, rh, err, h)
				}
			}
			for _, h := range tc.want.migratedSkipVerify {
				rh, err := hosts(h)
				if err != nil || len(rh) == 0 || rh[0].Host != h {
					t.Fatalf("migrated %s: hosts %+v %v", h, rh, err)
				}
				tr, ok := rh[0].Client.Transport.(*http.Transport)
				if !ok || tr.TLSClientConfig == nil || !tr.TLSClientConfig.InsecureSkipVerify {
					t.Fatalf("migrated %s: first host does not skip TLS verification (%T)", h, rh[0].Client.Transport)
				}
			}

			// A second run plans nothing.
			again, err := containerd.Plan(os.DirFS(root), opts)
			if err != nil {
				t.Fatalf("second Plan: %v", err)
			}
			if bootstrap.AnyChanged(again.Changes) || again.RestartRequired {
				t.Fatalf("second run would change: %+v", again.Changes)
			}

			// --remove restores.
			rm, err := containerd.PlanRemove(os.DirFS(root), containerd.Options{Daemon: tc.daemon})
			if err != nil {
				t.Fatalf("PlanRemove: %v", err)
			}
			if rm.RestartRequired != tc.want.edited {
				t.Fatalf("remove restart_required = %v, want %v (%v)", rm.RestartRequired, tc.want.edited, rm.Warnings)
			}
			bootstraptest.Apply(t, root, rm.Changes)
			for p, b := range files {
				if got := bootstraptest.ReadHostFile(t, root, p); !bytes.Equal(got, b) {
					t.Fatalf("%s not restored", p)
				}
			}
			if edited != "" && bootstraptest.ReadHostFile(t, root, edited+bootstrap.BackupSuffix) != nil {
				t.Fatal("backup left after restore")
			}
			for _, n := range upstreams {
				if p := path.Join(rep.HostsDir, name.HostDir(n), "hosts.toml"); bootstraptest.ReadHostFile(t, root, p) != nil {
					t.Fatalf("%s left after remove", p)
				}
			}
		})
	}
}

// assertMinimalEdit checks that an edit only touched registry lines: every removed or added line
// mentions config_path or sits in a removed legacy table.
func assertMinimalEdit(t *testing.T, before, after []byte, migrate bool) {
	t.Helper()
	d, err := bootstrap.Diff([]bootstrap.Change{{Path: "/x", Action: bootstrap.ActionUpdate, Old: before, New: after}})
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(d, "\n") {
		if strings.HasPrefix(line, "+++") || strings.HasPrefix(line, "---") {
			continue
		}
		if !strings.HasPrefix(line, "+") && !strings.HasPrefix(line, "-") {
			continue
		}
		body := strings.TrimSpace(line[1:])
		switch {
		case body == "":
		case strings.Contains(body, "config_path"):
		case strings.HasPrefix(line, "+") && strings.HasSuffix(body, ".registry]"):
		case migrate && strings.HasPrefix(line, "-") && (strings.Contains(body, "mirrors") || strings.Contains(body, ".registry.configs.") || isLegacyKey(body)):
		default:
			t.Errorf("unexpected changed line %q in\n%s", line, d)
		}
	}
}

// isLegacyKey: a key line of a legacy mirrors/configs table that --migrate moves out.
func isLegacyKey(body string) bool {
	for _, k := range []string{"endpoint", "insecure_skip_verify", "ca_file", "cert_file", "key_file"} {
		if strings.HasPrefix(body, k+" ") || strings.HasPrefix(body, k+"=") {
			return true
		}
	}
	return false
}

// checkWithContainerdLoader loads the result with containerd's server config loader, decodes the
// CRI registry table the daemon reads, validates it like the CRI plugin, and reads config_path back.
func checkWithContainerdLoader(t *testing.T, root string, files map[string][]byte, daemon containerd.Release, rep *containerd.Report) {
	t.Helper()
	main := filepath.Join(root, containerd.DefaultConfig)
	// The fixtures import absolute host paths; point them under root for containerd's loader.
	data, err := os.ReadFile(main)
	if err != nil {
		t.Fatal(err)
	}
	for p := range files {
		if p == containerd.DefaultConfig {
			continue
		}
		data = bytes.ReplaceAll(data, []byte(`"`+p+`"`), []byte(`"`+filepath.Join(root, p)+`"`))
	}
	loadPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(loadPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg srvconfig.Config
	if err := srvconfig.LoadConfig(t.Context(), loadPath, &cfg); err != nil {
		t.Fatalf("containerd LoadConfig: %v", err)
	}
	var old, images criPlugin
	if _, err := cfg.Decode(t.Context(), containerd.PluginCRIv1, &old); err != nil {
		t.Fatalf("decode %s: %v", containerd.PluginCRIv1, err)
	}
	if _, err := cfg.Decode(t.Context(), containerd.PluginImages, &images); err != nil {
		t.Fatalf("decode %s: %v", containerd.PluginImages, err)
	}
	// 1.x reads the old plugin; 2.x migrates the old plugin's registry into the new one when
	// a schema-2 file has it, else reads the new one.
	got := old.Registry
	if daemon.Major >= 2 && (old.Registry.ConfigPath == "" && images.Registry.ConfigPath != "") {
		got = images.Registry
	}
	want := rep.HostsDir
	if rep.ConfigPathAction == containerd.ConfigPathFirstOfList {
		want = strings.Split(got.ConfigPath, ":")[0]
		if want != rep.HostsDir {
			t.Fatalf("config_path %q: first directory is not %s", got.ConfigPath, rep.HostsDir)
		}
	} else if got.ConfigPath != want {
		t.Fatalf("config_path read back by containerd's loader = %q, want %q", got.ConfigPath, want)
	}
	if len(got.Mirrors) > 0 {
		t.Fatalf("CRI would refuse: mirrors %v next to config_path", got.Mirrors)
	}
	if daemon.Major < 2 {
		for h, c := range got.Configs {
			if c.TLS != nil {
				t.Fatalf("containerd 1.7 would refuse: configs.%s.tls next to config_path", h)
			}
		}
	}
}

// checkHosts runs containerd's ConfigureHosts over the hosts directory: each upstream resolves
// to the mirror first, then the real registry; a real resolve through the mirror carries ?ns=.
func checkHosts(t *testing.T, reg *mirrortest.Registry, root, hostsDir string, upstreams []string, m name.Mirror) {
	t.Helper()
	hostOpts := config.HostOptions{HostDir: config.HostDirFromRoot(filepath.Join(root, hostsDir))}
	hosts := config.ConfigureHosts(t.Context(), hostOpts)
	for _, n := range upstreams {
		rh, err := hosts(n)
		if err != nil {
			t.Fatalf("ConfigureHosts(%s): %v", n, err)
		}
		if len(rh) != 2 {
			t.Fatalf("%s: %d hosts, want mirror + upstream: %+v", n, len(rh), rh)
		}
		if rh[0].Host != m.Host() || rh[0].Scheme != "http" || rh[0].Path != "/v2" {
			t.Fatalf("%s: first host %s://%s%s, want the mirror %s/v2", n, rh[0].Scheme, rh[0].Host, rh[0].Path, m)
		}
		if !rh[0].Capabilities.Has(docker.HostCapabilityPull) || !rh[0].Capabilities.Has(docker.HostCapabilityResolve) || rh[0].Capabilities.Has(docker.HostCapabilityPush) {
			t.Fatalf("%s: mirror capabilities %v, want pull+resolve", n, rh[0].Capabilities)
		}
		// dial_timeout read back (issue 25): containerd gives a [host] its own client only for
		// TLS settings, headers or a dial_timeout; the http mirror has none but the last.
		if rh[0].Client == nil || rh[0].Client == rh[1].Client {
			t.Fatalf("%s: the mirror shares the registry's HTTP client: containerd read no dial_timeout for it", n)
		}
		wantUp := strings.TrimPrefix(name.RegistryURL(n), "https://")
		if rh[1].Host != wantUp || rh[1].Scheme != "https" {
			t.Fatalf("%s: fallback %s://%s, want https://%s", n, rh[1].Scheme, rh[1].Host, wantUp)
		}
	}
	// A real resolve through the mirror, as containerd sends it: the request carries ?ns=.
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: hosts})
	for _, n := range []string{"docker.io", "ghcr.io"} {
		before := len(reg.Requests())
		ref := n + "/library/alpine:latest"
		if _, _, err := resolver.Resolve(t.Context(), ref); err != nil {
			t.Fatalf("resolve %s through the mirror: %v", ref, err)
		}
		var found bool
		for _, r := range reg.Requests()[before:] {
			if r.Path == "/v2/library/alpine/manifests/latest" && r.RawQuery == "ns="+n {
				found = true
			}
		}
		if !found {
			t.Fatalf("resolve %s: no manifest request with ?ns=%s at the mirror: %+v", ref, n, reg.Requests()[before:])
		}
	}
}

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
