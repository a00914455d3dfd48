package mirror_test

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestDiskFullKeepsServing: on an 8 MiB tmpfs holding two cached images, a fill of an 8 MiB
// layer hits ENOSPC: its client still gets the whole, verified blob (a miss), nothing of it is
// stored, eviction makes room (the least recently pulled image goes, reason enospc), and the
// other cached image keeps being served with the upstream gone.
func TestDiskFullKeepsServing(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (CI runs as root)")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=8m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s here (a container without CAP_SYS_ADMIN?): %v", root, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })

	up := mirrortest.NewRegistry(t)
	small := []string{"team/old", "team/recent"}
	for _, repo := range small {
		up.PushImage(t, repo, "v1", mirrortest.Image(t, 1536<<10, 1, "linux/amd64"))
	}
	big := mirrortest.Image(t, 8*mirrortest.MiB, 1, "linux/amd64")
	up.PushImage(t, "team/big", "v1", big)
	h := newHarness(t, mirror.Options{Root: root, Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	runMirror(t, h.m)
	for _, repo := range small {
		pullImage(t, h.host+"/upstream.test/"+repo+":v1")
		if err := h.m.WaitIdle(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	waitInventory(t, h.host, "two cached images", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 2 })

	layers, _ := big.Layers()
	ld, _ := layers[0].Digest()
	_, data := layerBytesOf(t, layers[0])
	blobURL := fmt.Sprintf("http://%s/v2/upstream.test/team/big/blobs/%s", h.host, ld)
	pullManifest := fmt.Sprintf("http://%s/v2/upstream.test/team/big/manifests/v1", h.host)
	if code, _ := manifestStatus(t, pullManifest); code != 200 {
		t.Fatalf("manifest of the big image: %d", code)
	}
	resp, body := get(t, "GET", blobURL, nil)
	if resp.StatusCode != 200 || !bytes.Equal(body, data) || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheMiss {
		t.Fatalf("blob filled on a full disk: %d, %s=%q, %d of %d bytes (equal: %v); want the whole blob as a miss",
			resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache), len(body), len(data), bytes.Equal(body, data))
	}
	if err := h.m.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(blobDataPath(root, ld)); err == nil {
		t.Errorf("a blob that did not fit was stored")
	}
	waitInventory(t, h.host, "the enospc eviction", func(inv mirrorapi.CacheInventory) bool {
		return metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`) >= 1
	})
	up.Stop()
	pullImage(t, h.host+"/upstream.test/team/recent:v1")
	if code, _ := manifestStatus(t, fmt.Sprintf("http://%s/v2/upstream.test/team/old/manifests/v1", h.host)); code == 200 || code == 500 {
		t.Errorf("the least recently pulled image with the upstream gone: %d, want it evicted (503)", code)
	}
}
