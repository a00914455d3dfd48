package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// faultPlan is the fault a round injects into the upstream requests nodecache makes.
type faultPlan struct {
	kind kind
	// p is the share of the requests the kind applies to that get the fault.
	p float64
	// toxic (black holes): every connection black-holed by toxiproxy; else GETs stall in the
	// middle of their body.
	toxic bool
	// free (full disk): bytes free on serve's root; an upstream GET of a larger blob is a fill
	// the disk has no room for.
	free int64
	// chunkDelay (SIGKILL): the pause after every 32 KiB of a blob body, so fills are in flight
	// when serve is killed.
	chunkDelay time.Duration
}

// front is a case's upstream as nodecache sees it: an HTTP server in front of distribution's
// registry (mirrortest, in memory) that injects the round's fault into nodecache's requests and
// counts every fault it injects. Throttled and black-holed requests reach the registry through
// toxiproxy (in-process), whose toxics shape that hop; the front streams what comes through, so
// nodecache sees a slow or silent upstream. A reset or a FIN is made by the front on nodecache's
// own connection (through toxiproxy a reset would arrive as a FIN), at an offset it chooses.
// Requests of anyone else (the image pushes) always reach the registry untouched.
type front struct {
	reg *mirrortest.Registry
	// URL is the front's address, serve's --upstream.
	URL string

	srv    *http.Server
	direct *httputil.ReverseProxy // to the registry
	shaped *httputil.ReverseProxy // to the registry through toxiproxy
	proxy  *toxiproxy.Proxy
	client *http.Client // the front's own requests to the registry (body faults)

	mu     sync.Mutex
	rng    *rand.Rand
	plan   *faultPlan
	counts map[kind]int
	sizes  map[string]int64 // blob digest → size
	// own are blobs the front serves itself, from memory, by digest (a blob too large for the
	// registry's in-memory storage, which copies a blob as it grows).
	own     map[string][]byte
	release chan struct{} // closed when the round's faults end: stalled answers return
	// inBody counts blob bodies being written (SIGKILL waits for one); bodyBytes the bytes
	// written of them.
	inBody, bodyBytes atomic.Int64
}

// newFront starts a registry and a front for it, with a toxiproxy proxy of tsrv named name.
func newFront(t *testing.T, tsrv *toxiproxy.ApiServer, name string, seed uint64) *front {
	t.Helper()
	reg := mirrortest.NewRegistry(t)
	proxy := toxiproxy.NewProxy(tsrv, name, "127.0.0.1:0", reg.Addr)
	if err := proxy.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(proxy.Stop)
	f := &front{
		reg: reg, proxy: proxy,
		rng:     rand.New(rand.NewPCG(seed, 0x66726f6e74)),
		counts:  map[kind]int{},
		sizes:   map[string]int64{},
		own:     map[string][]byte{},
		release: make(chan struct{}),
		client:  &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64}},
	}
	quiet := log.New(io.Discard, "", 0)
	f.direct = reverseProxy(reg.URL, quiet)
	f.shaped = reverseProxy(&url.URL{Scheme: "http", Host: proxy.Listen}, quiet)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.URL = "http://" + ln.Addr().String()
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second, ErrorLog: quiet}
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(func() {
		f.clear()
		_ = f.srv.Close()
		f.client.CloseIdleConnections()
	})
	return f
}

func reverseProxy(target *url.URL, quiet *log.Logger) *httputil.ReverseProxy {
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	rp.FlushInterval = -1
	rp.ErrorLog = quiet
	return rp
}

// learn records the sizes of objs' blobs (the full-disk count needs them).
func (f *front) learn(objs []*object) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range objs {
		if !o.manifest {
			f.sizes[o.digest.String()] = o.size()
		}
	}
}

// serveBlob makes the front itself answer GET and HEAD of blob o (in any repository).
func (f *front) serveBlob(o *object) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sizes[o.digest.String()] = o.size()
	f.own[o.digest.String()] = o.data
}

// set starts injecting p.
func (f *front) set(t *testing.T, p *faultPlan, toxics ...string) {
	t.Helper()
	for _, tx := range toxics {
		if _, err := f.proxy.Toxics.AddToxicJson(strings.NewReader(tx)); err != nil {
			t.Fatalf("toxiproxy toxic %s: %v", tx, err)
		}
	}
	f.mu.Lock()
	f.plan = p
	f.mu.Unlock()
}

// clear ends the round's faults: no plan, no toxics, stalled answers released.
func (f *front) clear() {
	f.mu.Lock()
	f.plan = nil
	close(f.release)
	f.release = make(chan struct{})
	f.mu.Unlock()
	f.proxy.Toxics.ResetToxics(context.Background())
}

// faults returns how many faults of k the front injected so far.
func (f *front) faults(k kind) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[k]
}

func (f *front) count(k kind) {
	f.mu.Lock()
	f.counts[k]++
	f.mu.Unlock()
}

// coin reports true with probability p.
func (f *front) coin(p float64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < p
}

// intN is a random int in [0, n).
func (f *front) intN(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.IntN(n)
}

func (f *front) current() (*faultPlan, chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.plan, f.release
}

// fromServe: nodecache's requests carry its User-Agent (nodecache-serve/<version>); the pushes
// of the test carry go-containerregistry's.
func fromServe(req *http.Request) bool { return strings.HasPrefix(req.UserAgent(), "nodecache") }

// ServeHTTP injects the round's fault into req when nodecache sent it and the fault applies to
// it, and hands it on to the registry otherwise.
func (f *front) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	p, release := f.current()
	if p == nil || !fromServe(req) {
		f.pass(w, req)
		return
	}
	get := req.Method == http.MethodGet
	blob := strings.Contains(req.URL.Path, "/blobs/")
	ranged := req.Header.Get("Range") != ""
	switch {
	case p.kind == kindThrottle, p.kind == kindBlackhole && p.toxic:
		f.count(p.kind)
		f.shaped.ServeHTTP(w, req)
	case p.kind == kindBlackhole && get && blob && f.coin(p.p):
		f.stall(w, req, release)
	case (p.kind == kind5xx || p.kind == kind429) && f.coin(p.p):
		f.count(p.kind)
		writeStatus(w, p.kind, f.intN(4))
	case (p.kind == kindReset || p.kind == kindFIN) && f.coin(p.p):
		f.cut(w, req, p.kind, -1)
	case p.kind == kindCorrupt && get && f.coin(p.p):
		f.corrupt(w, req)
	case p.kind == kindShort && get && !ranged && f.coin(p.p):
		f.short(w, req)
	case p.kind == kindBad206 && get && blob && !ranged:
		f.cut(w, req, kindFIN, 1) // a resume must follow, with Range
	case p.kind == kindBad206 && get && blob && f.coin(p.p):
		f.bad206(w, req)
	case p.kind == kindSIGKILL && get && blob:
		f.slow(w, req, p.chunkDelay, release)
	default:
		if p.kind == kindDiskFull && get && blob && !ranged && f.blobSize(req) > p.free {
			f.count(kindDiskFull)
		}
		f.pass(w, req)
	}
}

// pass hands req to the registry, or answers it from the blobs the front serves itself.
func (f *front) pass(w http.ResponseWriter, req *http.Request) {
	i := strings.LastIndex(req.URL.Path, "/")
	f.mu.Lock()
	data, own := f.own[req.URL.Path[i+1:]]
	f.mu.Unlock()
	if !own || !strings.Contains(req.URL.Path, "/blobs/") {
		f.direct.ServeHTTP(w, req)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", req.URL.Path[i+1:])
	http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(data))
}

func (f *front) blobSize(req *http.Request) int64 {
	i := strings.LastIndex(req.URL.Path, "/")
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sizes[req.URL.Path[i+1:]]
}

// recorded is the registry's own answer to a request, whole.
type recorded struct {
	status int
	header http.Header
	body   []byte
}

func (r *recorded) ok() bool { return r.status >= 200 && r.status < 300 }

// fetch asks the registry itself what it answers to req (with Range as req had it unless
// noRange).
func (f *front) fetch(req *http.Request, noRange bool) (*recorded, error) {
	out, err := http.NewRequestWithContext(req.Context(), req.Method, f.reg.URL.String()+req.URL.RequestURI(), nil)
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Accept", "Range"} {
		if h == "Range" && noRange {
			continue
		}
		if v := req.Header.Values(h); len(v) > 0 {
			out.Header[h] = v
		}
	}
	resp, err := f.client.Do(out)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	h := resp.Header.Clone()
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	return &recorded{status: resp.StatusCode, header: h, body: b}, nil
}

// writeRecorded answers rec as it is (the registry's own answer, no fault: a 404, say), or a
// plain 502 when the registry could not be asked.
func writeRecorded(w http.ResponseWriter, rec *recorded, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rec.body)))
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body)
}

// writeStatus answers an upstream failure of kind k: 500, 502, 503 or 504 (pick) for 5xx, 429
// with Retry-After: 1 for 429; with an OCI error body.
func writeStatus(w http.ResponseWriter, k kind, pick int) {
	code, status := "UNAVAILABLE", []int{500, 502, 503, 504}[pick]
	if k == kind429 {
		code, status = "TOOMANYREQUESTS", http.StatusTooManyRequests
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"errors":[{"code":%q,"message":"fault injected by the fault suite"}]}`, code)
}

// cut answers req with the registry's answer cut at a random offset of its body (from minOff;
// -1: sometimes before any byte of the answer, and always for a HEAD, whose answer has no
// body), announcing the whole length: by a TCP reset (k == kindReset) or a FIN.
func (f *front) cut(w http.ResponseWriter, req *http.Request, k kind, minOff int) {
	rec, err := f.fetch(req, false)
	if err != nil || !rec.ok() || (minOff > 0 && len(rec.body) <= minOff) {
		writeRecorded(w, rec, err)
		return
	}
	f.count(k)
	off := -1
	if req.Method != http.MethodHead && len(rec.body) > 0 && (minOff >= 0 || f.intN(8) > 0) {
		off = max(0, minOff) + f.intN(len(rec.body)-max(0, minOff))
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if off >= 0 {
		writeHead(brw.Writer, rec.status, rec.header, len(rec.body))
		_, _ = brw.Write(rec.body[:off])
		_ = brw.Flush()
	}
	if tc, ok := conn.(*net.TCPConn); ok && k == kindReset {
		time.Sleep(5 * time.Millisecond) // let what was written reach nodecache first
		_ = tc.SetLinger(0)              // Close sends a reset
	}
	_ = conn.Close()
}

// writeHead writes an HTTP/1.1 status line and header with Content-Length n.
func writeHead(w *bufio.Writer, status int, h http.Header, n int) {
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	h = h.Clone()
	h.Set("Content-Length", strconv.Itoa(n))
	h.Set("Connection", "close")
	_ = h.Write(w)
	_, _ = w.WriteString("\r\n")
}

// corrupt answers req with the registry's answer, its length right and its bytes not: one to
// eight bytes flipped, or a span replaced by other bytes.
func (f *front) corrupt(w http.ResponseWriter, req *http.Request) {
	rec, err := f.fetch(req, false)
	if err != nil || !rec.ok() || len(rec.body) == 0 {
		writeRecorded(w, rec, err)
		return
	}
	f.count(kindCorrupt)
	body := append([]byte(nil), rec.body...)
	if f.intN(2) == 0 {
		for range 1 + f.intN(8) {
			body[f.intN(len(body))] ^= byte(1 + f.intN(255))
		}
	} else {
		from := f.intN(len(body))
		to := from + 1 + f.intN(min(len(body)-from, 4096))
		for i := from; i < to; i++ {
			body[i] = ^body[i]
		}
	}
	writeRecorded(w, &recorded{status: rec.status, header: rec.header, body: body}, nil)
}

// short answers req with a complete 200 whose Content-Length, and body, are shorter than the
// content.
func (f *front) short(w http.ResponseWriter, req *http.Request) {
	rec, err := f.fetch(req, false)
	if err != nil || !rec.ok() || len(rec.body) < 2 {
		writeRecorded(w, rec, err)
		return
	}
	f.count(kindShort)
	writeRecorded(w, &recorded{status: rec.status, header: rec.header, body: rec.body[:f.intN(len(rec.body))]}, nil)
}

// bad206 answers a ranged blob GET ("bytes=N-", nodecache's resume) with a 206 that is not the
// range asked for: the blob from byte 0 labelled as from N, a Content-Range whose total is not
// the blob's size, or another start than N with that start's bytes.
func (f *front) bad206(w http.ResponseWriter, req *http.Request) {
	rec, err := f.fetch(req, true)
	from, ok := rangeStart(req.Header.Get("Range"))
	if err != nil || !rec.ok() || !ok || from <= 0 || from >= int64(len(rec.body)) {
		f.direct.ServeHTTP(w, req)
		return
	}
	f.count(kindBad206)
	size := int64(len(rec.body))
	var (
		cr   string
		body []byte
	)
	switch f.intN(3) {
	case 0:
		cr, body = fmt.Sprintf("bytes %d-%d/%d", from, size-1, size), rec.body[:size-from]
	case 1:
		cr, body = fmt.Sprintf("bytes %d-%d/%d", from, size-1, size+1+int64(f.intN(1<<20))), rec.body[from:]
	default:
		other := int64(f.intN(int(size)))
		if other == from {
			other = 0
		}
		cr, body = fmt.Sprintf("bytes %d-%d/%d", other, size-1, size), rec.body[other:]
	}
	h := w.Header()
	for k, v := range rec.header {
		h[k] = v
	}
	h.Set("Content-Range", cr)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusPartialContent)
	_, _ = w.Write(body)
}

// rangeStart parses "bytes=N-".
func rangeStart(v string) (int64, bool) {
	s, ok := strings.CutPrefix(v, "bytes=")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(s, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}

// stall answers req (a blob GET) with the registry's headers and part of its body, then sends
// nothing more, holding the connection until nodecache gives up on it or the round ends. (Only
// blobs: a stalled manifest body holds its clients for --upstream-timeout plus 30 s, which
// would cost the run half a minute per stall.)
func (f *front) stall(w http.ResponseWriter, req *http.Request, release chan struct{}) {
	rec, err := f.fetch(req, false)
	if err != nil || !rec.ok() {
		writeRecorded(w, rec, err)
		return
	}
	f.count(kindBlackhole)
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rec.body)))
	w.WriteHeader(rec.status)
	if len(rec.body) > 0 {
		_, _ = w.Write(rec.body[:f.intN(len(rec.body))])
	}
	_ = http.NewResponseController(w).Flush()
	select {
	case <-req.Context().Done():
	case <-release:
	case <-time.After(2 * time.Minute):
	}
	panic(http.ErrAbortHandler) // the body is short of its length: end the connection
}

// slow streams the registry's answer 32 KiB at a time, pausing delay after each piece, until the
// round ends (then at full speed).
func (f *front) slow(w http.ResponseWriter, req *http.Request, delay time.Duration, release chan struct{}) {
	rec, err := f.fetch(req, false)
	if err != nil || !rec.ok() {
		writeRecorded(w, rec, err)
		return
	}
	f.inBody.Add(1)
	defer f.inBody.Add(-1)
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rec.body)))
	w.WriteHeader(rec.status)
	rc := http.NewResponseController(w)
	for b := rec.body; len(b) > 0; {
		n := min(len(b), 32<<10)
		if _, err := w.Write(b[:n]); err != nil {
			return
		}
		_ = rc.Flush()
		f.bodyBytes.Add(int64(n))
		b = b[n:]
		select {
		case <-time.After(delay):
		case <-release:
			delay = 0
		case <-req.Context().Done():
			return
		}
	}
}
