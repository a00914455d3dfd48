package mirror_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// pagedUpstream is a registry holding team/app with n tags whose tags/list answers at most 100
// tags per page (n missing or larger counts as 100), as Docker Hub and GHCR page; it counts the
// tags/list requests it answered.
func pagedUpstream(t *testing.T, n int) (*mirrortest.Registry, []string, *atomic.Int64) {
	t.Helper()
	up, img := mirrortest.NewRegistryWithImage(t, "team/app", "seed", 256)
	tags := []string{"seed"}
	for i := range n - 1 {
		tag := fmt.Sprintf("v%d.%d", i/10, i%10)
		if err := remote.Tag(up.Ref(t, "team/app", "x").Context().Tag(tag), img, remote.WithContext(t.Context())); err != nil {
			t.Fatalf("tag %s: %v", tag, err)
		}
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	var lists atomic.Int64
	up.Wrap(pagedAt100(&lists))
	return up, tags, &lists
}

// pagedAt100 is pagedUpstream's middleware: tags/list answers at most 100 tags a page, and
// lists counts its requests.
func pagedAt100(lists *atomic.Int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/tags/list") {
				lists.Add(1)
				q := r.URL.Query()
				if n := q.Get("n"); n == "" || len(n) > 2 {
					q.Set("n", "100")
					r.URL.RawQuery = q.Encode()
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

type tagList struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// listAll follows a tags/list through its Link headers and returns every page.
func listAll(t *testing.T, h *harness, target string) (pages []tagList, links []string) {
	t.Helper()
	for target != "" {
		resp, body := get(t, http.MethodGet, fmtURL(h, target), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", target, resp.StatusCode, body)
		}
		var p tagList
		if err := json.Unmarshal(body, &p); err != nil || p.Tags == nil {
			t.Fatalf("GET %s: body %s is not a tag list with a tags array (%v)", target, body, err)
		}
		pages = append(pages, p)
		target = ""
		if l := resp.Header.Get("Link"); l != "" {
			links = append(links, l)
			u, ok := strings.CutSuffix(strings.TrimPrefix(l, "<"), `>; rel="next"`)
			if !ok {
				t.Fatalf("Link %q is not <URL>; rel=\"next\"", l)
			}
			target = u
		}
		if len(pages) > 10 {
			t.Fatal("more than 10 pages")
		}
	}
	return pages, links
}

// TestTagsList: tags/list per the distribution spec through each routing: every upstream page
// is followed and merged, n and last page the answer with a Link only when more tags follow,
// the Link keeps the client's path and ?ns=, name is the name the client asked for.
func TestTagsList(t *testing.T) {
	t.Parallel()
	up, tags, lists := pagedUpstream(t, 251)
	ported := upstreamFor(t, "ported.test:5005", up)
	h := newHarness(t, mirror.Options{
		Upstreams:       []name.Upstream{upstreamFor(t, "upstream.test", up), ported},
		DefaultUpstream: "upstream.test",
	})
	for _, rt := range []struct{ name, path, query, wantName string }{
		{"ns", "/v2/team/app/tags/list", "ns=upstream.test", "team/app"},
		{"path prefix", "/v2/upstream.test/team/app/tags/list", "", "upstream.test/team/app"},
		{"default upstream", "/v2/team/app/tags/list", "", "team/app"},
		{"ported name", "/v2/ported.test:5005/team/app/tags/list", "", "ported.test:5005/team/app"},
	} {
		with := func(extra string) string {
			q := strings.Trim(rt.query+"&"+extra, "&")
			if q == "" {
				return rt.path
			}
			return rt.path + "?" + q
		}
		// Whole list: three upstream pages merged, one answer without Link.
		before := lists.Load()
		pages, links := listAll(t, h, with(""))
		if len(pages) != 1 || len(links) != 0 || !slices.Equal(pages[0].Tags, tags) || pages[0].Name != rt.wantName {
			t.Errorf("%s: whole list: %d pages, links %q, %d tags (want %d), name %q (want %q)",
				rt.name, len(pages), links, len(pages[0].Tags), len(tags), pages[0].Name, rt.wantName)
		}
		if n := lists.Load() - before; n != 3 {
			t.Errorf("%s: %d upstream tags/list requests for 251 tags paged at 100, want 3", rt.name, n)
		}
		// Paged by the client.
		pages, links = listAll(t, h, with("n=100"))
		var got []string
		for _, p := range pages {
			got = append(got, p.Tags...)
			if p.Name != rt.wantName {
				t.Errorf("%s: page name %q, want %q", rt.name, p.Name, rt.wantName)
			}
		}
		if len(pages) != 3 || !slices.Equal(got, tags) || len(links) != 2 {
			t.Errorf("%s: n=100: %d pages, %d links, %d tags in order %v; want 3 pages, 2 links, %d tags", rt.name, len(pages), len(links), len(got), slices.Equal(got, tags), len(tags))
		}
		for _, l := range links {
			u, _ := url.Parse(strings.TrimSuffix(strings.TrimPrefix(l, "<"), `>; rel="next"`))
			if u.Path != rt.path || u.Query().Get("n") != "100" || u.Query().Get("last") == "" ||
				(rt.query != "" && u.Query().Get("ns") != "upstream.test") {
				t.Errorf("%s: Link %q does not keep the client's path and ?ns=", rt.name, l)
			}
		}
		for _, tc := range []struct {
			name, query string
			status      int
			wantTags    []string
			code        string
		}{
			{"n=0", "n=0", http.StatusOK, []string{}, ""},
			{"n<0", "n=-1", http.StatusBadRequest, nil, "PAGINATION_NUMBER_INVALID"},
			{"empty page after the last tag", "last=zzz", http.StatusOK, []string{}, ""},
			{"exactly the rest", "n=2&last=" + tags[248], http.StatusOK, tags[249:], ""},
			{"n larger than the list", "n=1000", http.StatusOK, tags, ""},
		} {
			resp, body := get(t, http.MethodGet, fmtURL(h, with(tc.query)), nil)
			if resp.StatusCode != tc.status || resp.Header.Get("Link") != "" {
				t.Errorf("%s: %s: %d Link=%q %s; want %d without Link", rt.name, tc.name, resp.StatusCode, resp.Header.Get("Link"), body, tc.status)
				continue
			}
			if tc.code != "" {
				if !strings.Contains(string(body), `"code":"`+tc.code+`"`) {
					t.Errorf("%s: %s: body %s lacks %s", rt.name, tc.name, body, tc.code)
				}
				continue
			}
			var p tagList
			if err := json.Unmarshal(body, &p); err != nil || p.Tags == nil || !slices.Equal(p.Tags, tc.wantTags) || p.Name != rt.wantName {
				t.Errorf("%s: %s: body %s, want name %q and tags %v", rt.name, tc.name, body, rt.wantName, tc.wantTags)
			}
		}
	}
	// An unknown repository is NAME_UNKNOWN naming what the client asked for.
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/nothing/tags/list"), nil)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "NAME_UNKNOWN") || !strings.Contains(string(body), "upstream.test/team/nothing") {
		t.Errorf("unknown repository: %d %s", resp.StatusCode, body)
	}
	// The access log has the statuses sent and no stack trace. A listing, asked upstream each
	// time, is a miss in the header and the log; n=0, answered without asking, and the base
	// check are hits (no upstream contact).
	for _, tc := range []struct{ path, want string }{
		{"/v2/upstream.test/team/app/tags/list", mirrorapi.CacheMiss},
		{"/v2/upstream.test/team/app/tags/list?n=0", mirrorapi.CacheHit},
		{"/v2/", mirrorapi.CacheHit},
	} {
		resp, _ = get(t, http.MethodGet, fmtURL(h, tc.path), nil)
		if c := resp.Header.Get(mirrorapi.HeaderCache); resp.StatusCode != http.StatusOK || c != tc.want {
			t.Errorf("%s: %d %s=%q, want 200 %q", tc.path, resp.StatusCode, mirrorapi.HeaderCache, c, tc.want)
		}
	}
	for _, l := range h.logs.requests(t) {
		want := mirrorapi.CacheMiss
		if strings.Contains(fmt.Sprint(l["query"]), "n=0") {
			want = mirrorapi.CacheHit
		}
		if l["kind"] == "tags" && l["status"] == float64(http.StatusOK) && l["cache"] != want {
			t.Errorf("access log of a 200 tags/list: cache=%v, want %q: %v", l["cache"], want, l)
		}
		if l["kind"] == "tags" && l["status"] == float64(http.StatusOK) && strings.Contains(fmt.Sprint(l["query"]), "n=-1") {
			t.Errorf("access log records 200 for a refused n=-1: %v", l)
		}
	}
}

// TestTagsListTooManyPages: an upstream whose Link never ends is followed 100 pages, then the
// client gets 502 UNKNOWN saying so.
func TestTagsListTooManyPages(t *testing.T) {
	t.Parallel()
	var lists atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/tags/list") {
			return // /v2/ ping
		}
		i := lists.Add(1)
		w.Header().Set("Link", fmt.Sprintf(`</v2/team/app/tags/list?n=1&last=t%05d>; rel="next"`, i))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"name":"team/app","tags":["t%05d"]}`, i)
	}))
	t.Cleanup(srv.Close)
	u := parseUpstream(t, "upstream.test="+srv.URL)
	h := newHarness(t, mirror.Options{Upstreams: []name.Upstream{u}})
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/tags/list"), nil)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), `"code":"UNKNOWN"`) || !strings.Contains(string(body), "more than 100 pages") {
		t.Errorf("endless upstream pages: %d %s; want 502 UNKNOWN saying more than 100 pages", resp.StatusCode, body)
	}
	if n := lists.Load(); n != 100 {
		t.Errorf("%d upstream pages fetched, want 100", n)
	}
	logs := h.logs.requests(t)
	if len(logs) != 1 || logs[0]["status"] != float64(http.StatusBadGateway) {
		t.Errorf("access log: %v; want one line with status 502", logs)
	}
}

// TestTagsListClients: crane ls, skopeo list-tags and skopeo inspect through nodecache against
// an upstream with 251 tags that pages at 100 see all 251.
func TestTagsListClients(t *testing.T) {
	t.Parallel()
	up, tags, _ := pagedUpstream(t, 251)
	h := newHarnessFor(t, up)
	repo := h.host + "/upstream.test/team/app"

	got, err := crane.ListTags(repo, crane.Insecure, crane.WithContext(t.Context()))
	if err != nil || !slices.Equal(got, tags) {
		t.Errorf("crane ls: %d tags, %v; want %d", len(got), err, len(tags))
	}

	skopeo := runtimetest.Find(t, runtimetest.Skopeo)
	out, err := exec.CommandContext(t.Context(), skopeo, "list-tags", "--tls-verify=false", "docker://"+repo).Output()
	var listed struct{ Tags []string }
	if err != nil || json.Unmarshal(out, &listed) != nil || !slices.Equal(listed.Tags, tags) {
		t.Errorf("skopeo list-tags: %d tags, %v: %.300s", len(listed.Tags), err, out)
	}
	out, err = exec.CommandContext(t.Context(), skopeo, "inspect", "--tls-verify=false", "docker://"+repo+":seed").Output()
	var inspected struct{ RepoTags []string }
	if err != nil || json.Unmarshal(out, &inspected) != nil || !slices.Equal(inspected.RepoTags, tags) {
		t.Errorf("skopeo inspect: %d RepoTags, %v: %.300s", len(inspected.RepoTags), err, out)
	}
}

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
