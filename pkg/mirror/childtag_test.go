package mirror_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	invclient "github.com/nodecache/nodecache/pkg/inventory"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestChildTagPullKeepsIndex: a tag naming a child of a cached index (alpine:amd64 inside the
// 3.20 index) is listed on the index's row as a child tag, a pull through it counts as a pull of
// the index (its last_pulled moves past an image pulled in between), the index file keeps the
// tag, and eviction under a cap takes the image pulled before, not the index just used through
// its child.
func TestChildTagPullKeepsIndex(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	idx := mirrortest.MultiPlatformIndex(t, 128<<10, 1)
	up.PushIndex(t, "library/alpine", "3.20", idx)
	amd64, child := mirrortest.IndexChild(t, idx, 0) // MultiPlatformIndex puts linux/amd64 first
	up.PushImage(t, "library/alpine", "amd64", child)
	other := mirrortest.Image(t, mirrortest.MiB, 1, "linux/amd64")
	up.PushImage(t, "library/other", "v1", other)

	root := t.TempDir()
	ups := []name.Upstream{upstreamFor(t, "upstream.test", up)}
	h := newHarness(t, mirror.Options{Root: root, Upstreams: ups})
	h.run(t)
	pullIndexGGCR(t, ref(t, h.host+"/upstream.test/library/alpine:3.20"))
	pullImage(t, h.host+"/upstream.test/library/other:v1")
	before := waitInventory(t, h.host, "two images", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 2 })
	if before.Images[0].Repository != "library/other" {
		t.Fatalf("before the child-tag pull, %s is the most recent image; want library/other", before.Images[0].Repository)
	}
	pullImage(t, h.host+"/upstream.test/library/alpine:amd64")
	h.waitIdle(t)
	inv := inventory(t, h.host)
	check := func(when string, inv mirrorapi.CacheInventory) {
		t.Helper()
		if len(inv.Images) != 2 {
			t.Fatalf("%s: %d images, want 2 (the index and library/other): %+v", when, len(inv.Images), inv.Images)
		}
		got := inv.Images[0]
		if got.Repository != "library/alpine" || got.Digest != digestOf(t, idx) {
			t.Errorf("%s: most recently pulled = %s@%s, want library/alpine@%s (its child was pulled last)", when, got.Repository, got.Digest, digestOf(t, idx))
		}
		if strings.Join(got.Tags, ",") != "3.20" || len(got.ChildTags) != 1 || got.ChildTags["amd64"] != amd64.String() {
			t.Errorf("%s: index row tags %v, child tags %v; want [3.20] and amd64 → %s", when, got.Tags, got.ChildTags, amd64)
		}
		if !got.LastPulled.After(inv.Images[1].LastPulled) {
			t.Errorf("%s: index last_pulled %s, not after library/other's %s", when, got.LastPulled, inv.Images[1].LastPulled)
		}
	}
	check("after the pull through the child tag", inv)
	var text bytes.Buffer
	if err := (&invclient.Listing{CacheInventory: inv}).WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "@"+digestOf(t, idx)+"  3.20,amd64(child)  ") {
		t.Errorf("cache ls does not show amd64 as a child tag on the index's line:\n%s", text.String())
	}

	h.close(t)
	up.Stop()
	indexFile := filepath.Join(root, "nodecache", "index.json")
	clean, err := os.ReadFile(indexFile)
	if err != nil {
		t.Fatal(err)
	}
	// Reloaded from the index file, then rebuilt from storage (file gone): the child tag stays.
	for _, rebuild := range []bool{false, true} {
		if rebuild {
			if err := os.Remove(indexFile); err != nil {
				t.Fatal(err)
			}
		}
		h2 := newHarness(t, mirror.Options{Root: root, Upstreams: ups})
		h2.run(t)
		got := waitInventory(t, h2.host, "the index", func(inv mirrorapi.CacheInventory) bool { return inv.Ready })
		if rebuild {
			// Rebuilt without the file, last-pulled times are those of the revision links.
			if len(got.Images) != 2 || got.Images[0].ChildTags["amd64"] != amd64.String() && got.Images[1].ChildTags["amd64"] != amd64.String() {
				t.Errorf("rebuilt from storage: child tag amd64 lost: %+v", got.Images)
			}
		} else {
			check("reloaded from the index file", got)
		}
		h2.close(t)
	}

	// The first run's file back, then a start over a cap that one eviction meets: the least
	// recently pulled image is library/other, pulled before the child tag.
	if err := os.WriteFile(indexFile, clean, 0o600); err != nil {
		t.Fatal(err)
	}
	capBytes := inv.SizeBytes - 1
	h4 := newHarness(t, mirror.Options{Root: root, Upstreams: ups, MaxSize: capBytes})
	h4.run(t)
	got := waitInventory(t, h4.host, "eviction at start", func(inv mirrorapi.CacheInventory) bool {
		return inv.Ready && len(inv.Images) == 1 && inv.SizeBytes <= capBytes*9/10
	})
	if got.Images[0].Digest != digestOf(t, idx) {
		t.Errorf("kept %s@%s, want the index library/alpine@%s (pulled last, through amd64)", got.Images[0].Repository, got.Images[0].Digest, digestOf(t, idx))
	}
	for _, l := range mirrortest.LayerDigests(t, child) {
		if _, err := os.Stat(blobDataPath(root, l)); err != nil {
			t.Errorf("layer %s of the amd64 child is gone: %v", l, err)
		}
	}
}
