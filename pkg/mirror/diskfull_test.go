package mirror_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// tmpfsRoot mounts a tmpfs of size (mount's size=, e.g. "8m", "2560k") on a fresh directory
// for the test. It needs root (CI runs as root); without it the test is skipped, saying why.
func tmpfsRoot(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (CI runs as root)")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s here (a container without CAP_SYS_ADMIN?): %v", root, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	return root
}

// getBigBlob pulls repo:v1's manifest, then GETs its first layer: the whole, verified blob must
// come back as a miss (on a full disk, from memory).
func getBigBlob(t *testing.T, h *harness, repo string, img v1.Image) v1.Hash {
	t.Helper()
	ld, data := mirrortest.LayerBlob(t, img, 0)
	if code, _ := manifestStatus(t, fmt.Sprintf("http://%s/v2/upstream.test/%s/manifests/v1", h.host, repo)); code != 200 {
		t.Fatalf("manifest of %s: %d", repo, code)
	}
	resp, body := get(t, "GET", fmt.Sprintf("http://%s/v2/upstream.test/%s/blobs/%s", h.host, repo, ld), nil)
	if resp.StatusCode != 200 || !bytes.Equal(body, data) || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheMiss {
		t.Fatalf("blob of %s: %d, %s=%q, %d of %d bytes (equal: %v); want the whole blob as a miss",
			repo, resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache), len(body), len(data), bytes.Equal(body, data))
	}
	h.waitIdle(t)
	return ld
}

// TestDiskFullKeepsServing: on an 8 MiB tmpfs holding two cached images, a fill of a 5.5 MiB
// layer hits ENOSPC: its client still gets the whole, verified blob (a miss), nothing of it is
// stored, eviction makes the room the blob lacked and no more (the least recently pulled image
// goes, reason enospc; the other stays), the blob is stored when asked again, and the other
// cached image keeps being served with the upstream gone.
func TestDiskFullKeepsServing(t *testing.T) {
	t.Parallel()
	root := tmpfsRoot(t, "8m")
	up := mirrortest.NewRegistry(t)
	small := []string{"team/old", "team/recent"}
	for _, repo := range small {
		up.PushImage(t, repo, "v1", mirrortest.Image(t, 1536<<10, 1, "linux/amd64"))
	}
	big := mirrortest.Image(t, 5632<<10, 1, "linux/amd64")
	up.PushImage(t, "team/big", "v1", big)
	h := newHarness(t, mirror.Options{Root: root, Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.run(t)
	for _, repo := range small {
		pullImage(t, h.host+"/upstream.test/"+repo+":v1")
		h.waitIdle(t)
	}
	waitInventory(t, h.host, "two cached images", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 2 })

	ld := getBigBlob(t, h, "team/big", big)
	if _, err := os.Stat(blobDataPath(root, ld)); err == nil {
		t.Errorf("a blob that did not fit was stored")
	}
	inv := waitInventory(t, h.host, "the enospc eviction", func(inv mirrorapi.CacheInventory) bool {
		return metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`) >= 1 && !hasRepo(inv, "team/old")
	})
	if !hasRepo(inv, "team/recent") || metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`) != 1 {
		t.Errorf("the enospc eviction took more than the room the blob lacked: %v", inv.Images)
	}
	pullImage(t, h.host+"/upstream.test/team/big:v1") // now there is room: stored
	h.waitIdle(t)
	if _, err := os.Stat(blobDataPath(root, ld)); err != nil {
		t.Errorf("the blob was not stored once eviction made room: %v", err)
	}
	up.Stop()
	pullImage(t, h.host+"/upstream.test/team/recent:v1")
	if code, _ := manifestStatus(t, fmt.Sprintf("http://%s/v2/upstream.test/team/old/manifests/v1", h.host)); code == 200 || code == 500 {
		t.Errorf("the least recently pulled image with the upstream gone: %d, want it evicted (503)", code)
	}
}

// TestDiskFullBlobSizes: on a 2.5 MiB tmpfs holding one small image, a 1.5 MiB blob — room for
// it once, not twice — is stored without any eviction (a fill's commit takes no second copy),
// and a 3 MiB blob, which no eviction could make room for, is served but evicts nothing, asked
// twice.
func TestDiskFullBlobSizes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		layerBytes int64
		stored     bool
	}{
		{"fits once, not twice", 1536 << 10, true},
		{"larger than the file system", 3 * mirrortest.MiB, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := tmpfsRoot(t, "2560k")
			up, _ := mirrortest.NewRegistryWithImage(t, "team/small", "v1", 256<<10)
			big := mirrortest.Image(t, tc.layerBytes, 1, "linux/amd64")
			up.PushImage(t, "team/big", "v1", big)
			h := newHarness(t, mirror.Options{Root: root, Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
			h.run(t)
			pullImage(t, h.host+"/upstream.test/team/small:v1")
			h.waitIdle(t)
			waitInventory(t, h.host, "the small image", func(inv mirrorapi.CacheInventory) bool { return inv.Ready && len(inv.Images) == 1 })

			attempts := 1
			if !tc.stored {
				attempts = 2
			}
			var ld v1.Hash
			for range attempts {
				ld = getBigBlob(t, h, "team/big", big)
			}
			_, err := os.Stat(blobDataPath(root, ld))
			if stored := err == nil; stored != tc.stored {
				t.Errorf("blob stored: %v, want %v", stored, tc.stored)
			}
			if !tc.stored && !strings.Contains(h.logs.String(), "would not fit even with the whole cache evicted") {
				t.Errorf("no log line saying the blob cannot fit:\n%s", h.logs.String())
			}
			// A disk-full eviction is decided when the fill hits ENOSPC, before WaitIdle returns:
			// none was asked for, so none runs later.
			inv := inventory(t, h.host)
			if n := metricValue(t, h, `nodecache_evictions_total{reason="enospc"}`); n != 0 || !hasRepo(inv, "team/small") {
				t.Errorf("enospc evictions %v, images %v; want none evicted, team/small kept", n, inv.Images)
			}
			if !strings.Contains(h.logs.String(), "disk full") != tc.stored {
				t.Errorf("disk full logged: %v, want %v", strings.Contains(h.logs.String(), "disk full"), !tc.stored)
			}
		})
	}
}

func hasRepo(inv mirrorapi.CacheInventory, repo string) bool {
	for _, i := range inv.Images {
		if i.Repository == repo {
			return true
		}
	}
	return false
}
