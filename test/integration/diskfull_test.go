package integration

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// rssBound is the peak resident memory (bytes) serve may reach while a fill that does not fit
// on its disk streams through it (issue 23: the chart's agent runs under a 512 MiB limit).
const rssBound = 128 << 20

// TestDiskFullMemoryBounded (issue 23, disk full): serve with its root on an 8 MiB tmpfs answers
// two GETs of a 150 MiB layer, one after the other, each with the whole blob hashing to its
// digest, while its peak resident memory (VmHWM of the process) stays under 128 MiB. Before, the
// part of the blob past the full disk was kept in memory: each GET took serve's peak RSS to about
// the blob's size.
func TestDiskFullMemoryBounded(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		runtimetest.Unavailable(t, "mounting a tmpfs needs root (euid %d; CI runs as root)", os.Geteuid())
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=8m,mode=0700"); err != nil {
		runtimetest.Unavailable(t, "mount a tmpfs on %s (a container without CAP_SYS_ADMIN?): %v", root, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })

	// On disk: distribution's in-memory driver grows a blob by copying it at every write, for
	// minutes at this size.
	upRoot := t.TempDir()
	up := mirrortest.NewRegistryWithConfig(t, func(c *configuration.Configuration) {
		delete(c.Storage, "inmemory")
		c.Storage["filesystem"] = configuration.Parameters{"rootdirectory": upRoot}
	})
	// Random bytes as they are, not gzipped: quick to make.
	data := make([]byte, 150<<20)
	_, _ = rand.Read(data)
	layer := static.NewLayer(data, types.OCILayer)
	ld, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	up.PushImage(t, "team/big", "v1", img)

	srv := servetest.StartServe(t, servetest.ServeOptions{Upstream: up, Root: root})
	t.Logf("serve ready: peak RSS %d MiB", srv.PeakRSS(t)>>20)

	blobURL := fmt.Sprintf("%s/v2/%s/team/big/blobs/%s", srv.URL, up.Addr, ld)
	for i := range 2 {
		start := time.Now()
		resp, err := http.Get(blobURL)
		if err != nil {
			t.Fatalf("GET %d: %v", i+1, err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		_ = resp.Body.Close()
		got := "sha256:" + hex.EncodeToString(h.Sum(nil))
		hwm := srv.PeakRSS(t)
		t.Logf("GET %d: %d, %s=%q, %d bytes in %s; serve's peak RSS %d MiB", i+1, resp.StatusCode,
			mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache), n, time.Since(start).Round(time.Millisecond), hwm>>20)
		if resp.StatusCode != http.StatusOK || err != nil || got != ld.String() {
			t.Fatalf("GET %d: %d, %d bytes hashing to %s (read error %v); want 200 with the whole blob %s", i+1, resp.StatusCode, n, got, err, ld)
		}
		if hwm >= rssBound {
			t.Fatalf("GET %d of a 150 MiB layer on a full 8 MiB root: serve's peak RSS is %d MiB, want under %d MiB", i+1, hwm>>20, rssBound>>20)
		}
	}
	if v, err := servetest.Metric(t.Context(), srv.URL+"/metrics", "nodecache_fill_spill_bytes"); err != nil || v != 0 {
		t.Errorf("nodecache_fill_spill_bytes after the GETs: %v (%v), want 0", v, err)
	}
	if _, err := os.Stat(filepath.Join(root, "docker/registry/v2/blobs/sha256", ld.Hex[:2], ld.Hex, "data")); err == nil {
		t.Errorf("a blob larger than the file system was stored")
	}
}
