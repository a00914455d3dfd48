package crio_test

import (
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

var upstreams = []string{"docker.io", "ghcr.io", "registry.k8s.io", "localhost:5001"}

// pullSources asks containers/image which endpoints a pull of ref tries, in order, with the main
// file and the drop-in directory under root.
func pullSources(t *testing.T, root, main, dropins, ref string) []sysregistriesv2.PullSource {
	t.Helper()
	sys := &types.SystemContext{
		SystemRegistriesConfPath:    filepath.Join(root, main),
		SystemRegistriesConfDirPath: filepath.Join(root, dropins),
	}
	if _, err := sysregistriesv2.TryUpdatingCache(sys); err != nil {
		t.Fatalf("containers/image loading %s + %s: %v", main, dropins, err)
	}
	return pullSourcesSys(t, sys, ref)
}

// dropInShape is one host tree for TestDropInWithEveryFixture / TestDropInWithEveryCorpusShape.
type dropInShape struct {
	name  string
	files map[string][]byte // host path -> content
	// v1: the main file is in the v1 format: reported, and containers/image will not merge it
	// with a v2 drop-in, so no pull is resolved.
	v1 bool
	// keeps checks that the shape's own settings survive next to the drop-in.
	keeps func(t *testing.T, sys *types.SystemContext)
}

// pullSourcesSys is pullSources for a prepared SystemContext.
func pullSourcesSys(t *testing.T, sys *types.SystemContext, ref string) []sysregistriesv2.PullSource {
	t.Helper()
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := sysregistriesv2.FindRegistry(sys, named.String())
	if err != nil || reg == nil {
		t.Fatalf("FindRegistry(%s): %v %v", ref, reg, err)
	}
	srcs, err := reg.PullSourcesFromReference(named)
	if err != nil {
		t.Fatal(err)
	}
	return srcs
}

// TestDropInWithEveryFixture runs every third-party registries.conf in $NODECACHE_FIXTURES through
// Plan, apply, containers/image, a second Plan and --remove. Without the folder it skips once,
// with one reason; TestDropInWithEveryCorpusShape covers the same on every clone.
func TestDropInWithEveryFixture(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(bootstraptest.Fixtures(t), "crio")
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) == 0 {
		t.Fatalf("no CRI-O fixtures in %s: %v", dir, err)
	}
	var shapes []dropInShape
	for _, e := range ents {
		sh := dropInShape{name: e.Name(), files: map[string][]byte{crio.MainRegistriesConf: bootstraptest.Fixture(t, "crio/"+e.Name())}}
		// The fixture's own settings survive the merge.
		switch e.Name() {
		case "sysregistriesv2-testdata-mirrors.conf":
			sh.keeps = func(t *testing.T, sys *types.SystemContext) {
				srcs := pullSourcesSys(t, sys, "registry.com/image:latest")
				if len(srcs) != 3 || srcs[0].Endpoint.Location != "mirror-1.registry.com" {
					t.Fatalf("fixture mirrors lost: %+v", srcs)
				}
			}
		case "crio-test-registries.conf":
			sh.keeps = func(t *testing.T, sys *types.SystemContext) {
				search, err := sysregistriesv2.UnqualifiedSearchRegistries(sys)
				if err != nil || !slices.Equal(search, []string{"quay.io", "registry.access.redhat.com", "docker.io"}) {
					t.Fatalf("unqualified-search-registries lost: %v %v", search, err)
				}
			}
		}
		shapes = append(shapes, sh)
	}
	runDropInShapes(t, shapes)
}

// TestDropInWithEveryCorpusShape: the repository's own CRI-O corpus (v1 and v2 files with
// mirrors, blocked and insecure registries) through the same checks as the fixtures.
func TestDropInWithEveryCorpusShape(t *testing.T) {
	t.Parallel()
	keeps := map[string]dropInShape{
		"crio/registries-v1": {v1: true},
		"crio/registries-v2-mirrors": {keeps: func(t *testing.T, sys *types.SystemContext) {
			srcs := pullSourcesSys(t, sys, "registry.example.com/team/app:1")
			var locs []string
			for _, s := range srcs {
				locs = append(locs, s.Endpoint.Location)
			}
			// The digest-only mirror is skipped for a tag.
			if !slices.Equal(locs, []string{"mirror-a.example.com", "registry.example.com"}) {
				t.Fatalf("site mirrors for a tag: %v", locs)
			}
			search, err := sysregistriesv2.UnqualifiedSearchRegistries(sys)
			if err != nil || !slices.Equal(search, []string{"registry.example.com", "docker.io"}) {
				t.Fatalf("unqualified-search-registries lost: %v %v", search, err)
			}
			if alias, _, err := sysregistriesv2.ResolveShortNameAlias(sys, "busybox"); err != nil || alias == nil || alias.String() != "docker.io/library/busybox" {
				t.Fatalf("short-name alias lost: %v %v", alias, err)
			}
		}},
		"crio/registries-v2-blocked": {keeps: func(t *testing.T, sys *types.SystemContext) {
			reg, err := sysregistriesv2.FindRegistry(sys, "untrusted.example/x/y:1")
			if err != nil || reg == nil || !reg.Blocked {
				t.Fatalf("untrusted.example no longer blocked: %+v %v", reg, err)
			}
		}},
		"crio/registries-v2-insecure": {keeps: func(t *testing.T, sys *types.SystemContext) {
			srcs := pullSourcesSys(t, sys, "registry.local:5000/team/app:1")
			if len(srcs) != 1 || srcs[0].Endpoint.Location != "registry.local:5000" || !srcs[0].Endpoint.Insecure {
				t.Fatalf("registry.local:5000 no longer insecure: %+v", srcs)
			}
		}},
	}
	var shapes []dropInShape
	for _, name := range bootstraptest.CorpusShapes(t, "crio") {
		sh, ok := keeps[name]
		if !ok {
			t.Errorf("corpus shape %s has no case in TestDropInWithEveryCorpusShape", name)
			continue
		}
		delete(keeps, name)
		sh.name, sh.files = name, bootstraptest.Corpus(t, name)
		shapes = append(shapes, sh)
	}
	for name := range keeps {
		t.Errorf("case %s is not in the corpus", name)
	}
	runDropInShapes(t, shapes)
}

func runDropInShapes(t *testing.T, shapes []dropInShape) {
	t.Helper()
	for _, mirrorURL := range []string{"http://10.0.0.5:5000", "https://cache.example:5443"} {
		for _, sh := range shapes {
			t.Run(sh.name+"/"+strings.SplitN(mirrorURL, ":", 2)[0], func(t *testing.T) {
				t.Parallel()
				root := t.TempDir()
				for p, b := range sh.files {
					bootstraptest.WriteHostFile(t, root, p, b)
				}
				m := bootstraptest.Mirror(t, mirrorURL)
				opts := crio.Options{Mirror: m, Upstreams: upstreams, Version: crio.Release{Major: 1, Minor: 31, Patch: 2}}
				rep, err := crio.Plan(os.DirFS(root), opts)
				if err != nil {
					t.Fatal(err)
				}
				if !rep.AutoReload || len(rep.Overrides) != 0 || len(rep.Merged) != 0 || len(rep.Longer) != 0 || rep.RestartRequired {
					t.Fatalf("report %+v", rep)
				}
				wantWarnings := 0
				if sh.v1 {
					wantWarnings = 1
					if !slices.Equal(rep.V1Main, []string{crio.MainRegistriesConf}) || !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "deprecated v1 format") }) {
						t.Fatalf("v1 main file not reported: %v %v", rep.V1Main, rep.Warnings)
					}
				} else if len(rep.V1Main) != 0 {
					t.Fatalf("v2 file reported as v1: %v", rep.V1Main)
				}
				if !slices.Equal(rep.Upstreams, upstreams) || len(rep.Warnings) != wantWarnings {
					t.Fatalf("every upstream, the one with a port included, must be mirrored without other warnings: %v %v", rep.Upstreams, rep.Warnings)
				}
				bootstraptest.Apply(t, root, rep.Changes)
				sys := &types.SystemContext{
					SystemRegistriesConfPath:    filepath.Join(root, crio.MainRegistriesConf),
					SystemRegistriesConfDirPath: filepath.Join(root, crio.DefaultRegistriesDir),
				}
				if sh.v1 {
					if _, err := sysregistriesv2.TryUpdatingCache(sys); err == nil {
						t.Fatal("containers/image merged a v1 main file with the v2 drop-in; the v1 warning would be moot")
					}
				} else {
					for _, n := range rep.Upstreams {
						ref := n + "/library/alpine:3"
						srcs := pullSources(t, root, crio.MainRegistriesConf, crio.DefaultRegistriesDir, ref)
						if len(srcs) != 2 {
							t.Fatalf("%s: %d pull sources, want mirror + upstream: %+v", ref, len(srcs), srcs)
						}
						first := srcs[0]
						// A name with a port is addressed by its port-free path alias (serve accepts it).
						prefix := n
						if a, ok := name.PathAlias(n); ok {
							prefix = a
						}
						if n == "localhost:5001" && prefix != "localhost_5001" {
							t.Fatalf("path alias of %s = %s", n, prefix)
						}
						if first.Endpoint.Location != m.Host()+"/"+prefix || first.Endpoint.Insecure != m.HTTP() || first.Endpoint.PullFromMirror != "all" {
							t.Fatalf("%s: first source %+v, want %s/%s insecure=%v", ref, first.Endpoint, m.Host(), prefix, m.HTTP())
						}
						if !strings.HasPrefix(first.Reference.String(), m.Host()+"/"+prefix+"/library/alpine") {
							t.Fatalf("%s: mirror reference %s", ref, first.Reference)
						}
						if srcs[1].Endpoint.Location != n {
							t.Fatalf("%s: fallback %+v, want %s", ref, srcs[1].Endpoint, n)
						}
					}
					if sh.keeps != nil {
						sh.keeps(t, sys)
					}
				}
				// A second run writes nothing; --remove takes the files out again.
				again, err := crio.Plan(os.DirFS(root), opts)
				if err != nil || again.Changed() {
					t.Fatalf("second run: %v %+v", err, again)
				}
				rm, err := crio.PlanRemove(os.DirFS(root), opts)
				if err != nil {
					t.Fatal(err)
				}
				bootstraptest.Apply(t, root, rm.Changes)
				for _, p := range []string{filepath.Join(crio.DefaultRegistriesDir, crio.DropInName), filepath.Join(crio.DefaultCrioDir, crio.DropInName)} {
					if bootstraptest.ReadHostFile(t, root, p) != nil {
						t.Fatalf("%s left after remove", p)
					}
				}
				for p, b := range sh.files {
					if got := bootstraptest.ReadHostFile(t, root, p); string(got) != string(b) {
						t.Fatalf("%s was modified", p)
					}
				}
			})
		}
	}
}

func TestLaterDropInOverrideIsReported(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bootstraptest.CorpusHost(t, root, "crio/registries-v2-mirrors")
	bootstraptest.WriteHostFile(t, root, crio.DefaultRegistriesDir+"/99-site.conf", []byte("[[registry]]\nprefix = \"ghcr.io\"\nlocation = \"ghcr.io\"\n"))
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	rep, err := crio.Plan(os.DirFS(root), crio.Options{Mirror: m, Upstreams: upstreams})
	if err != nil {
		t.Fatal(err)
	}
	want := []crio.Override{{Prefix: "ghcr.io", File: crio.DefaultRegistriesDir + "/99-site.conf"}}
	if !slices.Equal(rep.Overrides, want) {
		t.Fatalf("overrides %+v, want %+v", rep.Overrides, want)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	// containers/image agrees: ghcr.io has no mirror, docker.io does.
	if srcs := pullSources(t, root, crio.MainRegistriesConf, crio.DefaultRegistriesDir, "ghcr.io/a/b:1"); len(srcs) != 1 {
		t.Fatalf("ghcr.io still mirrored: %+v", srcs)
	}
	if srcs := pullSources(t, root, crio.MainRegistriesConf, crio.DefaultRegistriesDir, "docker.io/a/b:1"); len(srcs) != 2 {
		t.Fatalf("docker.io not mirrored: %+v", srcs)
	}
	if rep.AutoReload {
		t.Fatal("auto_reload drop-in written for an unknown CRI-O version")
	}
}

func TestVersionsAndSpecialFiles(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "https://cache.example:5443")
	cases := []struct {
		name       string
		files      map[string]string
		version    crio.Release
		ca         []byte
		wantPaths  []string
		wantV1     bool
		wantRefuse string
	}{
		{name: "crio-1.29-no-auto-reload", version: crio.Release{Major: 1, Minor: 29}, wantPaths: []string{"/etc/containers/registries.conf.d/90-nodecache.conf"}},
		{name: "crio-1.30-auto-reload", version: crio.Release{Major: 1, Minor: 30}, wantPaths: []string{"/etc/containers/registries.conf.d/90-nodecache.conf", "/etc/crio/crio.conf.d/90-nodecache.conf"}},
		{name: "root-user-conf", version: crio.Release{Major: 1, Minor: 29}, files: map[string]string{"/root/.config/containers/registries.conf": "unqualified-search-registries = []\n"},
			wantPaths: []string{"/etc/containers/registries.conf.d/90-nodecache.conf", "/root/.config/containers/registries.conf.d/90-nodecache.conf"}},
		{name: "v1-main", version: crio.Release{Major: 1, Minor: 29}, files: map[string]string{crio.MainRegistriesConf: "[registries.search]\nregistries = ['docker.io']\n"},
			wantPaths: []string{"/etc/containers/registries.conf.d/90-nodecache.conf"}, wantV1: true},
		{name: "not-ours", files: map[string]string{"/etc/containers/registries.conf.d/90-nodecache.conf": "[[registry]]\nlocation = \"x.io\"\n"}, wantRefuse: "not managed by nodecache"},
		{name: "ca-copy", version: crio.Release{Major: 1, Minor: 29}, ca: []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
			wantPaths: []string{"/etc/containers/registries.conf.d/90-nodecache.conf", "/etc/containers/certs.d/cache.example:5443/nodecache-mirror-ca.crt"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			for p, c := range tc.files {
				bootstraptest.WriteHostFile(t, root, p, []byte(c))
			}
			rep, err := crio.Plan(os.DirFS(root), crio.Options{Mirror: m, Upstreams: upstreams, Version: tc.version, MirrorCA: tc.ca})
			if tc.wantRefuse != "" {
				if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.wantRefuse) {
					t.Fatalf("want refusal %q, got %v", tc.wantRefuse, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range rep.Changes {
				if path.Base(c.Path) != bootstrap.DirMarker { // configure.TestCrioRemoveUndoesEverything
					got = append(got, c.Path)
				}
			}
			if !slices.Equal(got, tc.wantPaths) {
				t.Fatalf("paths %v, want %v", got, tc.wantPaths)
			}
			if (len(rep.V1Main) > 0) != tc.wantV1 {
				t.Fatalf("v1 main %v, want %v", rep.V1Main, tc.wantV1)
			}
		})
	}
}

// TestLinkedDropInDirectory: a registries.conf.d that is a symbolic link gets the drop-in in the
// directory it leads to (absolute targets under the host root), the link stays, and --remove
// finds it there.
func TestLinkedDropInDirectory(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	for _, target := range []string{"/srv/containers/registries.d", "../../srv/containers/registries.d"} {
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "srv/containers/registries.d"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, "etc/containers"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, "etc/containers/registries.conf.d")); err != nil {
			t.Fatal(err)
		}
		rep, err := crio.Plan(os.DirFS(root), crio.Options{Mirror: m, Upstreams: []string{"docker.io"}, Version: crio.Release{Major: 1, Minor: 29}})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Changes) != 1 || rep.Changes[0].Path != "/srv/containers/registries.d/90-nodecache.conf" || rep.Changes[0].Via != "/etc/containers/registries.conf.d/90-nodecache.conf" {
			t.Fatalf("%s: changes %+v", target, rep.Changes)
		}
		bootstraptest.Apply(t, root, rep.Changes)
		if got, err := os.Readlink(filepath.Join(root, "etc/containers/registries.conf.d")); err != nil || got != target {
			t.Fatalf("link changed: %q %v", got, err)
		}
		bootstraptest.WriteHostFile(t, root, crio.MainRegistriesConf, nil)
		srcs := pullSources(t, root, crio.MainRegistriesConf, "/srv/containers/registries.d", "docker.io/library/alpine:3")
		if len(srcs) != 2 || srcs[0].Endpoint.Location != "10.0.0.5:5000/docker.io" {
			t.Fatalf("%s: pull sources %+v", target, srcs)
		}
		rm, err := crio.PlanRemove(os.DirFS(root), crio.Options{})
		if err != nil || len(rm.Changes) != 1 || rm.Changes[0].Path != "/srv/containers/registries.d/90-nodecache.conf" {
			t.Fatalf("remove %+v %v", rm, err)
		}
	}
}

// TestSiteFilesCheckedTogether: the site's own [[registry]] for one of our prefixes (main file,
// earlier drop-in) is merged into ours (it was replaced whole before issue 11); a drop-in that is not TOML, or that containers/image
// refuses, stops gen (nothing written) and is reported by --remove.
func TestSiteFilesCheckedTogether(t *testing.T) {
	t.Parallel()
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	opts := crio.Options{Mirror: m, Upstreams: []string{"docker.io", "quay.io", "ghcr.io"}, Version: crio.Release{Major: 1, Minor: 29}}
	dir := crio.DefaultRegistriesDir

	t.Run("merged", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		bootstraptest.WriteHostFile(t, root, crio.MainRegistriesConf, []byte("unqualified-search-registries = ['docker.io']\n\n[[registry]]\nprefix = 'docker.io'\nlocation = 'docker.io'\n[[registry.mirror]]\nlocation = 'mirror.corp.example/dockerhub'\n"))
		bootstraptest.WriteHostFile(t, root, dir+"/50-corp.conf", []byte("[[registry]]\nlocation = 'quay.io'\nblocked = false\n"))
		rep, err := crio.Plan(os.DirFS(root), opts)
		if err != nil {
			t.Fatal(err)
		}
		want := []crio.Override{{Prefix: "docker.io", File: crio.MainRegistriesConf}, {Prefix: "quay.io", File: dir + "/50-corp.conf"}}
		if !slices.Equal(rep.Merged, want) {
			t.Fatalf("merged %+v, want %+v", rep.Merged, want)
		}
		if len(rep.Overrides) != 0 {
			t.Fatalf("overrides %+v", rep.Overrides)
		}
		// containers/image agrees: docker.io tries the mirror, then the corporate mirror.
		bootstraptest.Apply(t, root, rep.Changes)
		srcs := pullSources(t, root, crio.MainRegistriesConf, dir, "docker.io/library/alpine:3")
		if len(srcs) != 3 || srcs[0].Endpoint.Location != "10.0.0.5:5000/docker.io" || srcs[1].Endpoint.Location != "mirror.corp.example/dockerhub" {
			t.Fatalf("pull sources %+v", srcs)
		}
	})

	for _, tc := range []struct {
		name, file, want string
	}{
		{"not TOML", "10-broken.conf", dir + "/10-broken.conf: row 1"},
		{"refused by containers/image", "95-scheme.conf", "URI schemes are not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			content := "[[registry]]\nlocation = 'https://x.example'\n"
			if tc.name == "not TOML" {
				content = "[[registry]\nlocation = 'x.example'\n"
			}
			bootstraptest.WriteHostFile(t, root, dir+"/"+tc.file, []byte(content))
			_, err := crio.Plan(os.DirFS(root), opts)
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), os.TempDir()+"/nodecache-registries-") {
				t.Fatalf("Plan: %v, want a refusal naming %q", err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(root, dir, crio.DropInName)); !os.IsNotExist(err) {
				t.Fatalf("drop-in written although refused: %v", err)
			}
			if tc.name == "not TOML" {
				rm, err := crio.PlanRemove(os.DirFS(root), crio.Options{})
				if err != nil || !slices.ContainsFunc(rm.Warnings, func(s string) bool { return strings.Contains(s, dir+"/10-broken.conf") }) {
					t.Fatalf("--remove does not report the broken file: %v %v", rm.Warnings, err)
				}
			}
		})
	}
}

// findRegistry is containers/image's merged entry for ref with the host files under root.
func findRegistry(t *testing.T, root, ref string) *sysregistriesv2.Registry {
	t.Helper()
	sys := &types.SystemContext{
		SystemRegistriesConfPath:    filepath.Join(root, crio.MainRegistriesConf),
		SystemRegistriesConfDirPath: filepath.Join(root, crio.DefaultRegistriesDir),
	}
	if _, err := os.Stat(sys.SystemRegistriesConfPath); err != nil {
		sys.SystemRegistriesConfPath = os.DevNull
	}
	if _, err := sysregistriesv2.TryUpdatingCache(sys); err != nil {
		t.Fatalf("containers/image: %v", err)
	}
	reg, err := sysregistriesv2.FindRegistry(sys, ref)
	if err != nil || reg == nil {
		t.Fatalf("FindRegistry(%s): %v %v", ref, reg, err)
	}
	return reg
}

func locations(t *testing.T, reg *sysregistriesv2.Registry, ref string) []string {
	t.Helper()
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := reg.PullSourcesFromReference(named)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range srcs {
		out = append(out, s.Endpoint.Location)
	}
	return out
}

// TestSiteEntriesMerged: a site table for a prefix we manage keeps its blocked, insecure,
// mirror-by-digest-only and mirrors (after ours) in containers/image's merged view (issue 11).
func TestSiteEntriesMerged(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := crio.DefaultRegistriesDir
	bootstraptest.WriteHostFile(t, root, crio.MainRegistriesConf, []byte(`unqualified-search-registries = ["docker.io"]

[[registry]]
prefix = "docker.io"
location = "docker.io"
insecure = true
mirror-by-digest-only = true
[[registry.mirror]]
location = "mirror.corp.example/dockerhub"
insecure = true
`))
	bootstraptest.WriteHostFile(t, root, dir+"/10-site.conf", []byte("[[registry]]\nlocation = \"quay.io\"\nblocked = true\n"))
	fb, err := bootstrap.Fallbacks([]string{"registry.lan=http://registry.lan"})
	if err != nil {
		t.Fatal(err)
	}
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	rep, err := crio.Plan(os.DirFS(root), crio.Options{Mirror: m, Upstreams: []string{"docker.io", "quay.io", "registry.lan"}, Fallbacks: fb})
	if err != nil {
		t.Fatal(err)
	}
	if want := []crio.Override{{Prefix: "docker.io", File: crio.MainRegistriesConf}, {Prefix: "quay.io", File: dir + "/10-site.conf"}}; !slices.Equal(rep.Merged, want) {
		t.Fatalf("merged %+v, want %+v", rep.Merged, want)
	}
	bootstraptest.Apply(t, root, rep.Changes)

	docker := findRegistry(t, root, "docker.io/library/alpine")
	if !docker.Insecure || docker.Blocked {
		t.Fatalf("docker.io: insecure %v blocked %v; want the site's insecure kept", docker.Insecure, docker.Blocked)
	}
	if got := locations(t, docker, "docker.io/library/alpine:3"); !slices.Equal(got, []string{"10.0.0.5:5000/docker.io", "docker.io"}) {
		t.Fatalf("tag pull tries %v: want the mirror, then docker.io (the site's mirror is digest-only)", got)
	}
	digest := "docker.io/library/alpine@sha256:" + strings.Repeat("a", 64)
	if got := locations(t, docker, digest); !slices.Equal(got, []string{"10.0.0.5:5000/docker.io", "mirror.corp.example/dockerhub", "docker.io"}) {
		t.Fatalf("digest pull tries %v: want the mirror, the site's mirror, docker.io", got)
	}
	if quay := findRegistry(t, root, "quay.io/x/y"); !quay.Blocked {
		t.Fatal("quay.io: the site blocked it; after gen it is pullable")
	}
	if lan := findRegistry(t, root, "registry.lan/x/y"); !lan.Insecure || lan.Mirrors[0].Location != "10.0.0.5:5000/registry.lan" {
		t.Fatalf("registry.lan: %+v; want the mirror, then http (insecure) from --upstream registry.lan=http://registry.lan", lan)
	}
}

// planOverSiteFile plans gen crio (mirror http://10.0.0.5:5000; docker.io and ghcr.io) on a new
// host root that holds only the site's file, with content.
func planOverSiteFile(t *testing.T, file, content string) (string, *crio.Report, error) {
	t.Helper()
	root := t.TempDir()
	bootstraptest.WriteHostFile(t, root, file, []byte(content))
	m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
	rep, err := crio.Plan(os.DirFS(root), crio.Options{Mirror: m, Upstreams: []string{"docker.io", "ghcr.io"}})
	return root, rep, err
}

// TestSiteEntryOtherLocationRefused: a site table for our prefix whose location is another
// registry is refused, naming the file; nothing is written.
func TestSiteEntryOtherLocationRefused(t *testing.T) {
	t.Parallel()
	file := crio.DefaultRegistriesDir + "/20-redirect.conf"
	root, _, err := planOverSiteFile(t, file, "[[registry]]\nprefix = \"ghcr.io\"\nlocation = \"ghcr-copy.corp.example\"\n")
	if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "ghcr-copy.corp.example") {
		t.Fatalf("err %v: want a refusal naming %s", err, file)
	}
	if _, err := os.Stat(filepath.Join(root, crio.DefaultRegistriesDir, crio.DropInName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("drop-in written: %v", err)
	}
}

// TestSiteLongerPrefixReported: docker.io/library wins over our docker.io in containers/image
// whatever the file order: gen reports it, and containers/image shows why.
func TestSiteLongerPrefixReported(t *testing.T) {
	t.Parallel()
	file := crio.DefaultRegistriesDir + "/99-library.conf"
	root, rep, err := planOverSiteFile(t, file, "[[registry]]\nprefix = \"docker.io/library\"\nlocation = \"docker.io/library\"\n[[registry.mirror]]\nlocation = \"mirror.corp.example/library\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := []crio.Override{{Prefix: "docker.io/library", File: file, Of: "docker.io"}}; !slices.Equal(rep.Longer, want) {
		t.Fatalf("longer %+v, want %+v", rep.Longer, want)
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool {
		return strings.Contains(w, file) && strings.Contains(w, "longest matching prefix")
	}) {
		t.Fatalf("warnings %q", rep.Warnings)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	if reg := findRegistry(t, root, "docker.io/library/alpine"); reg.Prefix != "docker.io/library" || reg.Mirrors[0].Location == "10.0.0.5:5000/docker.io" {
		t.Fatalf("containers/image uses %+v for docker.io/library/alpine", reg)
	}
}

// TestSkopeoMergedSiteEntry: skopeo, given the drop-in gen merged from a site table, pulls through
// nodecache, then with nodecache down through the site's own (http) mirror, and still refuses
// the prefix the site blocked (issue 11).
func TestSkopeoMergedSiteEntry(t *testing.T) {
	t.Parallel()
	skopeo := runtimetest.Find(t, runtimetest.Skopeo)
	img := mirrortest.Image(t, 2048, 1, "linux/amd64")
	upstream := mirrortest.NewRegistry(t)
	upstream.PushImage(t, "library/alpine", "3", img)
	siteMirror := mirrortest.NewRegistry(t)
	siteMirror.PushImage(t, "sitecache/library/alpine", "3", img)

	nc := nodecachetest.Start(t, nodecachetest.Options{Upstream: upstream, Alias: "upstream.test"})
	mm := bootstraptest.Mirror(t, nc.URL)

	root := t.TempDir()
	bootstraptest.WriteHostFile(t, root, crio.MainRegistriesConf, []byte(`[[registry]]
prefix = "upstream.test"
location = "upstream.test"
insecure = true
[[registry.mirror]]
location = "`+siteMirror.URL.Host+`/sitecache"
insecure = true

[[registry]]
prefix = "blocked.test"
blocked = true
location = "blocked.test"
`))
	rep, err := crio.Plan(os.DirFS(root), crio.Options{Mirror: mm, Upstreams: []string{"upstream.test", "blocked.test"}})
	if err != nil {
		t.Fatal(err)
	}
	bootstraptest.Apply(t, root, rep.Changes)
	dropIn := filepath.Join(root, crio.DefaultRegistriesDir, crio.DropInName)
	cp := func(ref string) ([]byte, error) {
		cmd := exec.CommandContext(t.Context(), skopeo, "--insecure-policy", "--registries-conf", dropIn,
			"copy", "--override-os", "linux", "--override-arch", "amd64", "docker://"+ref, "dir:"+t.TempDir())
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		return cmd.CombinedOutput()
	}
	if out, err := cp("upstream.test/library/alpine:3"); err != nil {
		t.Fatalf("through nodecache: %v\n%s", err, out)
	}
	if upstream.Count("GET", "/v2/library/alpine/blobs/") == 0 || siteMirror.Count("GET", "/blobs/") != 0 {
		t.Fatalf("first pull: upstream blob GETs %d, site mirror %d; want the image through nodecache", upstream.Count("GET", "/v2/library/alpine/blobs/"), siteMirror.Count("GET", "/blobs/"))
	}
	nc.Close()
	if out, err := cp("upstream.test/library/alpine:3"); err != nil {
		t.Fatalf("nodecache down: %v\n%s", err, out)
	}
	if siteMirror.Count("GET", "/v2/sitecache/library/alpine/blobs/") == 0 {
		t.Fatal("nodecache down: the site's own mirror served nothing")
	}
	out, err := cp("blocked.test/library/alpine:3")
	if err == nil || !strings.Contains(string(out), "blocked") {
		t.Fatalf("blocked.test: %v\n%s\nwant refused as blocked", err, out)
	}
}
