package crio_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

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
	skopeo := skopeoBinary(t)
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
