package mirror_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// fileCountingListener hands out connections that record how the HTTP server writes to them:
// bytes passed to Write, and bytes the server handed over through io.ReaderFrom from an
// *os.File (the only source the kernel can copy with sendfile). A response writer anywhere in
// the chain that hides io.ReaderFrom turns every body byte into a Write.
type fileCountingListener struct {
	net.Listener
	mu                   sync.Mutex
	written, fromFile    int64
	otherReadFromSources int64
	accepted, closed     int
}

// fileCountingServer serves h on a loopback port through a fileCountingListener, closed at
// the test's end.
func fileCountingServer(t *testing.T, h http.Handler) (*httptest.Server, *fileCountingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &fileCountingListener{Listener: ln}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = cl
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, cl
}

func (l *fileCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.accepted++
	l.mu.Unlock()
	return &fileCountingConn{Conn: c, l: l}, nil
}

func (l *fileCountingListener) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.written, l.fromFile, l.otherReadFromSources = 0, 0, 0
}

// counts waits until the server has closed every connection it accepted (the handler, and so
// its access-log line, is done), then returns what went through them.
func (l *fileCountingListener) counts(t *testing.T) (written, fromFile, other int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		done := l.closed == l.accepted
		written, fromFile, other = l.written, l.fromFile, l.otherReadFromSources
		l.mu.Unlock()
		if done {
			return written, fromFile, other
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not close its connections within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type fileCountingConn struct {
	net.Conn
	l *fileCountingListener
}

func (c *fileCountingConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.closed++
	c.l.mu.Unlock()
	return err
}

func (c *fileCountingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.l.mu.Lock()
	c.l.written += int64(n)
	c.l.mu.Unlock()
	return n, err
}

// ReadFrom passes the source on to the TCP connection (sendfile for a file) and counts it.
func (c *fileCountingConn) ReadFrom(r io.Reader) (int64, error) {
	src := r
	if lr, ok := r.(*io.LimitedReader); ok {
		src = lr.R
	}
	_, isFile := src.(*os.File)
	n, err := c.Conn.(io.ReaderFrom).ReadFrom(r)
	c.l.mu.Lock()
	if isFile {
		c.l.fromFile += n
	} else {
		c.l.otherReadFromSources += n
	}
	c.l.mu.Unlock()
	return n, err
}

// TestWarmBlobReachesSendfile: a cached blob on filesystem storage reaches the connection as an
// *os.File through io.ReaderFrom (sendfile), for a whole GET and for a Range; every answer
// (HEAD, If-None-Match, a Range past the end, a repository the blob is not linked in) has the
// status, headers and body of distribution's own blob server (a nodecache on in-memory storage),
// the access log the bytes sent, and the unlinked repository gets nothing from the file.
//
//nolint:paralleltest // the subtests run in order: the listener counts one request at a time
func TestWarmBlobReachesSendfile(t *testing.T) {
	t.Parallel()
	const size = 2 << 20
	f := newBlobFixture(t, size, mirror.Options{Root: t.TempDir()})
	resp, body := get(t, http.MethodGet, f.url(), nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, f.data) {
		t.Fatalf("cold GET: %d, %d bytes", resp.StatusCode, len(body))
	}
	f.h.waitIdle(t)

	srv, cl := fileCountingServer(t, f.h.m)

	// The same upstream through a nodecache on in-memory storage: its hits are served by
	// distribution's own blob server, the answer to match header for header.
	ref := newHarnessFor(t, f.up)
	if resp, _ := get(t, http.MethodGet, fmtURL(ref, "/v2/upstream.test/team/app/blobs/"+f.digest), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("cold GET through the in-memory nodecache: %d", resp.StatusCode)
	}
	ref.waitIdle(t)

	n := int64(len(f.data))
	blob := "/v2/upstream.test/team/app/blobs/" + f.digest
	tests := []struct {
		name       string
		method     string
		path       string
		header     http.Header
		wantStatus int
		wantBody   []byte // nil: no body bytes may come from the file
	}{
		{name: "whole blob", path: blob, wantStatus: http.StatusOK, wantBody: f.data},
		{name: "range", path: blob, header: http.Header{"Range": {"bytes=1000-"}},
			wantStatus: http.StatusPartialContent, wantBody: f.data[1000:]},
		{name: "HEAD", method: http.MethodHead, path: blob, wantStatus: http.StatusOK},
		{name: "If-None-Match", path: blob, header: http.Header{"If-None-Match": {`"` + f.digest + `"`}},
			wantStatus: http.StatusNotModified},
		{name: "range past the end", path: blob, header: http.Header{"Range": {fmt.Sprintf("bytes=%d-", n+10)}},
			wantStatus: http.StatusRequestedRangeNotSatisfiable},
		{name: "repository without the link", path: "/v2/upstream.test/team/other/blobs/" + f.digest,
			wantStatus: http.StatusNotFound},
	}
	do := func(t *testing.T, base, method, path string, hdr http.Header) (*http.Response, []byte) {
		t.Helper()
		if method == "" {
			method = http.MethodGet
		}
		req := newRequest(t, method, base+path, hdr)
		// A fresh connection per request, closed after it, so the listener's counts are complete.
		req.Close = true
		return send(t, http.DefaultClient, req)
	}
	var hits []int64
	for _, tt := range tests {
		// Sequential: the listener's counts are per request.
		t.Run(tt.name, func(t *testing.T) {
			cl.reset()
			resp, got := do(t, srv.URL, tt.method, tt.path, tt.header)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d (body %.200s)", resp.StatusCode, tt.wantStatus, got)
			}
			written, fromFile, other := cl.counts(t)

			want, wantGot := do(t, "http://"+ref.host, tt.method, tt.path, tt.header)
			if resp.StatusCode != want.StatusCode || !bytes.Equal(got, wantGot) {
				t.Errorf("status %d with %d body bytes; distribution's blob server: %d with %d", resp.StatusCode, len(got), want.StatusCode, len(wantGot))
			}
			resp.Header.Del("Date")
			want.Header.Del("Date")
			if g, w := fmt.Sprint(resp.Header), fmt.Sprint(want.Header); g != w {
				t.Errorf("headers differ from distribution's blob server:\n got  %s\n want %s", g, w)
			}
			if resp.StatusCode < 400 && resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheHit {
				t.Errorf("%s=%q, want hit", mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache))
			}
			if resp.StatusCode < 400 {
				hits = append(hits, int64(len(got)))
			}
			if tt.wantBody == nil {
				if fromFile != 0 {
					t.Errorf("%d bytes were sent from the blob's data file, want none", fromFile)
				}
				return
			}
			if !bytes.Equal(got, tt.wantBody) {
				t.Fatalf("body: %d bytes, want %d bytes of the blob", len(got), len(tt.wantBody))
			}
			// net/http writes the headers and the first 512 body bytes (content sniffing) itself;
			// everything else must go from the file through ReadFrom.
			body := int64(len(tt.wantBody))
			if fromFile < body-512 {
				t.Errorf("%d of %d body bytes went from the data file through io.ReaderFrom (%d bytes written, %d through ReadFrom from another source): a response writer hides ReadFrom",
					fromFile, body, written, other)
			}
			if written > 4096 {
				t.Errorf("%d bytes written with Write, want only headers and the first 512 body bytes", written)
			}
		})
	}
	// The access log records what was sent, as before.
	var logged []int64
	for _, l := range f.h.logs.requests(t) {
		if l["kind"] == "blob" && l["cache"] == mirrorapi.CacheHit {
			b, _ := l["bytes"].(float64)
			logged = append(logged, int64(b))
		}
	}
	if want := fmt.Sprint(hits); fmt.Sprint(logged) != want {
		t.Errorf("access log bytes of the hits: %v, want %s", logged, want)
	}
}
