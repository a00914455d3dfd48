package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// fullDir mounts a 64 KiB tmpfs on a fresh directory and fills it: every write there fails with
// ENOSPC. It needs root (CI runs as root); without it the test is skipped, saying why.
func fullDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (CI runs as root)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s here (a container without CAP_SYS_ADMIN?): %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 1<<20), 0o600)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling the tmpfs: %v, want ENOSPC", err)
	}
	return dir
}

// slowBlobServer serves each of blobs (by digest) as repository team/app's blob in 64 KiB writes
// every delay (Range honoured).
func slowBlobServer(t *testing.T, delay time.Duration, blobs ...[]byte) *httptest.Server {
	t.Helper()
	byPath := map[string][]byte{}
	for _, b := range blobs {
		byPath["/v2/team/app/blobs/"+digest.FromBytes(b).String()] = b
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := byPath[r.URL.Path]
		if r.URL.Path == "/v2/" {
			return
		}
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
		http.ServeContent(pacedWriter{w, delay}, r, "", time.Time{}, bytes.NewReader(b))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// pacedWriter writes at most 64 KiB at a time, sleeping delay before each write.
type pacedWriter struct {
	http.ResponseWriter
	delay time.Duration
}

func (w pacedWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		time.Sleep(w.delay)
		m, err := w.ResponseWriter.Write(p[:min(len(p), 64<<10)])
		n += m
		if err != nil {
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}

// TestSpillMemoryBounded (issue 23, disk full): fills that cannot be stored (the staging
// directory is full) share one memory budget (Options.SpillMemory, here one 1 MiB window). While
// one fill holds it: a bounded Range on that fill whose bytes its window will not hold when the
// blob is verified is ErrRangeNotKept, one on its last bytes is a 206 with them; a second fill
// stops, and its client is refused with ErrSpillMemory before any header (the mirror's 503,
// which sends containerd to its next host). Once the first fill is over, the budget is back
// (nodecache_fill_spill_bytes 0) and the second blob streams through whole.
func TestSpillMemoryBounded(t *testing.T) {
	t.Parallel()
	first, second := make([]byte, 4<<20), make([]byte, 2<<20)
	for i := range first {
		first[i] = byte(i * 7)
	}
	for i := range second {
		second[i] = byte(i * 13)
	}
	srv := slowBlobServer(t, 20*time.Millisecond, first, second) // the first: about 1.3 s
	f := testFetcher(t, srv, Options{StagingDir: fullDir(t), SpillWindow: 1 << 20, SpillMemory: 1 << 20})
	r := f.Remote("upstream.test")
	commit := func(_ context.Context, _ string, _ v1.Descriptor) error { return errors.New("nothing may be stored") }
	desc := func(b []byte) v1.Descriptor {
		return v1.Descriptor{Digest: digest.FromBytes(b), Size: int64(len(b)), MediaType: "application/octet-stream"}
	}
	serve := func(fl *Fill, rng string) (*httptest.ResponseRecorder, error) {
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", "application/octet-stream")
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		_, err := fl.Serve(t.Context(), rec, req)
		return rec, err
	}

	fl, _, err := r.StartFill(t.Context(), "team/app", desc(first), commit)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(f.metrics.spillBytes) != 1<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("nodecache_fill_spill_bytes %v, want the first fill's window (1 MiB)", testutil.ToFloat64(f.metrics.spillBytes))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rec, err := serve(fl, "bytes=0-1023"); !errors.Is(err, ErrRangeNotKept) || rec.Flushed || rec.Body.Len() > 0 {
		t.Errorf("bounded Range on bytes the window will not hold: %v, headers sent %v, %d bytes; want ErrRangeNotKept before the headers", err, rec.Flushed, rec.Body.Len())
	}
	from, to := len(first)-2048, len(first)-1025
	tail := make(chan error, 1)
	go func() { // answered once the first blob is verified
		rec, err := serve(fl, fmt.Sprintf("bytes=%d-%d", from, to))
		if err == nil && (rec.Code != http.StatusPartialContent || !bytes.Equal(rec.Body.Bytes(), first[from:to+1])) {
			err = fmt.Errorf("%d with %d bytes", rec.Code, rec.Body.Len())
		}
		tail <- err
	}()

	fl2, _, err := r.StartFill(t.Context(), "team/app", desc(second), commit)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := serve(fl2, ""); !errors.Is(err, ErrSpillMemory) || rec.Flushed || rec.Body.Len() > 0 {
		t.Errorf("a second fill that cannot be stored, with the budget taken: %v, headers sent %v, %d bytes; want ErrSpillMemory before the headers", err, rec.Flushed, rec.Body.Len())
	}
	if err := <-tail; err != nil {
		t.Errorf("bounded Range on the last bytes: %v; want 206 with them", err)
	}
	if err := f.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(f.metrics.spillBytes); v != 0 {
		t.Errorf("nodecache_fill_spill_bytes once the fills are over: %v, want 0", v)
	}

	fl2, _, err = r.StartFill(t.Context(), "team/app", desc(second), commit)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := serve(fl2, "")
	if err != nil || rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), second) ||
		rec.Header().Get("Content-Length") != strconv.Itoa(len(second)) {
		t.Errorf("the second blob once the budget is free: %d, %d of %d bytes, %v; want all of it", rec.Code, rec.Body.Len(), len(second), err)
	}
	if err := f.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(f.metrics.spillBytes); v != 0 {
		t.Errorf("nodecache_fill_spill_bytes at the end: %v, want 0", v)
	}
}

// lateHeaders is a ResponseWriter whose WriteHeader returns only once wait does: a request
// handler that a loaded machine schedules late, after the fill it joined went on.
type lateHeaders struct {
	*httptest.ResponseRecorder
	wait func()
}

func (w lateHeaders) WriteHeader(code int) {
	w.wait()
	w.ResponseRecorder.WriteHeader(code)
}

// TestSpillWaitsForReaderBeforeFirstRead (issue 23, disk full): a GET attached to a fill that
// cannot be stored is waited for from its attach, not from its first Read. Before, a reader
// whose first Read came after the fill had gone a whole window past where the disk filled (a
// loaded machine: TestDiskFullLateAndSlowClients failed so in CI) did not count: the fill
// forgot the bytes it needed without waiting, and the reader took a second upstream GET of its
// own. Here the reader's headers are held until the fill is 2 MiB in (a 1 MiB window; 1 s at
// most, under the 3 s the fill waits for a reader that does not move): the fill must stop at
// its window, and the blob come from its one upstream GET.
func TestSpillWaitsForReaderBeforeFirstRead(t *testing.T) {
	t.Parallel()
	blob := make([]byte, 4<<20)
	for i := range blob {
		blob[i] = byte(i * 11)
	}
	var gets atomic.Int32
	inner := slowBlobServer(t, 0, blob)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			gets.Add(1)
		}
		inner.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f := testFetcher(t, srv, Options{StagingDir: fullDir(t), SpillWindow: 1 << 20, SpillMemory: 4 << 20})
	r := f.Remote("upstream.test")
	commit := func(_ context.Context, _ string, _ v1.Descriptor) error { return errors.New("nothing may be stored") }
	fl, _, err := r.StartFill(t.Context(), "team/app", v1.Descriptor{Digest: digest.FromBytes(blob), Size: int64(len(blob)), MediaType: "application/octet-stream"}, commit)
	if err != nil {
		t.Fatal(err)
	}
	var ahead int64 // how far the fill got while the reader's headers were held (bytes)
	rec := lateHeaders{httptest.NewRecorder(), func() {
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			fl.mu.Lock()
			ahead = fl.written
			fl.mu.Unlock()
			if ahead >= 2<<20 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}}
	rec.Header().Set("Content-Type", "application/octet-stream")
	if _, err := fl.Serve(t.Context(), rec, httptest.NewRequest(http.MethodGet, "/", nil)); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if !bytes.Equal(rec.Body.Bytes(), blob) {
		t.Errorf("body: %d of %d bytes (equal: %v); want the whole blob", rec.Body.Len(), len(blob), bytes.Equal(rec.Body.Bytes(), blob))
	}
	if err := f.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := gets.Load(); n != 1 || ahead > 1<<20+fillChunk {
		t.Errorf("upstream blob GETs: %d, fill at byte %d before the reader's first Read; want 1, the fill held at its window (1 MiB and a chunk)", n, ahead)
	}
}
