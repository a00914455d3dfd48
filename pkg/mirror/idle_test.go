package mirror_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/name"
)

// serveOn runs Serve for m with o on 127.0.0.1 until the test ends and returns its address.
func serveOn(t *testing.T, m *mirror.Mirror, o mirror.ServeOptions) string {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	addr, done := make(chan string, 1), make(chan error, 1)
	o.Listen = "127.0.0.1:0"
	o.OnListen = func(a net.Addr) { addr <- a.String() }
	go func() { done <- mirror.Serve(ctx, m, o) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	select {
	case a := <-addr:
		return a
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	return ""
}

// TestIdleConnectionsClosed (issue 23, connections): a keep-alive connection left idle after its
// answer is closed by the server after --idle-timeout (before: kept until the client left, so
// idle clients could hold every descriptor); a request header over 64 KiB (and the 4 KiB net/http
// allows on top) is answered 431, a request target over 8 KiB 414.
func TestIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	m, err := mirror.New(t.Context(), mirror.Options{Upstreams: []name.Upstream{{Name: "upstream.test", URL: mustURL(t, "http://127.0.0.1:1")}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	addr := serveOn(t, m, mirror.ServeOptions{IdleTimeout: 500 * time.Millisecond})

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /v2/ HTTP/1.1\r\nHost: nodecache\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /v2/: %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %v; want the server to close it", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("idle connection closed after %s; want about the 500 ms idle timeout", took)
	}

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/v2/", nil)
	req.Header.Set("X-Padding", strings.Repeat("p", mirror.MaxHeaderBytes+8192))
	big, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = big.Body.Close()
	if big.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a %d-byte header: %d; want 431", mirror.MaxHeaderBytes+8192, big.StatusCode)
	}
	long, _ := get(t, http.MethodGet, "http://"+addr+"/v2/upstream.test/"+strings.Repeat("a/", mirror.MaxRequestURI/2)+"manifests/v1", nil)
	if long.StatusCode != http.StatusRequestURITooLong {
		t.Errorf("a request target over %d bytes: %d; want 414", mirror.MaxRequestURI, long.StatusCode)
	}
}
