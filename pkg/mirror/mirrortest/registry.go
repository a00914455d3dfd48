// Package mirrortest provides real registries for tests: distribution's own registry served
// in-process on loopback, with request accounting, a stop/start switch and image pushers.
package mirrortest

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory" // storage driver
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/sirupsen/logrus"
)

// Request is one request an upstream saw.
type Request struct {
	Method    string
	Path      string
	RawQuery  string
	UserAgent string
	Range     string
	// Authorization is the request's Authorization header.
	Authorization string
}

// Registry is distribution's plain (non-proxy) registry with in-memory storage, listening on a
// loopback address that survives Stop and Start.
type Registry struct {
	// Addr is host:port of the listener, e.g. "127.0.0.1:40123".
	Addr string
	// URL is http://Addr.
	URL *url.URL

	handler http.Handler
	mu      sync.Mutex
	srv     *http.Server
	reqs    []Request
	// Wrap, when set before a request, wraps the registry handler (fault injection).
	wrap func(http.Handler) http.Handler
	// auth authenticates the pushers (NewPrivateRegistry); nil: anonymous.
	auth authn.Authenticator
}

// NewRegistry starts a registry on 127.0.0.1 with a random port. It stops when the test ends.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	return NewRegistryAt(t, "127.0.0.1:0")
}

// NewRegistryAt starts a registry on addr ("127.0.0.1:0" picks a port).
func NewRegistryAt(t testing.TB, addr string) *Registry {
	t.Helper()
	r := NewStoppedRegistry(t, addr)
	r.Start(t)
	return r
}

// NewStoppedRegistry reserves a loopback port for a registry that is not listening yet: requests
// to it are refused until Start. addr "127.0.0.1:0" picks a free port (on that address: any
// 127.0.0.0/8 address works on Linux).
func NewStoppedRegistry(t testing.TB, addr string) *Registry {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if strings.HasSuffix(addr, ":0") {
		l, err := net.Listen("tcp", addr) // on addr's host: 127.0.0.2:0 stays on 127.0.0.2
		if err != nil {
			t.Fatalf("reserve port: %v", err)
		}
		addr = l.Addr().String()
		_ = l.Close()
	}
	r := &Registry{Addr: addr, URL: &url.URL{Scheme: "http", Host: addr}, handler: NewHandler(t)}
	t.Cleanup(r.Stop)
	return r
}

// NewHandler returns distribution's registry API handler over fresh in-memory storage.
func NewHandler(t testing.TB) http.Handler {
	t.Helper()
	return NewHandlerWithConfig(t, nil)
}

var quietOnce sync.Once

// QuietLogrus discards distribution's global logrus output (the registries under test log
// expected 404s as errors), so test output stays readable.
func QuietLogrus() {
	quietOnce.Do(func() { logrus.SetOutput(io.Discard) })
}

// Start begins listening on Addr (again). It retries briefly while the port is still in use.
func (r *Registry) Start(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv != nil {
		return
	}
	var (
		l   net.Listener
		err error
	)
	for i := 0; i < 50; i++ {
		if l, err = net.Listen("tcp", r.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen %s: %v", r.Addr, err)
	}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server) { _ = srv.Serve(l) }(r.srv)
}

// Stop closes the listener and every open connection: later requests are refused.
func (r *Registry) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv != nil {
		_ = r.srv.Close()
		r.srv = nil
	}
}

// Wrap installs middleware in front of the registry API (nil removes it).
func (r *Registry) Wrap(w func(http.Handler) http.Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wrap = w
}

func (r *Registry) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.reqs = append(r.reqs, Request{
		Method: req.Method, Path: req.URL.Path, RawQuery: req.URL.RawQuery,
		UserAgent: req.UserAgent(), Range: req.Header.Get("Range"),
		Authorization: req.Header.Get("Authorization"),
	})
	h := r.handler
	if r.wrap != nil {
		h = r.wrap(h)
	}
	r.mu.Unlock()
	h.ServeHTTP(w, req)
}

// Requests returns a copy of every request seen so far.
func (r *Registry) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.reqs...)
}

// ResetRequests forgets the requests seen so far.
func (r *Registry) ResetRequests() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = nil
}

// Count returns how many requests had method (any when "") and a path containing substr.
func (r *Registry) Count(method, substr string) int {
	n := 0
	for _, q := range r.Requests() {
		if (method == "" || q.Method == method) && strings.Contains(q.Path, substr) {
			n++
		}
	}
	return n
}

// Blackhole listens on loopback, accepts connections and never answers: the shape of an
// upstream behind a dropped route. It returns host:port and closes when the test ends.
func Blackhole(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("blackhole listen: %v", err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// ErrStopped is returned by helpers that need a running registry.
var ErrStopped = errors.New("mirrortest: registry is stopped")
