package mirror_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/warm"
)

// pinRequest sends method (PUT: pin, DELETE: unpin) for spec ("<upstream>/<repository>:<tag>"
// or "…@<digest>") to h's pins API; it returns the status and the pin or the error message.
func pinRequest(t *testing.T, h *harness, method, spec string) (int, mirrorapi.Pin, string) {
	t.Helper()
	resp, body := get(t, method, "http://"+h.host+mirrorapi.CachePinsPath+"/"+spec, nil)
	var p mirrorapi.Pin
	var e struct {
		Error string `json:"error"`
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("%s %s: answer is not a pin: %v: %s", method, spec, err, body)
		}
	} else {
		_ = json.Unmarshal(body, &e)
	}
	return resp.StatusCode, p, e.Error
}

// pinList GETs h's pins.
func pinList(t *testing.T, h *harness) mirrorapi.PinList {
	t.Helper()
	resp, body := get(t, http.MethodGet, "http://"+h.host+mirrorapi.CachePinsPath, nil)
	var l mirrorapi.PinList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &l) != nil {
		t.Fatalf("GET %s: %s: %s", mirrorapi.CachePinsPath, resp.Status, body)
	}
	return l
}

// warmPin warms refs through h with --pin (warm.Run, Options.Pin) for linux/amd64 and fails
// the test unless every image is warm and pinned.
func warmPin(t *testing.T, h *harness, refs ...string) *warm.Report {
	t.Helper()
	var images []warm.Reference
	for _, r := range refs {
		ref, err := warm.ParseReference(r)
		if err != nil {
			t.Fatal(err)
		}
		images = append(images, ref)
	}
	platform, _ := warm.ParsePlatform("linux/amd64")
	rep, err := warm.Run(t.Context(), warm.Options{Mirror: &url.URL{Scheme: "http", Host: h.host}, Images: images, Platform: platform, Pin: true})
	if err != nil || !rep.OK() {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("warm --pin %v: %v\n%s", refs, err, b)
	}
	return rep
}

// imageOf returns the inventory row of repo (nil when it is not cached).
func imageOf(inv mirrorapi.CacheInventory, repo string) *mirrorapi.CachedImage {
	return rowWhere(inv.Images, func(img mirrorapi.CachedImage) bool { return img.Repository == repo })
}

// imageByDigest returns the inventory row of the image d (nil when it is not cached).
func imageByDigest(inv mirrorapi.CacheInventory, d string) *mirrorapi.CachedImage {
	return rowWhere(inv.Images, func(img mirrorapi.CachedImage) bool { return img.Digest == d })
}

// rowWhere is the first of rows that match accepts (nil when none does).
func rowWhere[T any](rows []T, match func(T) bool) *T {
	if i := slices.IndexFunc(rows, match); i >= 0 {
		return &rows[i]
	}
	return nil
}

// TestPinsThroughDiskFull (issue 24): on an 8 MiB tmpfs with no cap, warm --pin puts a 3 MiB
// image in; four 1.5 MiB images pulled after it fill the disk, and the disk-full evictions that
// make room take the others, never the pinned image, which the least-recently-pulled order
// would take first: it is served whole with the upstream stopped. Unpinned, a 5 MiB image
// that needs its room takes it (reason enospc). Fails without pins: the first disk-full eviction
// takes the pinned image.
func TestPinsThroughDiskFull(t *testing.T) {
	t.Parallel()
	root := tmpfsRoot(t, "8m")
	up := mirrortest.NewRegistry(t)
	pinned := mirrortest.Image(t, 1536<<10, 2, "linux/amd64")
	up.PushImage(t, "team/pinned", "v1", pinned)
	for i := range 4 {
		up.PushImage(t, fmt.Sprintf("team/other%d", i), "v1", mirrortest.Image(t, 1536<<10, 1, "linux/amd64"))
	}
	up.PushImage(t, "team/big", "v1", mirrortest.Image(t, 5<<20, 1, "linux/amd64"))
	h := newHarness(t, mirror.Options{Root: root, Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.runReady(t)
	warmPin(t, h, "upstream.test/team/pinned:v1")
	h.waitIdle(t)

	// Each image is pulled twice: a blob that found the disk full is served but not stored, and
	// stored when asked again once eviction made room.
	for i := range 4 {
		for range 2 {
			pullImage(t, fmt.Sprintf("%s/upstream.test/team/other%d:v1", h.host, i))
			h.waitIdle(t)
		}
	}
	inv := waitInventory(t, h.host, "a disk-full eviction", func(mirrorapi.CacheInventory) bool {
		return metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`) >= 1
	})
	if img := imageOf(inv, "team/pinned"); img == nil || !img.Pinned {
		t.Fatalf("after the disk-full evictions the pinned image is %+v, want it cached and marked pinned; images %+v", img, inv.Images)
	}
	if got, want := metricValue(t, h, "nodecache_cache_pinned_bytes"), float64(mirrortest.StoredBytes(t, pinned)); got != want {
		t.Errorf("nodecache_cache_pinned_bytes = %v, want %v (the pinned image)", got, want)
	}
	up.Stop()
	pullImage(t, h.host+"/upstream.test/team/pinned:v1")

	up.Start(t)
	if code, _, msg := pinRequest(t, h, http.MethodDelete, "upstream.test/team/pinned:v1"); code != http.StatusOK {
		t.Fatalf("unpin: %d %s", code, msg)
	}
	before := metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`)
	for range 2 {
		pullImage(t, h.host+"/upstream.test/team/big:v1")
		h.waitIdle(t)
	}
	waitInventory(t, h.host, "the unpinned image evicted for the 5 MiB one", func(inv mirrorapi.CacheInventory) bool {
		return imageOf(inv, "team/pinned") == nil
	})
	if metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`) <= before || metricValue(t, h, "nodecache_cache_pinned_bytes") != 0 {
		t.Errorf("after unpin: enospc evictions %v (were %v), pinned bytes %v; want more evictions, 0 pinned",
			metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`), before, metricValue(t, h, "nodecache_cache_pinned_bytes"))
	}
}

// twoImages starts an upstream that holds team/a:v1 and team/b:v1, linux/amd64 images of one
// layer of layerBytes bytes each, and returns it with the two images.
func twoImages(t *testing.T, layerBytes int64) (up *mirrortest.Registry, a, b v1.Image) {
	t.Helper()
	up = mirrortest.NewRegistry(t)
	a, b = mirrortest.Image(t, layerBytes, 1, "linux/amd64"), mirrortest.Image(t, layerBytes, 1, "linux/amd64")
	up.PushImage(t, "team/a", "v1", a)
	up.PushImage(t, "team/b", "v1", b)
	return up, a, b
}

// TestPinsSurviveLostIndex (issue 24): pins live in their own file, so a serve restarted with its
// index file deleted (rebuilt from storage) still has them — one by tag, one by digest — and
// under the cap still evicts everything but them. A damaged pins file is moved aside, named in
// the log, and serve runs without pins. Fails without the pins file: the pins are gone after the
// restart and the pinned images are evicted.
func TestPinsSurviveLostIndex(t *testing.T) {
	t.Parallel()
	up, a, b := twoImages(t, 256<<10)
	for i := range 3 {
		up.PushImage(t, fmt.Sprintf("team/other%d", i), "v1", mirrortest.Image(t, 512<<10, 1, "linux/amd64"))
	}
	root := t.TempDir()
	pinnedBytes := mirrortest.StoredBytes(t, a) + mirrortest.StoredBytes(t, b)
	capBytes := pinnedBytes * 2 // the pins hold half of it
	opts := mirror.Options{Root: root, MaxSize: capBytes, Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}}
	h := newHarness(t, opts)
	h.run(t)
	pullImage(t, h.host+"/upstream.test/team/a:v1")
	pullImage(t, h.host+"/upstream.test/team/b:v1")
	h.waitIdle(t)
	waitInventory(t, h.host, "two images", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 2 })
	bDigest := digestOf(t, b)
	for _, spec := range []string{"upstream.test/team/a:v1", "upstream.test/team/b@" + bDigest} {
		if code, _, msg := pinRequest(t, h, http.MethodPut, spec); code != http.StatusOK {
			t.Fatalf("pin %s: %d %s", spec, code, msg)
		}
	}
	h.close(t)
	if err := os.Remove(cache.FilePath(root)); err != nil {
		t.Fatal(err)
	}

	h = newHarness(t, opts)
	h.runReady(t)
	if !strings.Contains(h.logs.String(), "cache index rebuilt from storage") {
		t.Fatalf("the index was not rebuilt:\n%s", h.logs.String())
	}
	l := pinList(t, h)
	if len(l.Pins) != 2 || l.Pins[0].Tag != "v1" || l.Pins[0].Digest != digestOf(t, a) || l.Pins[1].Tag != "" || l.Pins[1].Digest != bDigest ||
		l.PinnedBytes != pinnedBytes {
		t.Fatalf("pins after a restart without the index file: %+v; want team/a:v1 and team/b@%s, %d bytes", l, bDigest, pinnedBytes)
	}
	for i := range 3 {
		pullImage(t, fmt.Sprintf("%s/upstream.test/team/other%d:v1", h.host, i))
		h.waitIdle(t)
	}
	inv := waitInventory(t, h.host, "eviction under the cap", func(inv mirrorapi.CacheInventory) bool {
		return inv.SizeBytes <= capBytes && metricValue(t, h, `nodecache_evictions_total{reason="cap"}`) >= 1
	})
	for _, repo := range []string{"team/a", "team/b"} {
		if img := imageOf(inv, repo); img == nil || !img.Pinned {
			t.Errorf("%s after the evictions: %+v, want it cached and pinned", repo, img)
		}
	}
	h.close(t)

	// A pins file that is not one: moved aside, said, no pins.
	pinsFile := cache.PinsPath(root)
	if err := os.WriteFile(pinsFile, []byte(`{"version":1,"pins":[{"repo":"UPPER/case","digest":"sha256:12"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	h = newHarness(t, opts)
	h.runReady(t)
	if l := pinList(t, h); len(l.Pins) != 0 {
		t.Errorf("pins from a damaged pins file: %+v", l.Pins)
	}
	if _, err := os.Stat(pinsFile + ".unusable"); err != nil || !strings.Contains(h.logs.String(), "pins file unusable: moved aside") {
		t.Errorf("the damaged pins file was not moved aside (%v) or not logged:\n%s", err, h.logs.String())
	}
}

// TestPinLimitAndRemoval (issue 24): pins may hold at most 80% of --max-size: a pin past it is
// refused with 409 naming the cap, and nothing is pinned; a pin of what is not cached is 404
// naming warm --pin; DELETE of a pinned image is 409 naming the pin and cache unpin, and the
// image stays; unpinned, it goes. Pins are answered to loopback; the inventory marks pinned
// images. Fails without the feature: the pin API does not exist and DELETE evicts.
func TestPinLimitAndRemoval(t *testing.T) {
	t.Parallel()
	up, a, _ := twoImages(t, 512<<10)
	capBytes := mirrortest.StoredBytes(t, a) * 100 / 45 // a is 45% of the cap, a and b together about 90%
	h := newHarness(t, mirror.Options{Root: t.TempDir(), MaxSize: capBytes, Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.run(t)
	pullImage(t, h.host+"/upstream.test/team/a:v1")
	pullImage(t, h.host+"/upstream.test/team/b:v1")
	h.waitIdle(t)
	waitInventory(t, h.host, "two images", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 2 })

	if code, p, msg := pinRequest(t, h, http.MethodPut, "upstream.test/team/a:v1"); code != http.StatusOK || p.Digest != digestOf(t, a) || p.SizeBytes != mirrortest.StoredBytes(t, a) {
		t.Fatalf("pin a: %d %+v %s", code, p, msg)
	}
	code, _, msg := pinRequest(t, h, http.MethodPut, "upstream.test/team/b:v1")
	if code != http.StatusConflict || !strings.Contains(msg, "above 80% of the cap --max-size") || !strings.Contains(msg, fmt.Sprintf("(%d bytes)", capBytes)) {
		t.Errorf("pin b past 80%% of the cap: %d %q; want 409 naming --max-size and %d bytes", code, msg, capBytes)
	}
	if l := pinList(t, h); len(l.Pins) != 1 || l.PinnedBytes != mirrortest.StoredBytes(t, a) || l.MaxSizeBytes != capBytes {
		t.Errorf("pins after the refusal: %+v; want only team/a", l)
	}
	for spec, want := range map[string]int{
		"upstream.test/team/c:v1":                                       http.StatusNotFound,
		"upstream.test/team/a@sha256:" + strings.Repeat("0", 64):        http.StatusNotFound,
		"nowhere.test/team/a:v1":                                        http.StatusBadRequest,
		"upstream.test/team/a:bad!tag":                                  http.StatusBadRequest,
		"upstream.test/team/a@sha256:12":                                http.StatusBadRequest,
		"upstream.test/Team/a:v1":                                       http.StatusBadRequest,
		"upstream.test/team/a":                                          http.StatusBadRequest,
		"upstream.test/team/a:v1/extra":                                 http.StatusBadRequest,
		"upstream.test/team/a@" + digestOf(t, a) + "/" + digestOf(t, a): http.StatusBadRequest,
	} {
		code, _, msg := pinRequest(t, h, http.MethodPut, spec)
		if code != want || code == http.StatusNotFound && !strings.Contains(msg, "warm --pin") {
			t.Errorf("pin %s: %d %q; want %d (404 naming warm --pin)", spec, code, msg, want)
		}
	}
	if code, _, msg := pinRequest(t, h, http.MethodDelete, "upstream.test/team/a@"+digestOf(t, a)); code != http.StatusNotFound || !strings.Contains(msg, "held by upstream.test/team/a:v1") {
		t.Errorf("unpin by digest of an image pinned by tag: %d %q; want 404 naming the pin that holds it", code, msg)
	}

	inv := inventory(t, h.host)
	if ia, ib := imageOf(inv, "team/a"), imageOf(inv, "team/b"); ia == nil || !ia.Pinned || ib == nil || ib.Pinned || inv.PinnedBytes != mirrortest.StoredBytes(t, a) {
		t.Errorf("inventory: a %+v, b %+v, pinned bytes %d; want a pinned, b not", ia, ib, inv.PinnedBytes)
	}
	rm := "http://" + h.host + mirrorapi.CachePath + "/upstream.test/team/a@" + digestOf(t, a)
	resp, body := get(t, http.MethodDelete, rm, nil)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "pinned by upstream.test/team/a:v1") ||
		!strings.Contains(string(body), "nodecache cache unpin upstream.test/team/a:v1") {
		t.Errorf("DELETE of a pinned image: %s %s; want 409 naming the pin and cache unpin", resp.Status, body)
	}
	if imageOf(inventory(t, h.host), "team/a") == nil {
		t.Fatal("the pinned image was removed by DELETE")
	}
	if code, _, msg := pinRequest(t, h, http.MethodDelete, "upstream.test/team/a:v1"); code != http.StatusOK {
		t.Fatalf("unpin a: %d %s", code, msg)
	}
	if code, _, _ := pinRequest(t, h, http.MethodDelete, "upstream.test/team/a:v1"); code != http.StatusNotFound {
		t.Errorf("unpin twice: %d, want 404", code)
	}
	if resp, body := get(t, http.MethodDelete, rm, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("DELETE once unpinned: %s %s", resp.Status, body)
	}
	// b alone fits under 80% now.
	if code, _, msg := pinRequest(t, h, http.MethodPut, "upstream.test/team/b:v1"); code != http.StatusOK {
		t.Errorf("pin b once a is gone: %d %s", code, msg)
	}
}

// TestPinFollowsTag (issue 24): a pin by tag follows the tag. When serve's revalidation finds the
// tag moved, the new image is pinned as well (Next) while it is incomplete — both images are
// marked pinned and cannot be removed — and once every blob of it is stored the pin holds it
// alone and the old image is released (removable). The same through warm --pin, for an index:
// the new index is pinned once its platform image is warm, the old one released. Fails without
// the feature: the pin stays on the old image and never holds the new one.
func TestPinFollowsTag(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	v1a := mirrortest.Image(t, 256<<10, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", v1a)
	h := newHarness(t, mirror.Options{Root: t.TempDir(), Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.runReady(t)
	warmPin(t, h, "upstream.test/team/app:v1")
	h.waitIdle(t)
	dA := digestOf(t, v1a)

	v1b := mirrortest.Image(t, 256<<10, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", v1b)
	dB := digestOf(t, v1b)
	// The tag revalidated: the new manifest is stored, none of its blobs yet.
	if code, cached := manifestStatus(t, "http://"+h.host+"/v2/upstream.test/team/app/manifests/v1"); code != http.StatusOK || cached != mirrorapi.CacheMiss {
		t.Fatalf("manifest by tag after the push: %d %s", code, cached)
	}
	l := pinList(t, h)
	if len(l.Pins) != 1 || l.Pins[0].Digest != dA || l.Pins[0].Next != dB {
		t.Fatalf("pin after the tag moved, blobs not stored: %+v; want digest %s, next %s", l.Pins, dA, dB)
	}
	inv := inventory(t, h.host)
	for _, d := range []string{dA, dB} {
		img := imageByDigest(inv, d)
		if img == nil || !img.Pinned {
			t.Errorf("image %s while the tag moves: %+v, want cached and pinned", d, img)
		}
		if resp, _ := get(t, http.MethodDelete, "http://"+h.host+mirrorapi.CachePath+"/upstream.test/team/app@"+d, nil); resp.StatusCode != http.StatusConflict {
			t.Errorf("DELETE of %s while the tag moves: %s, want 409", d, resp.Status)
		}
	}
	pullImage(t, h.host+"/upstream.test/team/app:v1") // every blob of the new image stored
	h.waitIdle(t)
	l = waitPins(t, h, "the move to complete", func(l mirrorapi.PinList) bool {
		return len(l.Pins) == 1 && l.Pins[0].Digest == dB && l.Pins[0].Next == ""
	})
	if l.PinnedBytes != mirrortest.StoredBytes(t, v1b) {
		t.Errorf("pinned bytes after the move: %d, want the new image's %d", l.PinnedBytes, mirrortest.StoredBytes(t, v1b))
	}
	if img := imageByDigest(inventory(t, h.host), dA); img == nil || img.Pinned {
		t.Errorf("old image after the move: %+v, want cached and released", img)
	}
	if resp, body := get(t, http.MethodDelete, "http://"+h.host+mirrorapi.CachePath+"/upstream.test/team/app@"+dA, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("DELETE of the released image: %s %s", resp.Status, body)
	}

	// Through warm, for an index: the new index is pinned whole once its amd64 image is warm.
	idx1 := mirrortest.MultiPlatformIndex(t, 128<<10, 1)
	up.PushIndex(t, "team/multi", "v1", idx1)
	warmPin(t, h, "upstream.test/team/multi:v1")
	h.waitIdle(t)
	idx2 := mirrortest.MultiPlatformIndex(t, 128<<10, 1)
	up.PushIndex(t, "team/multi", "v1", idx2)
	rep := warmPin(t, h, "upstream.test/team/multi:v1")
	d1, d2 := digestOf(t, idx1), digestOf(t, idx2)
	if rep.Images[0].Digest != d2 {
		t.Fatalf("warm walked %s, want the new index %s", rep.Images[0].Digest, d2)
	}
	waitPins(t, h, "the index pin to move", func(l mirrorapi.PinList) bool {
		for _, p := range l.Pins {
			if p.Repository == "team/multi" {
				return p.Tag == "v1" && p.Digest == d2 && p.Next == ""
			}
		}
		return false
	})
	inv = inventory(t, h.host)
	if img := imageByDigest(inv, d1); img == nil || img.Pinned {
		t.Errorf("old index after warm moved the pin: %+v, want cached and released", img)
	}
	if img := imageByDigest(inv, d2); img == nil || !img.Pinned {
		t.Errorf("new index after warm moved the pin: %+v, want cached and pinned", img)
	}
}

// waitPins polls the pins until ok accepts them (10 s at most).
func waitPins(t *testing.T, h *harness, what string, ok func(mirrorapi.PinList) bool) mirrorapi.PinList {
	t.Helper()
	return poll(t, what, func() mirrorapi.PinList { return pinList(t, h) }, ok, func(l mirrorapi.PinList) string { return fmt.Sprintf("pins: %+v", l) })
}
