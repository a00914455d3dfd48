package mirror_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// damage is one way a blob's data file is damaged on disk, as the fault campaign of issue 23
// damaged them.
type damage struct {
	name  string
	apply func(t *testing.T, path string)
	// sameSize: the damage keeps the file's size (only hashing sees it).
	sameSize bool
}

var damages = []damage{
	{name: "flipped byte", sameSize: true, apply: func(t *testing.T, path string) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "truncated by 100 bytes", apply: func(t *testing.T, path string) {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, fi.Size()-100); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "emptied", apply: func(t *testing.T, path string) {
		t.Helper()
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
	}},
}

// judged is one GET as its client saw it: cut is true when the body ended before its
// Content-Length (a broken transfer, which a client retries), never a complete answer.
type judged struct {
	status int
	cache  string
	body   []byte
	cut    bool
}

// judgedGet GETs url with the headers hdr on a connection of its own.
func judgedGet(t *testing.T, url string, hdr http.Header) judged {
	t.Helper()
	req := newRequest(t, http.MethodGet, url, hdr)
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return judged{status: resp.StatusCode, cache: resp.Header.Get(mirrorapi.HeaderCache), body: body, cut: err != nil}
}

// neverWrong fails t when a complete 2xx answer's body is not want.
func neverWrong(t *testing.T, what string, got judged, want []byte) {
	t.Helper()
	if got.status/100 == 2 && !got.cut && !bytes.Equal(got.body, want) {
		t.Fatalf("%s: a complete %d (%s) with %d wrong bytes (want %d bytes of the blob)", what, got.status, got.cache, len(got.body), len(want))
	}
}

// fileDigest is the sha256 of the file at path.
func fileDigest(t *testing.T, path string) v1.Hash {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := v1.SHA256(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// atRest is an upstream with team/app:v1 (one layer) and a nodecache over a filesystem root
// that pulled it (manifest, config and layer stored).
type atRest struct {
	up    *mirrortest.Registry
	img   v1.Image
	root  string
	h     *harness
	layer v1.Hash
	data  []byte
	opts  mirror.Options
}

func newAtRest(t *testing.T, layerBytes int64, opts mirror.Options) *atRest {
	t.Helper()
	up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", layerBytes)
	a := &atRest{up: up, img: img, root: t.TempDir()}
	a.layer, a.data = mirrortest.LayerBlob(t, img, 0)
	opts.Root, opts.Upstreams = a.root, []name.Upstream{upstreamFor(t, "upstream.test", up)}
	if opts.ScrubInterval == 0 {
		opts.ScrubInterval = mirror.ScrubOff // what serves catch, not the scrubber (TestScrubber)
	}
	a.opts = opts
	a.h = newHarness(t, opts)
	a.h.run(t)
	pullImage(t, a.h.host+"/upstream.test/team/app:v1")
	a.h.waitIdle(t)
	return a
}

// restart stops the nodecache cleanly (the index file is written) and starts another on the
// same root, running, its index loaded.
func (a *atRest) restart(t *testing.T) {
	t.Helper()
	a.h.close(t)
	a.h = newHarness(t, a.opts)
	a.h.runReady(t)
}

func (a *atRest) layerPath() string { return blobDataPath(a.root, a.layer) }

func (a *atRest) layerURL() string {
	return fmtURL(a.h, "/v2/upstream.test/team/app/blobs/"+a.layer.String())
}

// TestDamagedBlobIsNeverServed (issue 23, measured defect: a blob damaged on disk was served as
// 200 hit forever: a flipped byte with the wrong sha256, a file truncated by 100 bytes with the
// short body, an emptied file with 0 bytes): for each damage of a cached layer, in the process
// that stored it and after a restart, the client never gets a complete 2xx with wrong or short
// bytes; a damaged size is answered as a miss with the right bytes at once, a flipped byte cuts
// the first serve (hashed) before its last byte; the next request gets the right bytes, the blob
// is stored again, and nodecache_cache_corrupt_total{found_by="serve"} counts it.
func TestDamagedBlobIsNeverServed(t *testing.T) {
	t.Parallel()
	for _, dmg := range damages {
		for _, restart := range []bool{false, true} {
			label := dmg.name + ", same process"
			if restart {
				label = dmg.name + ", after a restart"
			}
			t.Run(label, func(t *testing.T) {
				t.Parallel()
				a := newAtRest(t, 256<<10, mirror.Options{})
				if restart {
					a.restart(t)
				} else {
					// A write moves the file's mtime, which the kernel keeps at the coarse
					// clock's resolution (a few ms): let it move past the commit's.
					time.Sleep(20 * time.Millisecond)
				}
				dmg.apply(t, a.layerPath())

				first := judgedGet(t, a.layerURL(), nil)
				neverWrong(t, "first GET of the damaged blob", first, a.data)
				if dmg.sameSize {
					if !first.cut {
						t.Fatalf("first GET: %d %s with %d bytes, not cut; want the transfer cut before its last byte", first.status, first.cache, len(first.body))
					}
				} else if first.status != http.StatusOK || first.cut || first.cache != mirrorapi.CacheMiss {
					t.Fatalf("first GET: %d %s (cut %v); want the right bytes as a miss at once", first.status, first.cache, first.cut)
				}
				next := judgedGet(t, a.layerURL(), nil)
				if next.status != http.StatusOK || next.cut || !bytes.Equal(next.body, a.data) {
					t.Fatalf("next GET: %d %s (cut %v, %d bytes); want 200 with the right bytes", next.status, next.cache, next.cut, len(next.body))
				}
				a.h.waitIdle(t)
				if got := fileDigest(t, a.layerPath()); got != a.layer {
					t.Errorf("stored again as %s, want %s", got, a.layer)
				}
				if n := metricValue(t, a.h, `nodecache_cache_corrupt_total{found_by="serve"}`); n != 1 {
					t.Errorf(`nodecache_cache_corrupt_total{found_by="serve"} = %v, want 1`, n)
				}
				if again := judgedGet(t, a.layerURL(), nil); again.status != http.StatusOK || again.cache != mirrorapi.CacheHit || !bytes.Equal(again.body, a.data) {
					t.Errorf("GET once stored again: %d %s, %d bytes; want the right bytes as a hit", again.status, again.cache, len(again.body))
				}
			})
		}
	}
}

// TestDamagedBlobUpstreamDown: a truncated blob whose upstream is down is answered 503
// UNAVAILABLE, never with its short body; once the upstream is back, the right bytes.
func TestDamagedBlobUpstreamDown(t *testing.T) {
	t.Parallel()
	a := newAtRest(t, 256<<10, mirror.Options{})
	damages[1].apply(t, a.layerPath())
	a.up.Stop()
	got := judgedGet(t, a.layerURL(), nil)
	neverWrong(t, "GET with the upstream down", got, a.data)
	if got.status != http.StatusServiceUnavailable {
		t.Fatalf("GET with the upstream down: %d %s, %d bytes; want 503", got.status, got.cache, len(got.body))
	}
	a.up.Start(t)
	if got := judgedGet(t, a.layerURL(), nil); got.status != http.StatusOK || got.cut || !bytes.Equal(got.body, a.data) {
		t.Fatalf("GET with the upstream back: %d %s (cut %v, %d bytes); want the right bytes", got.status, got.cache, got.cut, len(got.body))
	}
}

// TestDamagedBlobAfterIndexRebuild: with the index file deleted, the rebuilt index takes a
// layer's size from the manifest that references it, never from its data file: a truncated
// layer is still answered as a miss with the right bytes at once. A blob no manifest references
// (fetched alone) has only its file's size after a rebuild: its first serve is hashed, and cut.
func TestDamagedBlobAfterIndexRebuild(t *testing.T) {
	t.Parallel()
	a := newAtRest(t, 256<<10, mirror.Options{})
	other := mirrortest.Image(t, 128<<10, 1, "linux/amd64")
	a.up.PushImage(t, "team/other", "v1", other)
	lone, loneData := mirrortest.LayerBlob(t, other, 0)
	loneURL := func() string { return fmtURL(a.h, "/v2/upstream.test/team/other/blobs/"+lone.String()) }
	if got := judgedGet(t, loneURL(), nil); got.status != http.StatusOK || !bytes.Equal(got.body, loneData) {
		t.Fatalf("GET of a blob alone: %d", got.status)
	}
	a.h.waitIdle(t)
	a.h.close(t)
	if err := os.Remove(filepath.Join(a.root, "nodecache", "index.json")); err != nil {
		t.Fatal(err)
	}
	damages[1].apply(t, a.layerPath())
	damages[1].apply(t, blobDataPath(a.root, lone))
	a.h = newHarness(t, a.opts)
	a.h.runReady(t)

	got := judgedGet(t, a.layerURL(), nil)
	neverWrong(t, "GET of the truncated layer", got, a.data)
	if got.status != http.StatusOK || got.cut || got.cache != mirrorapi.CacheMiss {
		t.Fatalf("GET of the truncated layer: %d %s (cut %v); want the right bytes as a miss", got.status, got.cache, got.cut)
	}
	// A HEAD reads no body that could be cut: its Content-Length must not be the damaged file's
	// (the fault suite found 13597 for a 13697-byte blob). It hashes the data first; the damage
	// is evicted and the HEAD answered from the upstream.
	head, _ := get(t, http.MethodHead, loneURL(), nil)
	if head.StatusCode != http.StatusOK || head.ContentLength != int64(len(loneData)) {
		t.Fatalf("HEAD of the truncated blob no manifest references: %d, Content-Length %d; want 200 and %d",
			head.StatusCode, head.ContentLength, len(loneData))
	}
	got = judgedGet(t, loneURL(), nil)
	neverWrong(t, "GET of the blob no manifest references after the HEAD", got, loneData)
	if got.status != http.StatusOK || got.cut {
		t.Fatalf("GET after the HEAD: %d %s (cut %v); want the right bytes", got.status, got.cache, got.cut)
	}
	a.h.waitIdle(t) // the refetched blob is stored once its fill is done
	damages[1].apply(t, blobDataPath(a.root, lone))
	a.h.close(t)
	if err := os.Remove(filepath.Join(a.root, "nodecache", "index.json")); err != nil {
		t.Fatal(err)
	}
	a.h = newHarness(t, a.opts)
	a.h.runReady(t)
	got = judgedGet(t, loneURL(), nil)
	neverWrong(t, "GET of the truncated blob no manifest references", got, loneData)
	if !got.cut {
		t.Fatalf("GET of the truncated blob no manifest references: %d %s, %d bytes, not cut", got.status, got.cache, len(got.body))
	}
	if got := judgedGet(t, loneURL(), nil); got.status != http.StatusOK || got.cut || !bytes.Equal(got.body, loneData) {
		t.Fatalf("next GET of the blob no manifest references: %d %s (cut %v)", got.status, got.cache, got.cut)
	}
}

// TestFirstServeRangeIsHashed: after a restart, a Range on a blob not hashed yet gets its bytes
// (the bytes before and after the range are hashed too), and a byte flipped after the range
// cuts the range before its last byte: the client gets the whole range only from data that
// matches. Repeated serves of a hashed blob go through sendfile again (TestWarmBlobReachesSendfile).
func TestFirstServeRangeIsHashed(t *testing.T) {
	t.Parallel()
	a := newAtRest(t, 512<<10, mirror.Options{})
	a.restart(t)
	rng := http.Header{"Range": {"bytes=1000-1999"}}
	got := judgedGet(t, a.layerURL(), rng)
	if got.status != http.StatusPartialContent || got.cut || !bytes.Equal(got.body, a.data[1000:2000]) {
		t.Fatalf("first Range after a restart: %d (cut %v, %d bytes); want 206 with the range", got.status, got.cut, len(got.body))
	}

	srv, cl := fileCountingServer(t, a.h.m)
	if got := judgedGet(t, srv.URL+"/v2/upstream.test/team/app/blobs/"+a.layer.String(), nil); got.status != http.StatusOK || !bytes.Equal(got.body, a.data) {
		t.Fatalf("GET of the hashed blob: %d, %d bytes", got.status, len(got.body))
	}
	if _, fromFile, _ := cl.counts(t); fromFile < int64(len(a.data))-512 {
		t.Errorf("%d of %d bytes of a blob hashed by an earlier serve went through sendfile", fromFile, len(a.data))
	}

	a.restart(t)
	damages[0].apply(t, a.layerPath()) // the middle byte, after the range
	got = judgedGet(t, a.layerURL(), rng)
	neverWrong(t, "Range of a blob damaged after the range", got, a.data[1000:2000])
	// Cut before its last byte; a range this small is still in the server's buffers then, so
	// nothing reaches the client, whose transport sends the request again: a miss, refetched.
	if !got.cut && (got.status != http.StatusPartialContent || got.cache != mirrorapi.CacheMiss) {
		t.Fatalf("Range of a blob damaged after the range: %d %s (cut %v, %d bytes); want it cut, or refetched", got.status, got.cache, got.cut, len(got.body))
	}
	if n := metricValue(t, a.h, `nodecache_cache_corrupt_total{found_by="serve"}`); n != 1 {
		t.Errorf(`nodecache_cache_corrupt_total{found_by="serve"} = %v, want 1`, n)
	}
	if got := judgedGet(t, a.layerURL(), rng); got.status != http.StatusPartialContent || got.cut || !bytes.Equal(got.body, a.data[1000:2000]) {
		t.Fatalf("Range once evicted: %d %s (cut %v); want the range, refetched", got.status, got.cache, got.cut)
	}
}
