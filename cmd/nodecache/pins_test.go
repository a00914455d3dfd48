package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// waitCache polls nc's inventory until ok accepts it (10 s at most).
func waitCache(t *testing.T, nc *nodecachetest.Nodecache, what string, ok func(mirrorapi.CacheInventory) bool) mirrorapi.CacheInventory {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		inv := nc.Mirror.Inventory()
		if ok(inv) {
			return inv
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(inv, "", "  ")
			t.Fatalf("waited 10s for %s; inventory:\n%s", what, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func cachedRepo(inv mirrorapi.CacheInventory, repo string) *mirrorapi.CachedImage {
	for i := range inv.Images {
		if inv.Images[i].Repository == repo {
			return &inv.Images[i]
		}
	}
	return nil
}

// TestWarmPinKeepsImage (issue 24, "Shown by"): nodecache warm --pin puts an image into a serve
// whose --max-size is just above what pins may hold with it (the image is 75% of the cap, pins
// may hold 80%); four other images pulled through it after that each evict the one before
// (least recently pulled), never the pinned image, and never the image just pulled (eviction
// stops at the pinned bytes plus the largest unpinned image, not at 90% of the cap); cache ls
// marks it pinned (text and JSON); cache rm of it exits 1 naming cache unpin; cache pin of one
// more image exits 1 naming the cap; the pinned image is served with the upstream stopped; cache
// unpin lets it go: the next pull evicts it. warm --pin against a registry that is not nodecache
// exits 1 saying so. Fails without pins: the pinned image, least recently pulled, is evicted by
// the second pull (and the CLI has no cache pin, unpin or warm --pin).
func TestWarmPinKeepsImage(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	pinned := mirrortest.Image(t, 512<<10, 2, "linux/amd64")
	up.PushImage(t, "team/pinned", "v1", pinned)
	for i := range 6 {
		up.PushImage(t, fmt.Sprintf("team/other%d", i), "v1", mirrortest.Image(t, 256<<10, 1, "linux/amd64"))
	}
	mirrortest.QuietLogrus()
	capBytes := mirrortest.StoredBytes(t, pinned) * 100 / 75
	nc := nodecachetest.Start(t, nodecachetest.Options{Upstream: up, Alias: "upstream.test", Root: t.TempDir(), MaxSize: capBytes, Run: true})
	waitCache(t, nc, "the index loaded", func(inv mirrorapi.CacheInventory) bool { return inv.Ready })

	code, out, errOut := runApp(t, "warm", "--pin", "--mirror", nc.URL, "--platform", "linux/amd64", "upstream.test/team/pinned:v1")
	if code != 0 || !strings.Contains(out, ", pinned\n") || !strings.Contains(out, "1 of 1 image warm (1 pinned)") {
		t.Fatalf("warm --pin: exit %d\n%s%s", code, out, errOut)
	}
	pinnedSpec := "upstream.test/team/pinned@" + digestString(t, pinned)
	for i := range 4 {
		repo := fmt.Sprintf("team/other%d", i)
		nc.Pull(t, "upstream.test/"+repo+":v1")
		inv := waitCache(t, nc, "eviction under the cap", func(inv mirrorapi.CacheInventory) bool { return inv.SizeBytes <= capBytes })
		if img := cachedRepo(inv, "team/pinned"); img == nil || !img.Pinned {
			t.Fatalf("after pulling %s the pinned image is %+v; want it cached and pinned (images %+v)", repo, img, inv.Images)
		}
		if cachedRepo(inv, repo) == nil {
			t.Fatalf("%s, just pulled, was evicted at once (images %+v): eviction went below the pinned bytes plus the largest unpinned image", repo, inv.Images)
		}
	}

	code, out, errOut = runApp(t, "cache", "ls", "--listen-url", nc.URL)
	if line := lineWith(out, pinnedSpec); code != 0 || !strings.HasSuffix(strings.TrimSpace(line), "pinned") || !strings.Contains(out, "; 1 pinned, ") {
		t.Errorf("cache ls: exit %d, want the line of %s ending in pinned and the pinned total:\n%s%s", code, pinnedSpec, out, errOut)
	}
	var inv mirrorapi.CacheInventory
	runAppJSON(t, &inv, "cache", "ls", "--listen-url", nc.URL, "--output", "json")
	if img := cachedRepo(inv, "team/pinned"); img == nil || !img.Pinned || inv.PinnedBytes != mirrortest.StoredBytes(t, pinned) || cachedRepo(inv, "team/other3").Pinned {
		t.Errorf("cache ls --output json: %+v; want team/pinned pinned, %d pinned bytes", inv, mirrortest.StoredBytes(t, pinned))
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"rm of the pinned image", []string{"cache", "rm", "--listen-url", nc.URL, pinnedSpec}, 1,
			[]string{"nodecache: " + pinnedSpec + " is pinned by upstream.test/team/pinned:v1: unpin it first (nodecache cache unpin upstream.test/team/pinned:v1)\n"}},
		{"pin over 80% of the cap", []string{"cache", "pin", "--listen-url", nc.URL, "upstream.test/team/other3:v1"}, 1,
			[]string{"nodecache: pin upstream.test/team/other3:v1: over the pinned share of the cap: pinning it would take the pinned bytes to ", "above 80% of the cap --max-size ", fmt.Sprintf(" (%d bytes): unpin other images first", capBytes)}},
		{"pin of what is not cached", []string{"cache", "pin", "--listen-url", nc.URL, "upstream.test/team/other5:v1"}, 1,
			[]string{"nodecache: not cached: upstream.test/team/other5:v1: the cache holds no manifest tagged v1; nothing is fetched for a pin: pull it through the cache first, or warm and pin it with nodecache warm --pin\n"}},
		{"pin spec without tag or digest", []string{"cache", "pin", "--listen-url", nc.URL, "upstream.test/team/pinned"}, 2, []string{"want UPSTREAM/REPOSITORY:TAG or UPSTREAM/REPOSITORY@DIGEST"}},
		{"pin of an upstream not configured", []string{"cache", "pin", "--listen-url", nc.URL, "team/pinned:v1"}, 2, []string{`upstream "team" is not configured here`}},
		{"unpin flag after the spec", []string{"cache", "unpin", "--listen-url", nc.URL, "upstream.test/team/pinned:v1", "--output", "json"}, 2, []string{`argument "--output" looks like a flag`}},
		{"unpin of what is not pinned", []string{"cache", "unpin", "--listen-url", nc.URL, "upstream.test/team/other3:v1"}, 1,
			[]string{"nodecache: not pinned: upstream.test/team/other3:v1: nothing is pinned by this tag\n"}},
		{"pin again", []string{"cache", "pin", "--listen-url", nc.URL, "upstream.test/team/pinned:v1"}, 0, []string{"pinned upstream.test/team/pinned:v1 (" + digestString(t, pinned) + "), "}},
	} {
		code, out, errOut := runApp(t, tc.args...)
		for _, says := range tc.says {
			if code != tc.code || !strings.Contains(out+errOut, says) {
				t.Errorf("%s: %v: exit %d, want %d saying %q:\n%s%s", tc.name, tc.args, code, tc.code, says, out, errOut)
			}
		}
	}

	up.Stop()
	nc.Pull(t, "upstream.test/team/pinned:v1")
	code, out, errOut = runApp(t, "cache", "unpin", "--listen-url", nc.URL, "upstream.test/team/pinned:v1")
	if code != 0 || !strings.HasPrefix(out, "unpinned upstream.test/team/pinned:v1 (") {
		t.Fatalf("cache unpin: exit %d\n%s%s", code, out, errOut)
	}
	up.Start(t)
	nc.Pull(t, "upstream.test/team/other4:v1")
	waitCache(t, nc, "the unpinned image evicted", func(inv mirrorapi.CacheInventory) bool {
		return cachedRepo(inv, "team/pinned") == nil && inv.PinnedBytes == 0 && cachedRepo(inv, "team/other4") != nil
	})

	// A mirror that is not nodecache keeps no pins.
	stock := mirrortest.NewRegistry(t)
	code, out, errOut = runApp(t, "warm", "--pin", "--mirror", stock.URL.String(), "--platform", "linux/amd64", "--wait", "0", "upstream.test/team/pinned:v1")
	if code != 1 || !strings.Contains(out, "it is not nodecache serve and keeps no pins: drop --pin, or point --mirror at nodecache serve") {
		t.Errorf("warm --pin against distribution's registry: exit %d, want 1 saying it is not nodecache serve:\n%s%s", code, out, errOut)
	}
}

// digestString is x's digest.
func digestString(t *testing.T, x interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	d, err := x.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// lineWith is the first line of s that holds sub ("" when none does).
func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// TestCachePins: cache pins lists every pin of a running serve — one by tag (the manifest it
// holds beside it) and one by digest — with the pinned total against the 80% of --max-size pins
// may hold; --output json is serve's pin list; an argument is refused (exit 2); with no pin left
// it says so (0 pins).
func TestCachePins(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	byTag, byDigest := mirrortest.Image(t, 4096, 1, "linux/amd64"), mirrortest.Image(t, 4096, 1, "linux/amd64")
	up.PushImage(t, "team/tagged", "v1", byTag)
	up.PushImage(t, "team/fixed", "v1", byDigest)
	nc := nodecachetest.Start(t, nodecachetest.Options{Upstream: up, Alias: "upstream.test", Root: t.TempDir(), MaxSize: 1 << 30, Run: true})
	nc.Pull(t, "upstream.test/team/tagged:v1", "upstream.test/team/fixed:v1")
	tagDigest, fixedDigest := mustDigestOf(t, byTag), mustDigestOf(t, byDigest)
	fixed := "upstream.test/team/fixed@" + fixedDigest
	for _, spec := range []string{"upstream.test/team/tagged:v1", fixed} {
		if code, out, errOut := runApp(t, "cache", "pin", "--listen-url", nc.URL, spec); code != 0 {
			t.Fatalf("cache pin %s: exit %d\n%s%s", spec, code, out, errOut)
		}
	}

	code, out, errOut := runApp(t, "cache", "pins", "--listen-url", nc.URL)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 4 || !strings.HasPrefix(lines[0], "PIN ") {
		t.Fatalf("cache pins: exit %d, want a header, 2 rows and the total:\n%s%s", code, out, errOut)
	}
	if f := strings.Fields(lines[1]); len(f) != 5 || f[0] != fixed || f[1] != "-" {
		t.Errorf("row of the pin by digest: %q, want %s with nothing beside it", lines[1], fixed)
	}
	if f := strings.Fields(lines[2]); len(f) != 5 || f[0] != "upstream.test/team/tagged:v1" || f[1] != tagDigest {
		t.Errorf("row of the pin by tag: %q, want upstream.test/team/tagged:v1 holding %s", lines[2], tagDigest)
	}
	if !strings.HasPrefix(lines[3], "2 pins holding ") || !strings.HasSuffix(lines[3], "; pins may hold at most 819.2 MiB, 80% of the cap 1.0 GiB") {
		t.Errorf("total line: %q", lines[3])
	}

	var list mirrorapi.PinList
	runAppJSON(t, &list, "cache", "pins", "--listen-url", nc.URL, "--output", "json")
	if len(list.Pins) != 2 || list.Pins[1].Tag != "v1" || list.Pins[1].Digest != tagDigest || list.Pins[0].Digest != fixedDigest || list.PinnedBytes == 0 || list.MaxSizeBytes != 1<<30 {
		t.Errorf("cache pins --output json: %+v", list)
	}

	if code, _, errOut := runApp(t, "cache", "pins", "--listen-url", nc.URL, "extra"); code != exitUsage || !strings.Contains(errOut, `cache pins takes no arguments, got "extra"`) {
		t.Errorf("cache pins with an argument: exit %d, %q; want 2", code, errOut)
	}
	for _, spec := range []string{"upstream.test/team/tagged:v1", fixed} {
		if code, out, errOut := runApp(t, "cache", "unpin", "--listen-url", nc.URL, spec); code != 0 {
			t.Fatalf("cache unpin %s: exit %d\n%s%s", spec, code, out, errOut)
		}
	}
	if code, out, _ := runApp(t, "cache", "pins", "--listen-url", nc.URL); code != 0 || out != "PIN  HOLDS  SIZE  PINNED\n0 pins holding 0 B; pins may hold at most 819.2 MiB, 80% of the cap 1.0 GiB\n" {
		t.Errorf("cache pins with none: exit %d\n%q", code, out)
	}
}

// mustDigestOf is img's manifest digest.
func mustDigestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
