package crio_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
)

// fuzzUpstreams are the upstreams FuzzRegistriesDropIn mirrors, with the location the mirror
// serves each at: a name with a port gets its path alias.
var fuzzUpstreams = map[string]string{"docker.io": "10.0.0.5:5000/docker.io", "registry.local:5000": "10.0.0.5:5000/registry.local_5000"}

// FuzzRegistriesDropIn: the site's registries.conf (main) and one drop-in of its own (site:
// read before nodecache's 90-nodecache.conf, or after it when later), read by `gen crio`, are
// refused with a message or merged, never a panic, and planning writes nothing. When gen
// writes its drop-in, containers/image loads the whole configuration, and a pull of each
// upstream that no site table overrides or narrows (the report's Overrides and Longer) tries
// the mirror first, unless the site blocks it. `gen crio --remove` then leaves the site's files
// byte for byte as they were.
func FuzzRegistriesDropIn(f *testing.F) {
	for _, shape := range bootstraptest.CorpusShapes(f, "crio") {
		files := bootstraptest.Corpus(f, shape)
		var site []byte
		for p, data := range files {
			if strings.HasPrefix(p, crio.DefaultRegistriesDir+"/") {
				site = data
			}
		}
		f.Add(files[crio.MainRegistriesConf], site, false)
	}
	f.Add([]byte(""), []byte("[[registry]]\nprefix = \"docker.io\"\nlocation = \"docker.io\"\nblocked = true\n"), true)
	f.Add([]byte("[[registry]]\nlocation = \"docker.io/library\"\n"), []byte("[[registry]]\nprefix = \"*.io\"\nlocation = \"x.io\"\n"), false)
	f.Add([]byte("[[registry]]\nprefix = \"registry.local:5000\"\nlocation = \"elsewhere.example\"\n"), []byte(nil), false)
	f.Add([]byte("[registries.search]\nregistries = ['docker.io']\n"), []byte("[[registry]]\n"), false)
	f.Add([]byte("[[registry]]\nprefix = 5\n"), []byte("[[registry"), false)
	f.Fuzz(func(t *testing.T, main, site []byte, later bool) {
		m := bootstraptest.Mirror(t, "http://10.0.0.5:5000")
		opts := crio.Options{Mirror: m, Upstreams: []string{"docker.io", "registry.local:5000"}}
		siteFile := crio.DefaultRegistriesDir + "/10-site.conf"
		if later {
			siteFile = crio.DefaultRegistriesDir + "/99-site.conf"
		}
		root := t.TempDir()
		bootstraptest.WriteHostFile(t, root, crio.MainRegistriesConf, main)
		bootstraptest.WriteHostFile(t, root, siteFile, site)
		var rep *crio.Report
		if err := bootstraptest.ReadOnly(t, root, "Plan", func() (err error) {
			rep, err = crio.Plan(os.DirFS(root), opts)
			return err
		}); err != nil {
			return
		}
		bootstraptest.Apply(t, root, rep.Changes)
		sys := &types.SystemContext{
			SystemRegistriesConfPath:    filepath.Join(root, crio.MainRegistriesConf),
			SystemRegistriesConfDirPath: filepath.Join(root, crio.DefaultRegistriesDir),
		}
		defer sysregistriesv2.InvalidateCache()
		if _, err := sysregistriesv2.TryUpdatingCache(sys); err != nil {
			if !isV1(main) {
				t.Fatalf("containers/image refuses the configuration gen wrote: %v", err)
			}
		} else {
			for up, loc := range fuzzUpstreams {
				checkMirrorFirst(t, sys, rep, up, loc)
			}
		}
		rm, err := crio.PlanRemove(os.DirFS(root), opts)
		if err != nil {
			t.Fatalf("--remove: %v", err)
		}
		bootstraptest.Apply(t, root, rm.Changes)
		if got := bootstraptest.ReadHostFile(t, root, crio.MainRegistriesConf); !bytes.Equal(got, main) {
			t.Fatalf("after gen and --remove %s is\n%q\nwant\n%q", crio.MainRegistriesConf, got, main)
		}
		if got := bootstraptest.ReadHostFile(t, root, siteFile); !bytes.Equal(got, site) {
			t.Fatalf("after gen and --remove %s is\n%q\nwant\n%q", siteFile, got, site)
		}
	})
}

// isV1 reports whether a registries.conf is in the v1 format, which this containers/image
// refuses (gen warns about it and leaves it out of its check).
func isV1(main []byte) bool {
	var doc map[string]any
	if toml.Unmarshal(main, &doc) != nil {
		return false
	}
	_, v1 := doc["registries"]
	return v1
}

// checkMirrorFirst: a pull under upstream up tries the mirror location loc first, unless the
// report says a site table overrides or narrows the prefix, or the site blocks it.
func checkMirrorFirst(t *testing.T, sys *types.SystemContext, rep *crio.Report, up, loc string) {
	t.Helper()
	if slices.ContainsFunc(rep.Overrides, func(o crio.Override) bool { return o.Prefix == up }) ||
		slices.ContainsFunc(rep.Longer, func(o crio.Override) bool { return o.Of == up }) {
		return
	}
	ref := up + "/fuzz/probe:1"
	reg, err := sysregistriesv2.FindRegistry(sys, ref)
	if err != nil || reg == nil {
		t.Fatalf("containers/image finds no registry for %s (%v) after gen", ref, err)
	}
	if reg.Blocked {
		return
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := reg.PullSourcesFromReference(named)
	if err != nil || len(srcs) == 0 || srcs[0].Endpoint.Location != loc {
		t.Fatalf("a pull of %s tries %+v first (err %v), not the mirror %s", ref, srcs, err, loc)
	}
}
