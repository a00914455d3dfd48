package mirror_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
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

// diskFullUpstream is an upstream that keeps its blobs on disk (distribution's in-memory driver
// takes seconds to take a blob of tens of MiB) holding team/big:v1, one layer of layerBytes
// random bytes (not gzipped: quick to make), and a mirror on a full tmpfs root in front of it.
func diskFullUpstream(t *testing.T, layerBytes int) (*harness, *mirrortest.Registry, string, []byte) {
	t.Helper()
	root := tmpfsRoot(t, "2m")
	upRoot := t.TempDir()
	up := mirrortest.NewRegistryWithConfig(t, func(c *configuration.Configuration) {
		delete(c.Storage, "inmemory")
		c.Storage["filesystem"] = configuration.Parameters{"rootdirectory": upRoot}
	})
	data := make([]byte, layerBytes)
	_, _ = rand.Read(data)
	layer := static.NewLayer(data, types.OCILayer)
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	up.PushImage(t, "team/big", "v1", img)
	d, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, mirror.Options{Root: root, Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.run(t)
	up.ResetRequests()
	return h, up, fmt.Sprintf("http://%s/v2/upstream.test/team/big/blobs/%s", h.host, d), data
}

// readAlong GETs url and reads its body in 64 KiB reads, calling step after each with the bytes
// read so far (step sleeps to pace the client); it returns the status and what it read.
func readAlong(t *testing.T, url string, step func(n int)) (int, []byte, error) {
	t.Helper()
	resp, err := http.DefaultClient.Do(newRequest(t, http.MethodGet, url, nil))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	// Room for the whole body at once: growing it would stall the reader (the race detector
	// takes seconds to copy tens of MiB).
	body := make([]byte, 0, max(0, resp.ContentLength))
	buf := make([]byte, 64<<10)
	for {
		n, err := io.ReadFull(resp.Body, buf)
		body = append(body, buf[:n]...)
		if err == io.EOF || err == io.ErrUnexpectedEOF && len(body) == int(resp.ContentLength) {
			return resp.StatusCode, body, nil
		}
		if err != nil {
			return resp.StatusCode, body, err
		}
		step(len(body))
	}
}

// TestDiskFullLateAndSlowClients (issue 23, disk full): a 32 MiB blob that cannot be stored
// (a 2 MiB tmpfs root) streams through a window of 8 MiB. A client that joins once bytes it needs
// are gone from the window, and one that stops reading for longer than the fill waits for a
// lagging reader, each get their own upstream stream (a Range request from where the staging
// file ended) and the whole, verified blob; the client reading along is not held up by the one
// that stopped; the memory held (nodecache_fill_spill_bytes) is the window, and one client's
// own stream at most, and back to 0 once they are done. (The spill window's wait for a reader
// that reads nothing is 3 s, the pause 10 s.)
func TestDiskFullLateAndSlowClients(t *testing.T) {
	t.Parallel()
	const size = 32 << 20
	for _, tc := range []struct {
		name string
		// second starts when the first client has read this many bytes, and pauses
		// pauseAt bytes into its own body for pause; the spill gauge is read when the first
		// client has read gaugeAt bytes; the first client waits throttle after every 64 KiB.
		secondAt, pauseAt, gaugeAt int
		pause, throttle            time.Duration
	}{
		// At about 32 MiB/s the fill is at most a window (and the socket buffers) ahead of the
		// first client: still running when the second joins.
		{"late joiner", 10 << 20, 0, 8 << 20, 0, 2 * time.Millisecond},
		{"client that stops reading", 0, 1 << 20, 12 << 20, 10 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, up, url, data := diskFullUpstream(t, size)
			// mid: the first client has read gaugeAt bytes (the fill holds its whole window).
			second, mid := make(chan struct{}), make(chan struct{})
			var secondOnce, midOnce sync.Once
			type result struct {
				status int
				body   []byte
				err    error
				done   time.Time
			}
			results := make(chan result, 2)
			var firstDone, resumed time.Time
			go func() {
				status, body, err := readAlong(t, url, func(n int) {
					time.Sleep(tc.throttle)
					if n >= tc.gaugeAt {
						midOnce.Do(func() { close(mid) })
					}
					if n >= tc.secondAt {
						secondOnce.Do(func() { close(second) })
					}
				})
				results <- result{status, body, err, time.Now()}
			}()
			startSecond := func() {
				go func() {
					paused := false
					status, body, err := readAlong(t, url, func(n int) {
						if tc.pause > 0 && !paused && n >= tc.pauseAt {
							paused = true
							time.Sleep(tc.pause)
							resumed = time.Now()
						}
					})
					results <- result{status, body, err, time.Time{}}
				}()
			}
			var spill float64
			if tc.secondAt > tc.gaugeAt {
				<-mid
				spill = metricValue(t, h, "nodecache_fill_spill_bytes")
				<-second
				startSecond()
			} else {
				<-second
				startSecond()
				<-mid // the second client is paused
				spill = metricValue(t, h, "nodecache_fill_spill_bytes")
			}
			for range 2 {
				r := <-results
				if !r.done.IsZero() {
					firstDone = r.done
				}
				if r.err != nil || r.status != http.StatusOK || !bytes.Equal(r.body, data) {
					answer := ""
					if r.status != http.StatusOK && len(r.body) < 1024 {
						answer = ": " + string(r.body) // the error body says which bound refused it
					}
					t.Fatalf("a client got %d, %d of %d bytes (equal: %v), error %v; want the whole blob%s", r.status, len(r.body), len(data), bytes.Equal(r.body, data), r.err, answer)
				}
			}
			h.waitIdle(t)
			if tc.pause > 0 && !firstDone.Before(resumed) {
				t.Errorf("the client reading along finished %s after the other one read again (after %s without reading); want it done before", firstDone.Sub(resumed), tc.pause)
			}
			if spill <= 0 || spill > 8<<20+512<<10 {
				t.Errorf("nodecache_fill_spill_bytes while one fill streams: %v, want its window and at most one client's own (0 < n <= 8.5 MiB)", spill)
			}
			if v := metricValue(t, h, "nodecache_fill_spill_bytes"); v != 0 {
				t.Errorf("nodecache_fill_spill_bytes once the clients are done: %v, want 0", v)
			}
			var ranged int
			for _, q := range up.Requests() {
				if q.Method == http.MethodGet && strings.Contains(q.Path, "/blobs/") && q.Range != "" {
					ranged++
				}
			}
			if n := up.Count(http.MethodGet, "/blobs/"); n != 2 || ranged != 1 {
				t.Errorf("upstream blob GETs: %d (%d with Range); want 2: the fill, and the second client's own stream from where the disk filled", n, ranged)
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
