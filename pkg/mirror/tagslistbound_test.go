package mirror_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// countingWriter counts the bytes its Write handed on.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// hugeTagPages is a malicious upstream for team/app: tags/list has pages pages, each a body of
// just under upstream.MaxTagPageBytes (so every page passes the bound of one page) full of
// distinct tags of tagLen characters, each page's Link leading to the next. It counts the
// tags/list requests and the body bytes it wrote.
func hugeTagPages(t *testing.T, pages, tagLen int) (srv *httptest.Server, lists, served *atomic.Int64) {
	t.Helper()
	lists, served = new(atomic.Int64), new(atomic.Int64)
	pageBytes := upstream.MaxTagPageBytes - 1024
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/tags/list") {
			return // the /v2/ ping
		}
		lists.Add(1)
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		if page+1 < pages {
			w.Header().Set("Link", fmt.Sprintf(`</v2/team/app/tags/list?page=%d>; rel="next"`, page+1))
		}
		w.Header().Set("Content-Type", "application/json")
		bw := bufio.NewWriterSize(countingWriter{w, served}, 64<<10)
		n, _ := bw.WriteString(`{"name":"team/app","tags":[`)
		for i := 0; ; i++ {
			tag := fmt.Sprintf("p%03d-%0*d", page, tagLen-5, i)
			if n+len(tag)+3+2 > pageBytes {
				break
			}
			sep := ","
			if i == 0 {
				sep = ""
			}
			m, err := fmt.Fprintf(bw, "%s%q", sep, tag)
			if err != nil {
				return // the client went away
			}
			n += m
		}
		_, _ = bw.WriteString("]}")
		_ = bw.Flush()
	}))
	t.Cleanup(srv.Close)
	return srv, lists, served
}

// TestTagsListBounded: one tags/list request against an upstream of 99 pages of ~4 MiB each
// (about 400 MB in all, which nodecache once fetched and held whole, with a 410 MB answer) ends
// with 502 UNKNOWN naming the bound, after only the upstream requests and bytes the bound
// allows, and the heap grows by well under 256 MiB. Tags of 120 characters hit the bytes bound
// on the third page; tags of 8 to 11 characters hit the tag bound on the first.
//
// Not parallel: the heap is measured for the whole process.
//
//nolint:paralleltest // measures the process's heap: runs before the package's parallel tests
func TestTagsListBounded(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tagLen    int
		wantLists int64
		wantMsg   string
	}{
		{"long tags, bytes bound", 120, 3, fmt.Sprintf("tags of team/app: more than %d bytes of pages", upstream.MaxTagListBytes)},
		{"short tags, tag bound", 8, 1, fmt.Sprintf("tags of team/app: more than %d tags", upstream.MaxTagListTags)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, lists, served := hugeTagPages(t, 99, tc.tagLen)
			u := parseUpstream(t, "upstream.test="+srv.URL)
			h := newHarness(t, mirror.Options{Upstreams: []name.Upstream{u}})

			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			peak := before.HeapInuse
			stop, sampled := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(sampled)
				var m runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					runtime.ReadMemStats(&m)
					peak = max(peak, m.HeapInuse)
				}
			}()
			started := time.Now()
			resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/tags/list"), nil)
			took := time.Since(started)
			close(stop)
			<-sampled
			runtime.ReadMemStats(&after)

			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), `"code":"UNKNOWN"`) ||
				!strings.Contains(string(body), tc.wantMsg) || !strings.Contains(string(body), "tag list larger than nodecache lists") {
				t.Errorf("answer %d %.300s; want 502 UNKNOWN saying %q", resp.StatusCode, body, tc.wantMsg)
			}
			if n := lists.Load(); n != tc.wantLists {
				t.Errorf("%d upstream tags/list requests, want %d", n, tc.wantLists)
			}
			if n, most := served.Load(), tc.wantLists*upstream.MaxTagPageBytes; n > most {
				t.Errorf("upstream wrote %d bytes of tags/list bodies, want at most %d", n, most)
			}
			const bound = 256 << 20
			growth := int64(peak) - int64(before.HeapInuse)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("answered in %s; heap in use grew by %d MiB at most; %d MiB allocated; %d upstream bytes written",
				took.Round(time.Millisecond), growth>>20, allocated>>20, served.Load())
			if growth >= bound || allocated >= bound {
				t.Errorf("heap grew by %d bytes and %d bytes were allocated for one listing; want each under %d", growth, allocated, bound)
			}
		})
	}
}

// listAnswer is what a client got for one tags/list request.
type listAnswer struct {
	status int
	cache  string
	link   string
	tags   []string
	err    error
}

// listOnce asks url for a tag list, from any goroutine.
func listOnce(url string) listAnswer {
	resp, err := http.Get(url)
	if err != nil {
		return listAnswer{err: err}
	}
	defer resp.Body.Close()
	var p tagList
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		return listAnswer{status: resp.StatusCode, err: err}
	}
	return listAnswer{status: resp.StatusCode, cache: resp.Header.Get(mirrorapi.HeaderCache), link: resp.Header.Get("Link"), tags: p.Tags}
}

// TestTagsListShared: concurrent tags/list requests for one repository, without --tag-ttl,
// share one upstream listing (its three pages), whatever n each client asked for; the one
// that started it is a miss, the others coalesced, and every answer is what it would be
// alone.
func TestTagsListShared(t *testing.T) {
	t.Parallel()
	up, tags, _ := pagedUpstream(t, 251)
	var lists atomic.Int64
	release := make(chan struct{})
	var first sync.Once
	up.Wrap(func(next http.Handler) http.Handler {
		paged := pagedAt100(&lists)(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/tags/list") {
				first.Do(func() { <-release }) // the first page waits until every client asked
			}
			paged.ServeHTTP(w, r)
		})
	})
	h := newHarnessFor(t, up)
	const clients = 8
	before := h.registryRequests()
	answers := make(chan listAnswer, clients)
	for i := range clients {
		target := "/v2/upstream.test/team/app/tags/list"
		if i%2 == 1 {
			target += "?n=100"
		}
		go func() { answers <- listOnce(fmtURL(h, target)) }()
	}
	for deadline := time.Now().Add(10 * time.Second); h.registryRequests()-before < clients; {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("only %d of %d requests reached nodecache", h.registryRequests()-before, clients)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(time.Second) // from the handler to the shared fetch: a moment, however loaded the machine
	close(release)
	caches := map[string]int{}
	for range clients {
		a := <-answers
		caches[a.cache]++
		switch {
		case a.err != nil || a.status != http.StatusOK:
			t.Errorf("answer %d: %v", a.status, a.err)
		case a.link == "" && !slices.Equal(a.tags, tags):
			t.Errorf("whole list: %d tags, want %d", len(a.tags), len(tags))
		case a.link != "" && !slices.Equal(a.tags, tags[:100]):
			t.Errorf("n=100: %d tags, want the first 100 of %d", len(a.tags), len(tags))
		}
	}
	if n := lists.Load(); n != 3 {
		t.Errorf("%d upstream tags/list requests for %d concurrent listings of 251 tags paged at 100, want 3", n, clients)
	}
	if caches[mirrorapi.CacheMiss] != 1 || caches[mirrorapi.CacheCoalesced] != clients-1 {
		t.Errorf("%s headers %v; want one miss, the rest coalesced", mirrorapi.HeaderCache, caches)
	}
}

// TestTagsListTTL: with --tag-ttl a listing is kept: requests within the TTL, whole or paged by
// the client, through any routing of the same upstream, cost no upstream request and answer
// exactly as the fetch did (a tag pushed meanwhile is not seen); once the mirror's clock passes
// the TTL the next request lists the upstream again and sees it.
func TestTagsListTTL(t *testing.T) {
	t.Parallel()
	up, tags, lists := pagedUpstream(t, 251)
	var now atomic.Int64 // Unix nanoseconds of the mirror's clock
	now.Store(time.Now().UnixNano())
	h := newHarness(t, mirror.Options{
		Upstreams:       []name.Upstream{upstreamFor(t, "upstream.test", up)},
		DefaultUpstream: "upstream.test",
		TagTTL:          time.Hour,
		Clock:           func() time.Time { return time.Unix(0, now.Load()) },
	})
	whole := fmtURL(h, "/v2/upstream.test/team/app/tags/list")
	expect := func(step string, a listAnswer, cache string, want []string, wantLists int64) {
		t.Helper()
		if a.err != nil || a.status != http.StatusOK || a.cache != cache || !slices.Equal(a.tags, want) {
			t.Errorf("%s: %d %s=%q, %d tags, %v; want 200 %q with %d tags", step, a.status, mirrorapi.HeaderCache, a.cache, len(a.tags), a.err, cache, len(want))
		}
		if n := lists.Load(); n != wantLists {
			t.Errorf("%s: %d upstream tags/list requests in all, want %d", step, n, wantLists)
		}
	}
	expect("first", listOnce(whole), mirrorapi.CacheMiss, tags, 3)
	expect("again", listOnce(whole), mirrorapi.CacheHit, tags, 3)
	expect("through ?ns=", listOnce(fmtURL(h, "/v2/team/app/tags/list?ns=upstream.test")), mirrorapi.CacheHit, tags, 3)

	// Paged by the client from the kept listing: the pages and Links of TestTagsList.
	pages, links := listAll(t, h, "/v2/upstream.test/team/app/tags/list?n=100")
	var got []string
	for _, p := range pages {
		got = append(got, p.Tags...)
	}
	if len(pages) != 3 || len(links) != 2 || !slices.Equal(got, tags) || lists.Load() != 3 {
		t.Errorf("n=100 within the TTL: %d pages, %d links, %d tags, %d upstream requests in all; want 3, 2, %d, 3",
			len(pages), len(links), len(got), lists.Load(), len(tags))
	}

	// A tag pushed upstream is not seen within the TTL, and is once it passed.
	img := mirrortest.Image(t, 256, 1, "linux/amd64")
	up.PushImage(t, "team/app", "v99.new", img)
	now.Add(int64(time.Hour - time.Second))
	expect("just within the TTL", listOnce(whole), mirrorapi.CacheHit, tags, 3)
	now.Add(int64(time.Second))
	moved := append(slices.Clone(tags), "v99.new")
	slices.Sort(moved)
	expect("after the TTL", listOnce(whole), mirrorapi.CacheMiss, moved, 6)
	expect("kept again", listOnce(whole), mirrorapi.CacheHit, moved, 6)
}
