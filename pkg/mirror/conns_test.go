package mirror_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// rawConn is a client connection to a served mirror, from a chosen loopback address, speaking
// HTTP/1.1 by hand: the tests hold connections open, idle or silent, as an attacker would.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

// dialFrom opens a connection to addr from the loopback address local (Linux routes all of
// 127.0.0.0/8 to lo, so the mirror sees that address).
func dialFrom(t *testing.T, local, addr string) *rawConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, local, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{Conn: c, br: bufio.NewReader(c)}
}

// get sends GET path on c, with the header lines extra ("Name: value"), and reads the answer
// (within 10 s).
func (c *rawConn) get(t *testing.T, path string, extra ...string) (*http.Response, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	hdr := "Host: nodecache\r\n"
	for _, e := range extra {
		hdr += e + "\r\n"
	}
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\n"+hdr+"\r\n"); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return c.read(t, "GET "+path)
}

// read reads one answer from c.
func (c *rawConn) read(t *testing.T, what string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("%s: body: %v", what, err)
	}
	return resp, string(b)
}

// unasked is an answer the server sent without a request.
type unasked struct {
	status int
	close  bool // Connection: close
	body   string
}

// answered reads what the server sent on c, a connection that sent nothing, within wait: an
// answer, or nil when it sent none in that time (the connection is still open) or closed it.
func (c *rawConn) answered(wait time.Duration) *unasked {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	if _, err := c.br.Peek(1); err != nil {
		return nil
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return nil
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return &unasked{status: resp.StatusCode, close: resp.Close, body: string(b)}
}

// closedByServer reports whether the server closed c, which has nothing left to read, within
// wait.
func (c *rawConn) closedByServer(wait time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	_, err := c.br.ReadByte()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// serveConns serves a mirror of u's registry (team/a's manifest GETs held until u.release, which
// closes when the test ends, before the server stops) with o, and returns its address.
func serveConns(t *testing.T, u *heldUpstream, mo mirror.Options, o mirror.ServeOptions) string {
	t.Helper()
	mo.Upstreams = []regname.Upstream{upstreamFor(t, "upstream.test", u.up)}
	mo.Transport = longHeaderTransport()
	mo.UpstreamResolver = testResolver{}
	m, err := mirror.New(t.Context(), mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if o.IdleTimeout == 0 {
		o.IdleTimeout = time.Minute
	}
	addr := serveOn(t, m, o)
	t.Cleanup(func() { close(u.release) })
	return addr
}

// TestIdleConnectionsGoFirst (issue 23, connections): 40 clients from one address that each
// sent GET /v2/ and went idle do not hold the connection budget (16 here): from 7/8 of it on, the
// idle connections are closed, least recently used first, and a client from another address is
// served at once. Before, all 40 stayed open until --idle-timeout, whatever the descriptor
// limit (with 256 descriptors, 260 of them made a blob request time out).
func TestIdleConnectionsGoFirst(t *testing.T) {
	t.Parallel()
	u := newHeldUpstream(t)
	addr := serveConns(t, u, mirror.Options{}, mirror.ServeOptions{MaxConns: 16})
	var idle []*rawConn
	for i := range 40 {
		c := dialFrom(t, "127.0.0.2", addr)
		if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusOK {
			t.Fatalf("idle client %d: GET /v2/: %d %s; want 200 (idle connections make room)", i, resp.StatusCode, body)
		}
		idle = append(idle, c)
	}
	closed := 0
	for _, c := range idle {
		if c.closedByServer(100 * time.Millisecond) {
			closed++
		}
	}
	if closed < 40-14 {
		t.Errorf("the server closed %d of 40 idle connections; want all but at most 14 (7/8 of a budget of 16)", closed)
	}
	c := dialFrom(t, "127.0.0.1", addr)
	if resp, body := c.get(t, "/v2/upstream.test/team/b/manifests/"+u.b, "Accept: "+manifestAccept.Get("Accept")); resp.StatusCode != http.StatusOK {
		t.Errorf("another client's manifest GET: %d %s; want 200", resp.StatusCode, body)
	}
}

// TestConnectionBudget (issue 23, connections): past the connection budget (8 here), a new
// connection is read for one request: /healthz and /metrics are answered, anything else gets 503
// naming the budget, all with Connection: close; past the 16 connections so read, the 503 is
// written at once without reading anything. New connections that send no request within 2 s
// count as idle, so the next client is served again. Before, there was no budget.
func TestConnectionBudget(t *testing.T) {
	t.Parallel()
	u := newHeldUpstream(t)
	addr := serveConns(t, u, mirror.Options{}, mirror.ServeOptions{MaxConns: 8})
	start := time.Now()
	silent := make([]*rawConn, 8)
	for i := range silent {
		silent[i] = dialFrom(t, "127.0.0.2", addr)
	}
	c := dialFrom(t, "127.0.0.1", addr)
	if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusServiceUnavailable || !resp.Close || !strings.Contains(body, "connection budget") {
		t.Errorf("GET /v2/ past the budget: %d close %v %q; want 503 naming the connection budget, Connection: close", resp.StatusCode, resp.Close, body)
	}
	for _, probe := range []string{"/healthz", "/metrics"} {
		c := dialFrom(t, "127.0.0.1", addr)
		if resp, body := c.get(t, probe); resp.StatusCode != http.StatusOK || !resp.Close {
			t.Errorf("GET %s past the budget: %d close %v %.200q; want 200 with Connection: close", probe, resp.StatusCode, resp.Close, body)
		}
	}
	var more []*rawConn
	for range 16 + 6 {
		more = append(more, dialFrom(t, "127.0.0.2", addr))
	}
	fixed := 0
	time.Sleep(500 * time.Millisecond) // the answers written at once are there by then
	for _, c := range more {
		a := c.answered(20 * time.Millisecond)
		if a == nil {
			continue
		}
		if a.status != http.StatusServiceUnavailable || !a.close || !strings.Contains(a.body, "connection budget") {
			t.Errorf("unasked answer past the budget: %d close %v %q; want 503 naming the budget, Connection: close", a.status, a.close, a.body)
		}
		fixed++
	}
	if fixed < 6 {
		t.Errorf("%d of 22 silent connections past the budget got the 503 without asking; want at least 6 (16 are read for a request)", fixed)
	}
	if took := time.Since(start); took > 1900*time.Millisecond {
		t.Skipf("the steps above took %s, longer than the 2 s after which a silent connection counts as idle: the machine is too loaded to judge them", took)
	}

	time.Sleep(time.Until(start.Add(2100 * time.Millisecond)))
	c = dialFrom(t, "127.0.0.1", addr)
	if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v2/ once the silent connections are 2 s old: %d %s; want 200 (they count as idle)", resp.StatusCode, body)
	}
	closed := 0
	for _, s := range silent {
		if s.closedByServer(100 * time.Millisecond) {
			closed++
		}
	}
	if closed == 0 {
		t.Error("no silent connection within the budget was closed to make room")
	}
}

// TestClientMaxConns (issue 23, connections): --client-max-conns applies only once the budget
// is under pressure (7/8 of it): below, one address may hold more; beyond, its next connection
// gets 503 naming --client-max-conns while another address is still served. Before, there was
// no cap.
func TestClientMaxConns(t *testing.T) {
	t.Parallel()
	u := newHeldUpstream(t)
	addr := serveConns(t, u, mirror.Options{}, mirror.ServeOptions{MaxConns: 16, ClientMaxConns: 3})
	start := time.Now()
	for i := range 5 {
		// Served as any connection below the pressure point, then busy (a manifest GET the
		// upstream holds): nothing to close as idle.
		c := dialFrom(t, "127.0.0.2", addr)
		if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d of 127.0.0.2 below the pressure point: %d %s; want 200", i+1, resp.StatusCode, body)
		}
		if _, err := io.WriteString(c, "GET /v2/upstream.test/team/a/manifests/"+u.a+" HTTP/1.1\r\nHost: nodecache\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the server has read the held requests: busy, not idle
	for range 9 {
		dialFrom(t, "127.0.0.3", addr) // silent: new, not idle for 2 s
	}
	c := dialFrom(t, "127.0.0.2", addr)
	if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusServiceUnavailable || !resp.Close || !strings.Contains(body, "--client-max-conns") {
		t.Errorf("6th connection of 127.0.0.2 at the pressure point: %d close %v %q; want 503 naming --client-max-conns", resp.StatusCode, resp.Close, body)
	}
	c = dialFrom(t, "127.0.0.1", addr)
	if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusOK {
		t.Errorf("127.0.0.1 at the pressure point: %d %s; want 200", resp.StatusCode, body)
	}
	if took := time.Since(start); took > 1900*time.Millisecond {
		t.Skipf("the steps took %s, longer than the 2 s after which silent connections count as idle: the machine is too loaded to judge them", took)
	}
}

// TestRefusedClientConns (issue 23, connections): an address outside --pull-allow holds at most
// 4 connections: the next ones get 503 at once (16 of them are read for one request first, 5 s
// at most), its requests 403 with Connection: close, and its probes are answered. Before, a
// refused client held as many connections as it opened.
func TestRefusedClientConns(t *testing.T) {
	t.Parallel()
	u := newHeldUpstream(t)
	addr := serveConns(t, u, mirror.Options{PullAllow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, mirror.ServeOptions{})
	var conns []*rawConn
	for range 40 {
		conns = append(conns, dialFrom(t, "127.0.0.2", addr))
	}
	fixed := 0
	time.Sleep(500 * time.Millisecond) // the answers written at once are there by then
	for _, c := range conns {
		if a := c.answered(20 * time.Millisecond); a != nil {
			if a.status != http.StatusServiceUnavailable || !a.close || !strings.Contains(a.body, "--pull-allow") {
				t.Errorf("unasked answer: %d close %v %q; want 503 naming --pull-allow", a.status, a.close, a.body)
			}
			fixed++
		}
	}
	if fixed < 40-4-16 {
		t.Errorf("%d of 40 connections got the 503 at once; want at least %d", fixed, 40-4-16)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := 0
		for _, c := range conns {
			if !c.closedByServer(20 * time.Millisecond) {
				open++
			}
		}
		if open <= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections of 127.0.0.2 still open after 10 s; want at most 4", open)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c := dialFrom(t, "127.0.0.2", addr)
	if resp, body := c.get(t, "/healthz"); resp.StatusCode != http.StatusOK || !resp.Close {
		t.Errorf("/healthz of an address past its cap: %d close %v %q; want 200 with Connection: close", resp.StatusCode, resp.Close, body)
	}
	c = dialFrom(t, "127.0.0.2", addr)
	if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusForbidden || !resp.Close {
		t.Errorf("/v2/ of an address past its cap: %d close %v %q; want 403 with Connection: close", resp.StatusCode, resp.Close, body)
	}
	c = dialFrom(t, "127.0.0.1", addr)
	if resp, body := c.get(t, "/v2/"); resp.StatusCode != http.StatusOK {
		t.Errorf("127.0.0.1: %d %s; want 200", resp.StatusCode, body)
	}
}

// TestConnBudget: the budget of a descriptor limit.
func TestConnBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit uint64
		want  int
	}{{256, 64}, {1024, 448}, {65536, 32704}, {100, 16}, {0, 16}, {1 << 62, (1<<24 - 128) / 2}} {
		if got := mirror.ConnBudget(tc.limit); got != tc.want {
			t.Errorf("ConnBudget(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}
