package mirror_test

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// imageOnBase builds an OCI image whose first layer is base and second a random layer of
// ownBytes bytes.
func imageOnBase(t *testing.T, base v1.Layer, ownBytes int64) v1.Image {
	t.Helper()
	own, err := random.Layer(ownBytes, types.OCILayer)
	if err != nil {
		t.Fatal(err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, base, own)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func inventory(t *testing.T, host string) mirrorapi.CacheInventory {
	t.Helper()
	resp, body := get(t, http.MethodGet, "http://"+host+mirrorapi.CachePath, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", mirrorapi.CachePath, resp.Status, body)
	}
	var inv mirrorapi.CacheInventory
	if err := json.Unmarshal(body, &inv); err != nil {
		t.Fatal(err)
	}
	return inv
}

// waitInventory polls the inventory until ok accepts it (10 s at most).
func waitInventory(t *testing.T, host string, what string, ok func(mirrorapi.CacheInventory) bool) mirrorapi.CacheInventory {
	t.Helper()
	return poll(t, what, func() mirrorapi.CacheInventory { return inventory(t, host) }, ok, func(inv mirrorapi.CacheInventory) string {
		b, _ := json.MarshalIndent(inv, "", "  ")
		return "inventory:\n" + string(b)
	})
}

// pullImage pulls the image s with go-containerregistry and validates it (every blob fetched and
// its digest checked).
func pullImage(t *testing.T, s string) {
	t.Helper()
	if err := pullImageErr(t.Context(), s); err != nil {
		t.Fatal(err)
	}
}

// manifestStatus GETs an OCI image manifest: the status and the cache header of the answer.
func manifestStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, _ := get(t, http.MethodGet, url, http.Header{"Accept": {string(types.OCIManifestSchema1)}})
	return resp.StatusCode, resp.Header.Get(mirrorapi.HeaderCache)
}

// TestSizeCapEvictsLeastRecentlyPulled: with a cap that fits three of five images sharing a base
// layer, after pulling all five the cache is under the cap, the two least recently pulled are
// evicted, the shared base layer is kept, the most recent image is served with the upstream
// gone, and an evicted one is a miss (never a 500) — a 503 while the upstream is down.
func TestSizeCapEvictsLeastRecentlyPulled(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	base, err := random.Layer(mirrortest.MiB, types.OCILayer)
	if err != nil {
		t.Fatal(err)
	}
	baseSize, _ := base.Size()
	imgs := make([]v1.Image, 5)
	digests := make([]string, 5)
	uniques := make([]int64, 5)
	var unique int64
	for i := range imgs {
		imgs[i] = imageOnBase(t, base, mirrortest.MiB)
		up.PushImage(t, fmt.Sprintf("team/app%d", i), "v1", imgs[i])
		digests[i] = digestOf(t, imgs[i])
		uniques[i] = mirrortest.StoredBytes(t, imgs[i]) - baseSize // besides the shared base layer
		unique = max(unique, uniques[i])
	}
	// Three images and half of a fourth: eviction to 90 % of it leaves exactly three.
	capBytes := baseSize + 3*unique + unique/2
	h := newHarness(t, mirror.Options{Root: t.TempDir(), MaxSize: capBytes,
		Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.run(t)
	for i := range imgs {
		pullImage(t, fmt.Sprintf("%s/upstream.test/team/app%d:v1", h.host, i))
		h.waitIdle(t)
	}
	// Eviction is over when the cache is at 90 % of the cap, the second image is counted and its
	// blobs are gone: an image is counted before its blobs are deleted, so the blob gauge and the
	// evicted bytes are waited for too (read in the same poll as the inventory they must match).
	inv := waitInventory(t, h.host, "three images at 90% of the cap", func(inv mirrorapi.CacheInventory) bool {
		return len(inv.Images) == 3 && inv.SizeBytes <= capBytes*9/10 &&
			metricValue(t, h, `nodecache_evictions_total{reason="cap"}`) == 2 &&
			metricValue(t, h, `nodecache_evicted_bytes_total`) == float64(uniques[0]+uniques[1]) &&
			metricValue(t, h, `nodecache_cache_blobs`) == float64(inv.Blobs) &&
			metricValue(t, h, `nodecache_cache_size_bytes`) == float64(inv.SizeBytes)
	})
	for i, img := range inv.Images {
		want := fmt.Sprintf("team/app%d", 4-i)
		if img.Repository != want || img.Digest != digests[4-i] || img.Upstream != "upstream.test" {
			t.Errorf("inventory image %d = %s/%s@%s, want %s@%s (most recently pulled first)", i, img.Upstream, img.Repository, img.Digest, want, digests[4-i])
		}
		if len(img.Tags) != 1 || img.Tags[0] != "v1" {
			t.Errorf("inventory image %d tags = %v, want [v1]", i, img.Tags)
		}
	}
	for series, want := range map[string]float64{
		`nodecache_evictions_total{reason="cap"}`:          2,
		`nodecache_evictions_total{reason="api"}`:          0,
		`nodecache_cache_size_bytes`:                       float64(inv.SizeBytes),
		`nodecache_cache_max_size_bytes`:                   float64(capBytes),
		`nodecache_cache_blobs`:                            float64(inv.Blobs),
		`nodecache_evicted_bytes_total`:                    float64(uniques[0] + uniques[1]),
		`nodecache_evictions_total{reason="unreferenced"}`: 0,
	} {
		if got := metricValue(t, h, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	for _, series := range []string{
		`nodecache_first_byte_seconds_count{cache="miss",kind="manifest",upstream="upstream.test"}`,
		`nodecache_first_byte_seconds_count{cache="miss",kind="blob",upstream="upstream.test"}`,
	} {
		if got := metricValue(t, h, series); got < 1 {
			t.Errorf("%s = %v, want at least 1", series, got)
		}
	}
	baseDigest, _ := base.Digest()
	hex := baseDigest.Hex
	if _, err := os.Stat(filepath.Join(h.m.Root(), "docker/registry/v2/blobs/sha256", hex[:2], hex, "data")); err != nil {
		t.Errorf("shared base layer was removed: %v", err)
	}

	up.Stop()
	pullImage(t, h.host+"/upstream.test/team/app4:v1") // tag stale, everything else a hit
	if got := metricValue(t, h, `nodecache_first_byte_seconds_count{cache="hit",kind="blob",upstream="upstream.test"}`); got < 2 {
		t.Errorf("first-byte observations of blob hits = %v, want at least 2 (config and layers)", got)
	}
	for _, i := range []int{0, 1} {
		code, _ := manifestStatus(t, fmt.Sprintf("http://%s/v2/upstream.test/team/app%d/manifests/%s", h.host, i, digests[i]))
		if code == http.StatusOK || code >= 500 && code != http.StatusServiceUnavailable {
			t.Errorf("evicted image %d with the upstream down: %d, want 503 (not cached, upstream unreachable)", i, code)
		}
	}
	up.Start(t)
	code, cache := manifestStatus(t, fmt.Sprintf("http://%s/v2/upstream.test/team/app0/manifests/v1", h.host))
	if code != http.StatusOK || cache != mirrorapi.CacheMiss {
		t.Errorf("evicted image pulled again: %d %s=%q, want 200 miss", code, mirrorapi.HeaderCache, cache)
	}
	pullImage(t, h.host+"/upstream.test/team/app0:v1")
}

// deleteImage DELETEs spec (repository@digest) from the cache API: the answer's status.
func deleteImage(t *testing.T, host, spec string) int {
	t.Helper()
	resp, _ := get(t, http.MethodDelete, "http://"+host+mirrorapi.CachePath+"/"+spec, nil)
	return resp.StatusCode
}

func blobDataPath(root string, d v1.Hash) string {
	return filepath.Join(root, "docker/registry/v2/blobs", d.Algorithm, d.Hex[:2], d.Hex, "data")
}

// TestEvictionSparesBlobBeingServed: a blob streamed to a slow client survives the eviction of
// its image (its links go, its data stays while it is served), and the client gets all of it.
func TestEvictionSparesBlobBeingServed(t *testing.T) {
	t.Parallel()
	up, img := mirrortest.NewRegistryWithImage(t, "team/big", "v1", 32*mirrortest.MiB)
	h := newHarness(t, mirror.Options{Root: t.TempDir(), Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.run(t)
	pullImage(t, h.host+"/upstream.test/team/big:v1")
	h.waitIdle(t)
	ld := mirrortest.LayerDigests(t, img)[0]
	resp, err := http.Get(fmt.Sprintf("http://%s/v2/upstream.test/team/big/blobs/%s", h.host, ld))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get(mirrorapi.HeaderCache); got != mirrorapi.CacheHit {
		t.Fatalf("blob answer %s=%q, want hit", mirrorapi.HeaderCache, got)
	}
	hsh := sha256.New()
	if _, err := io.CopyN(hsh, resp.Body, 64<<10); err != nil {
		t.Fatal(err)
	}
	waitInventory(t, h.host, "the index", func(inv mirrorapi.CacheInventory) bool { return inv.Ready })
	if code := deleteImage(t, h.host, "upstream.test/team/big@"+digestOf(t, img)); code != http.StatusOK {
		t.Fatalf("DELETE image: %d, want 200", code)
	}
	if inv := inventory(t, h.host); len(inv.Images) != 0 {
		t.Errorf("inventory after DELETE: %d images, want 0", len(inv.Images))
	}
	if _, err := os.Stat(blobDataPath(h.m.Root(), ld)); err != nil {
		t.Errorf("data of a blob being served was removed: %v", err)
	}
	if _, err := io.Copy(hsh, resp.Body); err != nil {
		t.Fatalf("slow client's stream broke: %v", err)
	}
	if got := "sha256:" + fmt.Sprintf("%x", hsh.Sum(nil)); got != ld.String() {
		t.Errorf("slow client got %s, want %s", got, ld)
	}
}

// TestEvictionRacingFillLosesNothing: evicting an image from one repository while the same
// image (same digests) is pulled into another repository loses nothing: afterwards the other
// repository serves the whole image with the upstream gone.
func TestEvictionRacingFillLosesNothing(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	h := newHarness(t, mirror.Options{Root: t.TempDir(), Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.runReady(t)
	const rounds = 6
	for i := range rounds {
		img := mirrortest.Image(t, 256<<10, 3, "linux/amd64")
		a, b := fmt.Sprintf("team/a%d", i), fmt.Sprintf("team/b%d", i)
		up.PushImage(t, a, "v1", img)
		up.PushImage(t, b, "v1", img)
		pullImage(t, h.host+"/upstream.test/"+a+":v1")
		h.waitIdle(t)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * time.Millisecond) // a different interleaving each round
			if code := deleteImage(t, h.host, "upstream.test/"+a+"@"+digestOf(t, img)); code != http.StatusOK {
				t.Errorf("round %d: DELETE: %d", i, code)
			}
		}()
		pullImage(t, h.host+"/upstream.test/"+b+":v1")
		wg.Wait()
		h.waitIdle(t)
	}
	up.Stop()
	for i := range rounds {
		pullImage(t, fmt.Sprintf("%s/upstream.test/team/b%d:v1", h.host, i))
	}
}

// TestIndexRebuildsFromStorage: the cache index written at a clean shutdown is loaded as it is;
// deleted, corrupt, of another version or left by a crash (not clean), it is rebuilt from
// storage with the same images and size.
func TestIndexRebuildsFromStorage(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/one", "v1", mirrortest.Image(t, 64<<10, 2, "linux/amd64"))
	multi := mirrortest.MultiPlatformIndex(t, 64<<10, 1)
	up.PushIndex(t, "team/multi", "v2", multi)
	amd64, child := mirrortest.IndexChild(t, multi, 0)
	up.PushImage(t, "team/multi", "amd64", child) // a tag of the index's child: kept as a child tag
	root := t.TempDir()
	ups := []name.Upstream{upstreamFor(t, "upstream.test", up)}
	h := newHarness(t, mirror.Options{Root: root, Upstreams: ups})
	h.run(t)
	pullImage(t, h.host+"/upstream.test/team/one:v1")
	pullIndexGGCR(t, ref(t, h.host+"/upstream.test/team/multi:v2"))
	pullImage(t, h.host+"/upstream.test/team/multi:amd64")
	h.waitIdle(t)
	want := waitInventory(t, h.host, "two images", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 2 })
	if want.Images[0].ChildTags["amd64"] != amd64.String() {
		t.Fatalf("child tag amd64 not on the index's row: %+v", want.Images)
	}
	h.close(t)
	indexFile := filepath.Join(root, "nodecache", "index.json")
	clean, err := os.ReadFile(indexFile)
	if err != nil {
		t.Fatalf("index not written at Close: %v", err)
	}
	up.Stop()
	for _, tc := range []struct {
		name  string
		write func() error
	}{
		{"clean file", func() error { return os.WriteFile(indexFile, clean, 0o600) }},
		{"deleted", func() error { return os.Remove(indexFile) }},
		{"corrupt", func() error { return os.WriteFile(indexFile, clean[:len(clean)/2], 0o600) }},
		{"older version", func() error {
			return os.WriteFile(indexFile, []byte(`{"version":0,"clean":true,"blobs":{},"repos":{}}`), 0o600)
		}},
		{"left by a crash", func() error {
			var f map[string]any
			_ = json.Unmarshal(clean, &f)
			f["clean"] = false
			f["blobs"] = map[string]any{}
			b, _ := json.Marshal(f)
			return os.WriteFile(indexFile, b, 0o600)
		}},
		// Valid JSON, but a blob entry is null (a damaged file; FuzzIndexFile found it): loading
		// it panicked serve at start, every start.
		{"null entry", func() error {
			var f map[string]any
			_ = json.Unmarshal(clean, &f)
			for d := range f["blobs"].(map[string]any) {
				f["blobs"].(map[string]any)[d] = nil
				break
			}
			b, _ := json.Marshal(f)
			return os.WriteFile(indexFile, b, 0o600)
		}},
	} {
		if err := tc.write(); err != nil {
			t.Fatal(err)
		}
		h2 := newHarness(t, mirror.Options{Root: root, Upstreams: ups})
		h2.run(t)
		got := waitInventory(t, h2.host, tc.name+": the index", func(inv mirrorapi.CacheInventory) bool { return inv.Ready })
		if got.SizeBytes != want.SizeBytes || got.Blobs != want.Blobs || len(got.Images) != len(want.Images) {
			t.Errorf("%s: size %d, blobs %d, images %d; want %d, %d, %d", tc.name, got.SizeBytes, got.Blobs, len(got.Images), want.SizeBytes, want.Blobs, len(want.Images))
		}
		for i := range min(len(got.Images), len(want.Images)) {
			g, w := got.Images[i], want.Images[i]
			if g.Repository != w.Repository || g.Digest != w.Digest || g.SizeBytes != w.SizeBytes || fmt.Sprint(g.Tags) != fmt.Sprint(w.Tags) ||
				fmt.Sprint(g.ChildTags) != fmt.Sprint(w.ChildTags) {
				t.Errorf("%s: image %d = %+v, want %+v", tc.name, i, g, w)
			}
		}
		pullImage(t, h2.host+"/upstream.test/team/one:v1") // served from what the index describes
		h2.close(t)
	}

	// Started over its cap, nodecache evicts at once: the least recently pulled image goes.
	h3 := newHarness(t, mirror.Options{Root: root, Upstreams: ups, MaxSize: want.SizeBytes - 1})
	h3.run(t)
	got := waitInventory(t, h3.host, "eviction at start", func(inv mirrorapi.CacheInventory) bool {
		return inv.Ready && len(inv.Images) == 1 && inv.SizeBytes <= (want.SizeBytes-1)*9/10
	})
	if got.Images[0].Repository != "team/one" {
		t.Errorf("after eviction at start: %s kept, want team/one (pulled last, by the loop above)", got.Images[0].Repository)
	}
}

// TestServesBeforeIndexReady: a restarted mirror serves pulls from its storage before its cache
// index is loaded or rebuilt (Run not started, as while the rebuild still walks storage): the
// inventory says not ready, the image pulls with the upstream gone, and nothing is evicted
// though the cap is below the cache's size. Once Run has rebuilt the index, eviction follows the
// cap and the inventory is ready.
func TestServesBeforeIndexReady(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/one", "v1", mirrortest.Image(t, 64<<10, 2, "linux/amd64"))
	up.PushImage(t, "team/two", "v1", mirrortest.Image(t, 64<<10, 2, "linux/amd64"))
	root := t.TempDir()
	ups := []name.Upstream{upstreamFor(t, "upstream.test", up)}
	h := newHarness(t, mirror.Options{Root: root, Upstreams: ups})
	h.run(t)
	pullImage(t, h.host+"/upstream.test/team/one:v1")
	pullImage(t, h.host+"/upstream.test/team/two:v1")
	h.waitIdle(t)
	full := waitInventory(t, h.host, "two images", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 2 })
	h.close(t)
	if err := os.Remove(filepath.Join(root, "nodecache", "index.json")); err != nil {
		t.Fatal(err) // no index file: the next start must rebuild from storage
	}
	up.Stop()

	h2 := newHarness(t, mirror.Options{Root: root, Upstreams: ups, MaxSize: full.SizeBytes - 1})
	if inv := inventory(t, h2.host); inv.Ready {
		t.Fatalf("inventory ready before the index was loaded: %+v", inv)
	}
	for range 2 {
		pullImage(t, h2.host+"/upstream.test/team/one:v1")
		pullImage(t, h2.host+"/upstream.test/team/two:v1")
	}
	var blobs int
	if err := filepath.WalkDir(filepath.Join(root, "docker", "registry", "v2", "blobs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "data" {
			blobs++
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if blobs != full.Blobs {
		t.Fatalf("%d blobs on disk while the index was not ready, want all %d (nothing evicted before the index is known)", blobs, full.Blobs)
	}
	h2.run(t)
	waitInventory(t, h2.host, "the rebuilt index, then eviction to the cap", func(inv mirrorapi.CacheInventory) bool {
		return inv.Ready && len(inv.Images) == 1 && inv.SizeBytes < full.SizeBytes
	})
}

// metricValue is the value of the series "name{labels}" (labels as Prometheus writes them, ""
// for none) on h's /metrics; -1 when it is not there.
func metricValue(t *testing.T, h *harness, series string) float64 {
	t.Helper()
	return metricAt(t, fmtURL(h, "/metrics"), series)
}

// metricAt is metricValue for the metrics served at url.
func metricAt(t *testing.T, url, series string) float64 {
	t.Helper()
	_, body := get(t, http.MethodGet, url, nil)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return -1
}
