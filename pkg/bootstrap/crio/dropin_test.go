package crio_test

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
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
