package mirror_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// pseudoBlob is a large blob whose bytes are computed from their offset, so an upstream can
// serve any range of it without holding it in memory.
type pseudoBlob struct{ seed uint64 }

const pseudoBlock = 64 << 10

func (b pseudoBlob) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		block := (off + int64(n)) / pseudoBlock
		rng := rand.New(rand.NewPCG(b.seed, uint64(block)))
		buf := make([]byte, pseudoBlock)
		for i := 0; i < pseudoBlock; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8; j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		in := int((off + int64(n)) % pseudoBlock)
		n += copy(p[n:], buf[in:])
	}
	return n, nil
}

// resetWriter passes at most limit body bytes of one response, then cuts the connection: the
// shape of a link that resets long streams.
type resetWriter struct {
	w     http.ResponseWriter
	limit int64
	n     int64
}

func (r *resetWriter) Header() http.Header  { return r.w.Header() }
func (r *resetWriter) WriteHeader(code int) { r.w.WriteHeader(code) }
func (r *resetWriter) Write(p []byte) (int, error) {
	if r.n+int64(len(p)) > r.limit {
		k, _ := r.w.Write(p[:r.limit-r.n])
		r.n += int64(k)
		_ = http.NewResponseController(r.w).Flush()
		panic(http.ErrAbortHandler)
	}
	k, err := r.w.Write(p)
	r.n += int64(k)
	return k, err
}

// TestFillThatProgressesKeepsGoing: a 200 MiB blob through an upstream that resets every
// stream after 8 MiB completes with one client request: the fill resumes with Range for as long
// as attempts add bytes (it gave up after 8 attempts, 64 MiB, before), verifies and stores it.
func TestFillThatProgressesKeepsGoing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: moves 200 MiB through a resetting upstream")
	}
	const size = 200 * mirrortest.MiB
	blob := pseudoBlob{seed: uint64(time.Now().UnixNano())}
	h256 := sha256.New()
	if _, err := io.Copy(h256, io.NewSectionReader(blob, 0, size)); err != nil {
		t.Fatal(err)
	}
	dgst := "sha256:" + hex.EncodeToString(h256.Sum(nil))
	var gets atomic.Int64
	upSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v2/team/big/blobs/"+dgst {
			return // the /v2/ ping
		}
		w.Header().Set("Docker-Content-Digest", dgst)
		w.Header().Set("Content-Type", "application/octet-stream")
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Length", strconv.Itoa(size))
			return
		}
		gets.Add(1)
		http.ServeContent(&resetWriter{w: w, limit: 8 * mirrortest.MiB}, r, "", time.Time{}, io.NewSectionReader(blob, 0, size))
	}))
	t.Cleanup(upSrv.Close)
	up := parseUpstream(t, "upstream.test="+upSrv.URL)
	h := newHarness(t, mirror.Options{Root: t.TempDir(), Upstreams: []regname.Upstream{up}})

	url := fmtURL(h, "/v2/upstream.test/team/big/blobs/"+dgst)
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || n != size || "sha256:"+hex.EncodeToString(got.Sum(nil)) != dgst {
		t.Fatalf("one client GET through a resetting upstream: %d, %d of %d bytes, %v", resp.StatusCode, n, size, err)
	}
	if g := gets.Load(); g < size/(8*mirrortest.MiB) {
		t.Errorf("only %d upstream GETs: the upstream did not reset as the test means it to", g)
	}
	h.waitIdle(t)
	resp, err = http.Head(url)
	if err == nil {
		_ = resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheHit {
		t.Fatalf("after the fill: %v %v %s=%q; want the blob stored (hit)", err, resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache))
	}
	if h.registryRequests() != 2 {
		t.Errorf("%d client requests, want the one GET and the HEAD", h.registryRequests())
	}
}
