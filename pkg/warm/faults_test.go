package warm_test

import (
	"bytes"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/warm"
)

// failGETs answers the first n GETs whose path contains substr with status (n < 0: all of them)
// and passes everything else through. It returns the number of GETs it failed.
func failGETs(substr string, n int, status int, header http.Header) (func(http.Handler) http.Handler, *atomic.Int64) {
	var failed atomic.Int64
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, substr) {
				if n < 0 || failed.Load() < int64(n) {
					failed.Add(1)
					for k, v := range header {
						w.Header()[k] = v
					}
					http.Error(w, `{"errors":[{"code":"UNAVAILABLE","message":"injected"}]}`, status)
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}, &failed
}

// TestRetry5xx: one layer answered with 5xx a few times, then served, ends warm through every
// mirror.
//   - at-upstream: the upstream answers it with 503 twice (whoever retried: warm, or the mirror
//     and then warm): 2 GETs failed of at least 3.
//   - at-mirror: the mirror itself answers it with 500 and then 503: warm retries, with backoff,
//     to success: three GETs from warm, "(3 attempts)" in the progress.
func TestRetry5xx(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		layer int
		// inject fails the target layer's GETs at up or at m and returns the check of what
		// the run then did.
		inject func(up *mirrortest.Registry, m *testMirror, target string) (check func(t *testing.T, progress string))
	}{
		{"at-upstream", 1, func(up *mirrortest.Registry, _ *testMirror, target string) func(*testing.T, string) {
			wrap, failed := failGETs(target, 2, http.StatusServiceUnavailable, nil)
			up.Wrap(wrap)
			return func(t *testing.T, _ string) {
				if failed.Load() != 2 || up.Count("GET", target) < 3 {
					t.Errorf("upstream failed %d GETs and saw %d; want 2 failed of at least 3", failed.Load(), up.Count("GET", target))
				}
			}
		}},
		{"at-mirror", 2, func(_ *mirrortest.Registry, m *testMirror, target string) func(*testing.T, string) {
			wrap1, _ := failGETs(target, 1, http.StatusInternalServerError, nil)
			wrap2, _ := failGETs(target, 1, http.StatusServiceUnavailable, nil)
			m.Wrap(func(h http.Handler) http.Handler { return wrap1(wrap2(h)) })
			return func(t *testing.T, progress string) {
				if n := m.Count("GET", target); n != 3 {
					t.Errorf("warm sent %d GETs for the flaky blob, want 3", n)
				}
				if !strings.Contains(progress, "(3 attempts)") {
					t.Errorf("progress does not show 3 attempts:\n%s", progress)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
				target := pushAmd64(t, up, "warm/flaky", 2)[tc.layer]
				m := start()
				check := tc.inject(up, m, target)
				rep, progress, err := run(t, m, "linux/amd64", nil, upstreamName+"/warm/flaky:v1")
				mustWarm(t, rep, err)
				check(t, progress)
			})
		})
	}
}

// TestRetryAfter429: a 429 with Retry-After: 1 is honoured (not the 20 ms test backoff).
func TestRetryAfter429(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	target := pushAmd64(t, up, "warm/limited", 1)[1]
	m := newNodecache(t, up, warm.RoutingNS)
	wrap, _ := failGETs(target, 1, http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}})
	m.Wrap(wrap)

	start := time.Now()
	rep, _, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.MaxBackoff = 5 * time.Second }, upstreamName+"/warm/limited:v1")
	mustWarm(t, rep, err)
	if took := time.Since(start); took < time.Second {
		t.Errorf("warm retried after %s, before the 1 s Retry-After", took)
	}
	if n := m.Count("GET", target); n != 2 {
		t.Errorf("%d GETs for the limited blob, want 2", n)
	}
}

// TestAlwaysFails: one layer of the second image always fails: that image is not warm and
// named with its failure; the first is warm; the run is not. The failure is injected at the
// mirror (every mirror kind: what warm does with a blob that never comes) and, for the stock
// proxy, at the upstream (the proxy passes the upstream's failure on at once).
func TestAlwaysFails(t *testing.T) {
	t.Parallel()
	type injection struct {
		kind  string
		start func(t *testing.T, up *mirrortest.Registry) *testMirror
		at    string
	}
	var cases []injection
	for _, k := range mirrorKinds {
		cases = append(cases, injection{k.name, k.start, "mirror"})
	}
	cases = append(cases, injection{"stock-proxy", newStockProxy, "upstream"})
	for _, tc := range cases {
		t.Run(tc.kind+"/at-"+tc.at, func(t *testing.T) {
			t.Parallel()
			up := mirrortest.NewRegistry(t)
			pushAmd64(t, up, "warm/good", 1)
			target := pushAmd64(t, up, "warm/bad", 2)[2]
			m := tc.start(t, up)
			wrap, _ := failGETs(target, -1, http.StatusBadGateway, nil)
			if tc.at == "mirror" {
				m.Wrap(wrap)
			} else {
				up.Wrap(wrap)
			}

			rep, progress, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.Retries = 2 },
				upstreamName+"/warm/good:v1", upstreamName+"/warm/bad:v1")
			if err != nil {
				t.Fatal(err)
			}
			if rep.Warm || !rep.Images[0].Warm || rep.Images[1].Warm {
				t.Fatalf("warm: run %v, good %v, bad %v; want false, true, false", rep.Warm, rep.Images[0].Warm, rep.Images[1].Warm)
			}
			b := rep.Images[1]
			if b.BlobsFailed != 1 || b.BlobsFetched != 2 || !strings.Contains(b.Error, target) || rep.BlobsFailed != 1 {
				t.Errorf("bad image report %+v; want 1 failed (%s), 2 fetched", b, target)
			}
			if !strings.Contains(progress, "FAILED") || !strings.Contains(progress, "after 3 attempts") {
				t.Errorf("progress does not show the failure after 3 attempts:\n%s", progress)
			}
			if tc.at == "mirror" {
				if n := m.Count("GET", target); n != 3 {
					t.Errorf("warm sent %d GETs for the failing blob, want 3 (1 + 2 retries)", n)
				}
			}
			var text bytes.Buffer
			_ = rep.WriteText(&text)
			if !strings.Contains(text.String(), "NOT WARM upstream.test/warm/bad:v1") {
				t.Errorf("text report does not name the image not warm:\n%s", text.String())
			}
		})
	}
}

// cutAfter serves the first GET whose path contains substr only up to n bytes and then breaks
// the connection (the handler below still runs to the end, so a mirror fill completes).
func cutAfter(substr string, n int) func(http.Handler) http.Handler {
	var once sync.Once
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cut := false
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, substr) {
				once.Do(func() { cut = true })
			}
			if !cut {
				next.ServeHTTP(w, r)
				return
			}
			cw := &cutWriter{ResponseWriter: w, left: n}
			next.ServeHTTP(cw, r)
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			panic(http.ErrAbortHandler) // closes the connection mid-body
		})
	}
}

type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.left <= 0 {
		return len(p), nil
	}
	k := min(len(p), c.left)
	c.left -= k
	if _, err := c.ResponseWriter.Write(p[:k]); err != nil {
		return 0, err
	}
	return len(p), nil
}

// dropRange removes the Range header, so the mirror answers 200 with the whole blob.
func dropRange(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Range")
		next.ServeHTTP(w, r)
	})
}

// TestBrokenStreamResumed: the mirror's answer for a layer breaks after 20000 bytes; warm asks
// for the rest with Range and completes with a verified digest. When the mirror ignores Range
// (200 with the whole blob), warm starts the hash over and still completes.
func TestBrokenStreamResumed(t *testing.T) {
	t.Parallel()
	for _, ignoreRange := range []bool{false, true} {
		t.Run("ignore-range="+strconv.FormatBool(ignoreRange), func(t *testing.T) {
			t.Parallel()
			eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
				target := pushAmd64(t, up, "warm/cut", 1)[1]
				m := start()
				cut := cutAfter(target, 20000)
				m.Wrap(func(h http.Handler) http.Handler {
					if ignoreRange {
						return cut(dropRange(h))
					}
					return cut(h)
				})

				rep, _, err := run(t, m, "linux/amd64", nil, upstreamName+"/warm/cut:v1")
				mustWarm(t, rep, err)
				var ranges []string
				for _, q := range m.Requests() {
					if strings.Contains(q.Path, target) {
						ranges = append(ranges, q.Range)
					}
				}
				if len(ranges) != 2 || ranges[0] != "" || ranges[1] != "bytes=20000-" {
					t.Errorf("Range headers for the cut blob: %q; want \"\" then \"bytes=20000-\"", ranges)
				}
				if rep.Images[0].Bytes != rep.Bytes || rep.Bytes <= layerBytes {
					t.Errorf("bytes %d (image %d); want the full config and layer", rep.Bytes, rep.Images[0].Bytes)
				}
			})
		})
	}
}

// corrupt flips one byte of every GET body whose path contains substr (same length).
func corrupt(substr string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, substr) {
				next.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(&flipWriter{ResponseWriter: w}, r)
		})
	}
}

type flipWriter struct {
	http.ResponseWriter
	done bool
}

func (f *flipWriter) Write(p []byte) (int, error) {
	if !f.done && len(p) > 0 {
		q := append([]byte(nil), p...)
		q[0] ^= 0xff
		f.done = true
		return f.ResponseWriter.Write(q)
	}
	return f.ResponseWriter.Write(p)
}

// TestDigestMismatch: a body that does not hash to its digest fails the blob at once (no retry)
// and the image is not warm.
func TestDigestMismatch(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	target := pushAmd64(t, up, "warm/corrupt", 1)[1]
	m := newStockProxy(t, up)
	m.Wrap(corrupt(target))

	rep, _, err := run(t, m, "linux/amd64", nil, upstreamName+"/warm/corrupt:v1")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Warm || !strings.Contains(rep.Images[0].Error, "digest mismatch") {
		t.Fatalf("report %+v; want not warm with a digest mismatch", rep.Images[0])
	}
	if n := m.Count("GET", target); n != 1 {
		t.Errorf("%d GETs for the corrupt blob; a mismatch is not retried", n)
	}
}

// slowBlobs passes blob GETs through a writer that sends 1 KiB every 200 ms and stops when the
// request or the test ends.
func slowBlobs(t *testing.T) func(http.Handler) http.Handler {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/") {
				next.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(&dripWriter{ResponseWriter: w, r: r, done: done}, r)
		})
	}
}

type dripWriter struct {
	http.ResponseWriter
	r    *http.Request
	done chan struct{}
}

var errStopped = errors.New("drip stopped")

// waitedAbout3s matches a report that names a wait of 3 to 3.9 s as clitext.Span renders it.
var waitedAbout3s = regexp.MustCompile(`in 3(\.[0-9])?s \(`)

func (d *dripWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		k := min(len(p), 1024)
		select {
		case <-d.r.Context().Done():
			return written, errStopped
		case <-d.done:
			return written, errStopped
		case <-time.After(200 * time.Millisecond):
		}
		n, err := d.ResponseWriter.Write(p[:k])
		written += n
		if err != nil {
			return written, err
		}
		if f, ok := d.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		p = p[k:]
	}
	return written, nil
}

// TestDeadline: a walk slowed to 5 KiB/s is stopped by the deadline (2 s), reported not warm
// with the deadline named.
func TestDeadline(t *testing.T) {
	t.Parallel()
	eachMirror(t, func(t *testing.T, up *mirrortest.Registry, startMirror func() *testMirror) {
		pushAmd64(t, up, "warm/slow", 2)
		m := startMirror()
		up.Wrap(slowBlobs(t))

		start := time.Now()
		rep, _, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.Deadline = 2 * time.Second }, upstreamName+"/warm/slow:v1")
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Warm || rep.Images[0].Warm {
			t.Fatal("a walk stopped by the deadline is warm")
		}
		if !strings.Contains(rep.Error, "--deadline 2s") || !strings.Contains(rep.Images[0].Error, "--deadline 2s") {
			t.Errorf("report error %q, image error %q; want the deadline named", rep.Error, rep.Images[0].Error)
		}
		if took < 2*time.Second || took > 5*time.Second {
			t.Errorf("run took %s; want the 2 s deadline (plus a little)", took)
		}
	})
}

// TestMirrorNotReady: a mirror that refuses connections, and one that accepts and never
// answers, make a run with a 3 s wait give up after at least 3 s and at most 10 s.
func TestMirrorNotReady(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"refused", func(t *testing.T) string { return mirrortest.NewStoppedRegistry(t, "127.0.0.1:0").Addr }},
		{"blackhole", func(t *testing.T) string { return mirrortest.Blackhole(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, err := name.ParseMirror("http://" + tc.addr(t))
			if err != nil {
				t.Fatal(err)
			}
			m := &testMirror{Name: tc.name, URL: u.URL, Routing: warm.RoutingNS}
			start := time.Now()
			rep, _, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.Wait = 3 * time.Second }, upstreamName+"/warm/app:v1")
			took := time.Since(start)
			if !errors.Is(err, warm.ErrMirrorNotReady) {
				t.Fatalf("err %v, want ErrMirrorNotReady", err)
			}
			if took < 3*time.Second || took > 10*time.Second {
				t.Errorf("gave up after %s; want 3 s to 10 s", took)
			}
			// The wait is rendered to 100 ms above a second: 3s, or 3.1s on a loaded machine.
			if rep == nil || rep.Warm || !waitedAbout3s.MatchString(rep.Error) || rep.MirrorWaitSeconds == nil || *rep.MirrorWaitSeconds < 3 {
				t.Errorf("report %+v; want not warm, naming the ~3 s waited", rep)
			}
		})
	}
}

// TestConcurrencyBound: with --concurrency 2, never more than two blob GETs are in flight, even
// across images; with 8 slow blobs, two do run at once.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "warm/a", "v1", mirrortest.Image(t, 4<<10, 3, "linux/amd64"))
	up.PushImage(t, "warm/b", "v1", mirrortest.Image(t, 4<<10, 3, "linux/amd64"))
	m := newNodecache(t, up, warm.RoutingNS)
	var cur, peak atomic.Int64
	m.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.Contains(r.URL.Path, "/blobs/") {
				next.ServeHTTP(w, r)
				return
			}
			n := cur.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(100 * time.Millisecond)
			next.ServeHTTP(w, r)
			cur.Add(-1)
		})
	})
	rep, _, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.Concurrency = 2 },
		upstreamName+"/warm/a:v1", upstreamName+"/warm/b:v1")
	mustWarm(t, rep, err)
	if p := peak.Load(); p != 2 {
		t.Errorf("peak concurrent blob GETs %d, want 2", p)
	}
}

// TestBlobTimeout: a blob whose first answer stalls is cut off by the per-attempt blob timeout
// and fetched by the retry.
func TestBlobTimeout(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	target := pushAmd64(t, up, "warm/stall", 1)[1]
	m := newStockProxy(t, up)
	var once sync.Once
	m.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			stall := false
			if strings.Contains(r.URL.Path, target) {
				once.Do(func() { stall = true })
			}
			if stall {
				<-r.Context().Done() // never answers; warm's timeout ends it
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	start := time.Now()
	rep, progress, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.BlobTimeout = 700 * time.Millisecond }, upstreamName+"/warm/stall:v1")
	mustWarm(t, rep, err)
	if took := time.Since(start); took < 700*time.Millisecond || took > 10*time.Second {
		t.Errorf("took %s; want the 700 ms timeout and a retry", took)
	}
	if n := m.Count("GET", target); n != 2 || !strings.Contains(progress, "(2 attempts)") {
		t.Errorf("%d GETs for the stalled blob, progress:\n%s\nwant 2 attempts", n, progress)
	}
}
