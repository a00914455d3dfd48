package mirror

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Connection bounds (issue 23, connections): every listener's connections count against one
// budget derived from the process's descriptor limit, so that clients, idle or not, cannot take
// the descriptors that storage, upstream connections and the next client need.
const (
	// DefaultClientMaxConns is ServeOptions.ClientMaxConns's default (--client-max-conns).
	DefaultClientMaxConns = 256
	// fdReserve is how many descriptors ConnBudget keeps for everything that is not a client
	// connection: listeners, the root lock and index files, upstream, shared-tier and peer
	// connections (--upstream-concurrency bounds those waiting for headers), connections being
	// answered past the budget (oneShotSlots, refusalDrains).
	fdReserve = 128
	// minConnBudget is the smallest budget ConnBudget gives, whatever the limit.
	minConnBudget = 16
	// refusedMaxConns is how many connections an address outside --pull-allow may hold on the
	// registry listener: enough for probes and a scrape, nothing to pull with.
	refusedMaxConns = 4
	// oneShotSlots is how many connections past a bound (the budget, --client-max-conns, the
	// refused addresses' cap) are still read for one request at a time, so that /healthz,
	// /readyz and /metrics stay reachable whatever the load; past them the fixed 503 is written
	// without reading the request.
	oneShotSlots = 16
	// oneShotTime bounds everything such a connection does: its request and its answer.
	oneShotTime = 5 * time.Second
	// newGrace is how long a new connection may take to send its first request header before,
	// under pressure, it counts as idle.
	newGrace = 2 * time.Second
	// refusalDrains bounds the refused connections whose 503 is being written and whose request
	// is being read away (closing a socket with unread data resets it, and the client may lose
	// the answer); past it a refused connection is closed at once.
	refusalDrains = 32
	// refusalTime bounds writing a refusal and reading the request away.
	refusalTime = time.Second
)

// Reasons of nodecache_refused_total for connections.
const (
	// RefusedConnections: a connection past the connection budget (503).
	RefusedConnections = "connections"
	// RefusedClientConns: a connection from an address that holds --client-max-conns
	// connections while the budget is under pressure (503).
	RefusedClientConns = "client_max_conns"
	// RefusedPullAllowConns: a connection from an address outside --pull-allow that holds
	// refusedMaxConns connections already (503).
	RefusedPullAllowConns = "pull_allow_conns"
)

// ConnBudget is the connection budget of a process whose descriptor limit (RLIMIT_NOFILE, soft)
// is limit: (limit − 128) / 2, at least 16. 128 descriptors are kept for what is not a client
// connection (fdReserve); each client connection may hold a second descriptor, the blob file it
// is served from or the staging file of the fill it reads. At 1024 that is 448 connections, at
// 65536 32704; Go raises the soft limit to the hard one at start, so the hard limit decides.
func ConnBudget(limit uint64) int {
	const most = 1 << 24 // an unlimited or absurd limit: a budget nothing reaches
	if limit > most {
		limit = most
	}
	if limit < fdReserve+2*minConnBudget {
		return minConnBudget
	}
	return int(limit-fdReserve) / 2
}

// descriptorLimit is the process's descriptor limit: RLIMIT_NOFILE's soft limit.
func descriptorLimit() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("read the descriptor limit (RLIMIT_NOFILE): %w", err)
	}
	return rl.Cur, nil
}

// connTracker counts the connections of every listener of Serve against the budget and decides
// on each new one (admit). Up to pressure (7/8 of the budget) every connection is taken. From
// there, idle connections — keep-alive ones between requests, and new ones that have sent no
// request header for newGrace — are closed, least recently used first, down to 3/4 of the
// budget, and an address that holds clientMax connections gets no more. Past the budget a new
// connection is a one-shot connection (below). On the registry listener an address outside
// --pull-allow may hold refusedMaxConns connections whatever the load.
//
// A connection refused by one of these bounds is still read for one request while fewer than
// oneShotSlots such connections are open, within oneShotTime: /healthz, /readyz and /metrics
// are answered, a refused address's request gets its 403, anything else 503; all with
// Connection: close. Past those slots the 503 is written at once, without reading the request
// (over TLS the connection is closed: no plain-HTTP answer can be given before a handshake).
type connTracker struct {
	budget, pressure, low, clientMax int
	pull                             pullGate
	metrics                          *metrics
	log                              zerolog.Logger
	now                              func() time.Time
	drains                           chan struct{}

	mu      sync.Mutex
	open    int // connections within the budget
	oneShot int // connections past a bound, read for one request
	perAddr map[netip.Addr]int
	// idle holds the connections within the budget that are idle or new: what pressure closes.
	idle   map[*trackedConn]struct{}
	warned time.Time // the last warning that a bound was reached
}

func newConnTracker(budget, clientMax int, pull pullGate, met *metrics, log zerolog.Logger) *connTracker {
	t := &connTracker{
		budget: budget, pressure: max(1, budget*7/8), low: max(1, budget*3/4), clientMax: clientMax,
		pull: pull, metrics: met, log: log, now: time.Now, drains: make(chan struct{}, refusalDrains),
		perAddr: map[netip.Addr]int{}, idle: map[*trackedConn]struct{}{},
	}
	met.connBudget.Set(float64(budget))
	return t
}

// trackedConn is a connection counted by a connTracker. Closing it releases its place.
type trackedConn struct {
	net.Conn
	t    *connTracker
	addr netip.Addr
	// refused is the bound it was taken past ("": none): a one-shot connection, all of whose
	// deadlines end at until.
	refused string
	until   time.Time

	// Guarded by t.mu.
	state    http.ConnState
	since    time.Time // when it entered state
	released bool
}

// admit decides on the new connection c of a listener; gated: the registry listener, where
// --pull-allow's cap applies. It returns c counted, or the reason it is refused outright.
func (t *connTracker) admit(c net.Conn, gated bool) (*trackedConn, string) {
	ip, _ := remoteIP(c.RemoteAddr().String())
	now := t.now()
	tc := &trackedConn{Conn: c, t: t, addr: ip, state: http.StateNew, since: now}
	t.mu.Lock()
	var victims []*trackedConn
	if t.open >= t.pressure {
		victims = t.takeIdle(now)
	}
	held := t.perAddr[ip]
	switch {
	case gated && held >= refusedMaxConns && !t.pull.allowed(c.RemoteAddr().String()):
		tc.refused = RefusedPullAllowConns
	case t.open >= t.pressure && held >= t.clientMax:
		tc.refused = RefusedClientConns
	case t.open >= t.budget:
		tc.refused = RefusedConnections
	}
	if tc.refused != "" && t.oneShot >= oneShotSlots {
		t.mu.Unlock()
		t.closeAll(victims)
		t.metrics.refused.WithLabelValues(tc.refused).Inc()
		t.boundReached(tc.refused)
		return nil, tc.refused
	}
	t.perAddr[ip]++
	if tc.refused != "" {
		t.oneShot++
		tc.until = now.Add(oneShotTime)
	} else {
		t.open++
		t.idle[tc] = struct{}{}
	}
	t.metrics.connections.Set(float64(t.open + t.oneShot))
	t.mu.Unlock()
	t.closeAll(victims)
	if tc.refused != "" {
		t.boundReached(tc.refused)
		_ = c.SetDeadline(tc.until)
	}
	return tc, ""
}

// takeIdle releases the idle connections to close under pressure, least recently used first,
// down to the low mark; the caller holds t.mu and closes them once it let go of it.
func (t *connTracker) takeIdle(now time.Time) []*trackedConn {
	var idle []*trackedConn
	for c := range t.idle {
		if c.state == http.StateIdle || now.Sub(c.since) >= newGrace {
			idle = append(idle, c)
		}
	}
	slices.SortFunc(idle, func(a, b *trackedConn) int { return a.since.Compare(b.since) })
	idle = idle[:max(0, min(len(idle), t.open-t.low))]
	for _, c := range idle {
		t.releaseLocked(c)
	}
	return idle
}

func (t *connTracker) closeAll(cs []*trackedConn) {
	for _, c := range cs {
		_ = c.Conn.Close()
	}
}

// boundReached warns, at most once a minute, that the budget or --client-max-conns refused a
// connection (reason); the refused addresses' cap is no news for the operator.
func (t *connTracker) boundReached(reason string) {
	if reason == RefusedPullAllowConns {
		return
	}
	t.mu.Lock()
	now, open := t.now(), t.open
	warn := now.Sub(t.warned) >= time.Minute
	if warn {
		t.warned = now
	}
	t.mu.Unlock()
	if warn {
		t.log.Warn().Str("reason", reason).Int("open", open).Int("budget", t.budget).Int("client_max_conns", t.clientMax).
			Msg("connection bound reached: new connections get 503 (probes are still answered); the budget follows the descriptor limit (ulimit -n)")
	}
}

// release gives c's place back (once).
func (t *connTracker) release(c *trackedConn) {
	t.mu.Lock()
	t.releaseLocked(c)
	t.mu.Unlock()
}

func (t *connTracker) releaseLocked(c *trackedConn) {
	if c.released {
		return
	}
	c.released = true
	if c.refused != "" {
		t.oneShot--
	} else {
		t.open--
		delete(t.idle, c)
	}
	if t.perAddr[c.addr]--; t.perAddr[c.addr] <= 0 {
		delete(t.perAddr, c.addr)
	}
	t.metrics.connections.Set(float64(t.open + t.oneShot))
}

// connState is the servers' http.Server.ConnState: it follows which connections are idle.
func (t *connTracker) connState(c net.Conn, s http.ConnState) {
	tc := tracked(c)
	if tc == nil {
		return
	}
	t.mu.Lock()
	tc.state, tc.since = s, t.now()
	if !tc.released && tc.refused == "" {
		if s == http.StateIdle || s == http.StateNew {
			t.idle[tc] = struct{}{}
		} else {
			delete(t.idle, tc)
		}
	}
	t.mu.Unlock()
	if s == http.StateClosed {
		t.release(tc)
	}
}

// tracked is the trackedConn under c (a TLS connection's too), nil when c is none.
func tracked(c net.Conn) *trackedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	tc, _ := c.(*trackedConn)
	return tc
}

func (c *trackedConn) Close() error {
	c.t.release(c)
	return c.Conn.Close()
}

// clamp is d, or until for a one-shot connection when d is later (or none).
func (c *trackedConn) clamp(d time.Time) time.Time {
	if c.refused != "" && (d.IsZero() || d.After(c.until)) {
		return c.until
	}
	return d
}

func (c *trackedConn) SetDeadline(d time.Time) error      { return c.Conn.SetDeadline(c.clamp(d)) }
func (c *trackedConn) SetReadDeadline(d time.Time) error  { return c.Conn.SetReadDeadline(c.clamp(d)) }
func (c *trackedConn) SetWriteDeadline(d time.Time) error { return c.Conn.SetWriteDeadline(c.clamp(d)) }

// ReadFrom keeps the connection's io.ReaderFrom (net/http hands a file to it, which the kernel
// sends with sendfile).
func (c *trackedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite keeps the connection's half close (net/http's lingering close of a response).
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

type oneShotKey struct{}

// connContext is the servers' http.Server.ConnContext: it marks a one-shot connection's
// requests with the bound it was taken past.
func (t *connTracker) connContext(ctx context.Context, c net.Conn) context.Context {
	if tc := tracked(c); tc != nil && tc.refused != "" {
		return context.WithValue(ctx, oneShotKey{}, tc.refused)
	}
	return ctx
}

// handler wraps a server's handler: the request of a one-shot connection gets Connection: close,
// and, unless it is a probe or comes from an address outside --pull-allow (whose answer is its
// 403), the 503 of its bound.
func (t *connTracker) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reason, _ := r.Context().Value(oneShotKey{}).(string)
		if reason == "" {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			h.ServeHTTP(w, r)
			return
		}
		if reason == RefusedPullAllowConns {
			h.ServeHTTP(w, r)
			return
		}
		t.metrics.refused.WithLabelValues(reason).Inc()
		w.Header().Set("Retry-After", "1")
		http.Error(w, refusalMessage(reason, t.clientMax), http.StatusServiceUnavailable)
	})
}

// refusalMessage says why a connection was refused and what to do.
func refusalMessage(reason string, clientMax int) string {
	switch reason {
	case RefusedClientConns:
		return fmt.Sprintf("nodecache is near its connection budget and your address holds --client-max-conns (%d) connections: reuse them, or retry shortly", clientMax)
	case RefusedPullAllowConns:
		return fmt.Sprintf("your address may not pull from this cache (--pull-allow) and holds %d connections already", refusedMaxConns)
	}
	return "nodecache holds as many connections as its descriptor limit allows (its connection budget): retry shortly, or pull from the registry"
}

// limitListener is a listener of Serve whose connections a connTracker counts.
type limitListener struct {
	net.Listener
	t *connTracker
	// gated: the registry listener, where --pull-allow's cap applies; plain: it serves plain
	// HTTP, so a refusal can be answered before reading the request.
	gated, plain bool
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, reason := l.t.admit(c, l.gated)
		if tc != nil {
			return tc, nil
		}
		l.refuse(c, reason)
	}
}

// refuse answers a connection refused outright: over plain HTTP a fixed 503 with Connection:
// close, written without reading the request, which is then read away for at most refusalTime
// so the close does not reset the connection before the client read the answer; at once when
// refusalDrains connections are being refused already, or over TLS.
func (l *limitListener) refuse(c net.Conn, reason string) {
	if !l.plain {
		_ = c.Close()
		return
	}
	select {
	case l.t.drains <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	go func() {
		defer func() { <-l.t.drains }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refusalTime))
		msg := refusalMessage(reason, l.t.clientMax) + "\n"
		_, _ = io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"+
			"Connection: close\r\nRetry-After: 1\r\nContent-Length: "+fmt.Sprint(len(msg))+"\r\n\r\n"+msg)
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}
