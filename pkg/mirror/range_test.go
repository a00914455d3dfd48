package mirror_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// sentCounter delays every Write by delay and counts the bytes handed to it before writing
// them: once a client holds a byte, the upstream had been asked to send it.
type sentCounter struct {
	http.ResponseWriter
	delay time.Duration
	sent  *atomic.Int64
}

func (w sentCounter) Write(p []byte) (int, error) {
	time.Sleep(w.delay)
	w.sent.Add(int64(len(p)))
	return w.ResponseWriter.Write(p)
}

// TestBoundedRangeOnColdBlob (issue 23, Range): a Range that ends before the blob's last byte
// (bytes=0-1023, as containerd 2.x's parallel chunk requests send it) on a blob still being
// filled gets its 206 headers while the upstream is still sending, and its bytes only once the
// upstream sent the whole blob (the digest is checked on all of it); an upstream that flips byte
// 10 never gives the client a complete 206 (before: 206 with the wrong byte, at once). An
// open-ended Range (bytes=N-, a resume) still streams as the bytes arrive.
func TestBoundedRangeOnColdBlob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, rng string
		flip      bool
		// whole: the client's first byte comes only once the upstream sent the whole blob.
		whole bool
	}{
		{"bounded, correct upstream", "bytes=0-1023", false, true},
		{"bounded, upstream flips byte 10", "bytes=0-1023", true, true},
		{"bounded in the middle, correct upstream", "bytes=1048576-1050623", false, true},
		{"open-ended streams at once", "bytes=100-", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newBlobFixture(t, 3*mirrortest.MiB, mirror.Options{})
			body := f.data
			if tc.flip {
				body = bytes.Clone(f.data)
				body[10] ^= 0xff
			}
			var sent atomic.Int64
			f.up.Intercept(http.MethodGet, "/blobs/", func(_ http.Handler, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Docker-Content-Digest", f.digest)
				w.Header().Set("Content-Type", "application/octet-stream")
				// 32 KiB writes (io.Copy's buffer), 10 ms apart: about a second for the blob.
				http.ServeContent(sentCounter{w, 10 * time.Millisecond, &sent}, r, "", time.Time{}, bytes.NewReader(body))
			})
			req := newRequest(t, http.MethodGet, f.url(), http.Header{"Range": {tc.rng}})
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			atHeaders := sent.Load()
			if resp.StatusCode != http.StatusPartialContent {
				t.Fatalf("%s: %d, want 206", tc.rng, resp.StatusCode)
			}
			if atHeaders >= int64(len(body)) {
				t.Errorf("%s: headers came once the upstream had sent all %d bytes; want them while it is still sending", tc.rng, len(body))
			}
			got := make([]byte, 1)
			_, rerr := io.ReadFull(resp.Body, got)
			atFirst := sent.Load()
			if rerr == nil {
				var rest []byte
				rest, rerr = io.ReadAll(resp.Body)
				got = append(got, rest...)
			} else {
				got = nil
			}
			t.Logf("%s: headers at %d, first byte at %d of %d bytes sent upstream; body %d bytes, %v", tc.rng, atHeaders, atFirst, len(body), len(got), rerr)
			if tc.flip {
				if rerr == nil {
					t.Fatalf("%s from an upstream that flips byte 10: a complete 206 of %d bytes (byte 10 %#x, the blob's %#x); want the response cut",
						tc.rng, len(got), got[min(10, len(got)-1)], f.data[10])
				}
				return
			}
			from, to := rangeOf(t, tc.rng, len(f.data))
			if rerr != nil || !bytes.Equal(got, f.data[from:to+1]) {
				t.Fatalf("%s: %d bytes (read error %v), equal to the blob's: %v", tc.rng, len(got), rerr, bytes.Equal(got, f.data[from:to+1]))
			}
			if want := fmt.Sprintf("bytes %d-%d/%d", from, to, len(f.data)); resp.Header.Get("Content-Range") != want {
				t.Errorf("Content-Range %q, want %q", resp.Header.Get("Content-Range"), want)
			}
			if tc.whole && atFirst < int64(len(body)) {
				t.Errorf("%s: the first byte reached the client when the upstream had sent %d of %d bytes; want it only after the whole blob (verified)", tc.rng, atFirst, len(body))
			}
			if !tc.whole && atFirst >= int64(len(body)) {
				t.Errorf("%s: the first byte waited for the whole blob; an open-ended range streams as it arrives", tc.rng)
			}
		})
	}
}

// TestBoundedRangeWithoutSize (issue 23, never 206 then 200): a bounded Range on a cold blob
// whose size no upstream answer states (HEAD refused, GET chunked) is 503, which sends the client
// to its next host; before, it got 200 with the whole blob where it expected the range.
func TestBoundedRangeWithoutSize(t *testing.T) {
	t.Parallel()
	f := newBlobFixture(t, 1*mirrortest.MiB, mirror.Options{})
	f.withoutLength(5 * time.Millisecond)
	resp, body := get(t, http.MethodGet, f.url(), http.Header{"Range": {"bytes=0-1023"}})
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("bounded Range, no size stated: %d with %d bytes; want 503", resp.StatusCode, len(body))
	}
	f.h.waitIdle(t)
}

// rangeOf is the first and last byte of a one-range Range value on a blob of size bytes.
func rangeOf(t *testing.T, v string, size int) (from, to int) {
	t.Helper()
	var a, b string
	spec := v[len("bytes="):]
	for i := range spec {
		if spec[i] == '-' {
			a, b = spec[:i], spec[i+1:]
			break
		}
	}
	from, err := strconv.Atoi(a)
	if err != nil {
		t.Fatalf("range %q: %v", v, err)
	}
	to = size - 1
	if b != "" {
		if to, err = strconv.Atoi(b); err != nil {
			t.Fatalf("range %q: %v", v, err)
		}
	}
	return from, to
}

// TestRangePastStatedSize (issue 23, Range): an upstream whose blob GET states a short length
// (a body cut with a matching Content-Length; its HEAD has the right one): a Range past that
// length is the fill's error once the digest fails (502), not a 416 built on the upstream's
// wrong size (before: "416 invalid range: failed to overlap", found by the fault suite's short
// bodies); with a correct upstream a Range past the real end is still 416 with its length.
func TestRangePastStatedSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		short bool
		want  int
	}{
		{"short length stated", true, http.StatusBadGateway},
		{"past the real end", false, http.StatusRequestedRangeNotSatisfiable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newBlobFixture(t, 64<<10, mirror.Options{})
			body := f.data
			if tc.short {
				body = f.data[:len(f.data)/2]
			}
			f.up.Intercept(http.MethodGet, "/blobs/", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Docker-Content-Digest", f.digest)
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				_, _ = w.Write(body)
			})
			from := len(f.data) * 3 / 4
			if !tc.short {
				from = len(f.data) + 10
			}
			resp, got := get(t, http.MethodGet, f.url(), http.Header{"Range": {fmt.Sprintf("bytes=%d-", from)}})
			if resp.StatusCode != tc.want {
				t.Errorf("Range from byte %d of %d (upstream states %d): %d %q; want %d", from, len(f.data), len(body), resp.StatusCode, got, tc.want)
			}
			if want := fmt.Sprintf("bytes */%d", len(f.data)); tc.want == http.StatusRequestedRangeNotSatisfiable && resp.Header.Get("Content-Range") != want {
				t.Errorf("Content-Range %q, want %q", resp.Header.Get("Content-Range"), want)
			}
			f.h.waitIdle(t)
		})
	}
}
