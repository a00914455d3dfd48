// Package nodecachetest starts what a test of nodecache's callers stands on: a nodecache mirror
// serving in the test process in front of a mirrortest upstream registry, named the way the
// test's clients name it, with the mirror's JSON access log at hand. A test then states only what
// is special about it: the images it pushes, the clients it points at the mirror, what it checks.
package nodecachetest

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// Options says what is special about a test's nodecache; the zero value is a nodecache in front
// of a new, empty upstream reached by its loopback address.
type Options struct {
	// UpstreamName is the registry host clients give for the upstream (its port is the
	// upstream's); the machine must resolve it to loopback (see runtimetest.RequireLoopbackName).
	// Empty: the upstream's address.
	UpstreamName string
	// Upstream is the registry nodecache pulls through to; nil: a new mirrortest.NewRegistry.
	Upstream *mirrortest.Registry
	// Alias, when set, is the upstream's name on the mirror, a label that need not resolve: the
	// mirror dials the upstream's address (UpstreamName is then unused).
	Alias string
	// Root is the mirror's filesystem root; empty: in memory.
	Root string
	// UpstreamTimeout is mirror.Options.UpstreamTimeout; zero: the mirror's default.
	UpstreamTimeout time.Duration
	// Wrap, when set, stands between the mirror and its clients (a recorder, a fault).
	Wrap func(http.Handler) http.Handler
	// Upstreams, when set, are the mirror's upstreams, for a test with several registries behind
	// it; UpstreamName, Upstream and Alias are then unused, and Nodecache.Upstream is nil.
	Upstreams []name.Upstream
	// MaxSize is mirror.Options.MaxSize; zero: no cap.
	MaxSize int64
	// Run runs the mirror's background work (mirror.Run: upload sweeping, eviction under
	// MaxSize) as serve does, until the test ends; Start then returns once the cache index is
	// loaded (mirror.Inventory().Ready), as an import or a cache ls is answered 503 before.
	Run bool
}

// Nodecache is a nodecache mirror (mirror.New, in memory) serving on a loopback port until the
// test ends, with its only upstream.
type Nodecache struct {
	// URL is "http://127.0.0.1:<port>", Host "127.0.0.1:<port>".
	URL, Host string
	// Upstream is the registry behind the mirror; UpstreamHost is its name on the mirror:
	// Options.Alias, or else the registry name that reaches it ("<Options.UpstreamName>:<port>");
	// nil and empty when Options.Upstreams was given.
	Upstream     *mirrortest.Registry
	UpstreamHost string
	// Log is the mirror's JSON log; the test's failure prints it.
	Log *mirrortest.LogBuffer
	// Close stops serving (the mirror is down from then on); the test's cleanup calls it too.
	Close func()
	// Mirror is the mirror itself.
	Mirror *mirror.Mirror
}

// Start serves a nodecache for the rest of the test.
func Start(t *testing.T, opts Options) *Nodecache {
	t.Helper()
	var upstream *mirrortest.Registry
	var host string
	ups := opts.Upstreams
	if ups == nil {
		upstream = opts.Upstream
		if upstream == nil {
			upstream = mirrortest.NewRegistry(t)
		}
		host = UpstreamHost(t, upstream, opts.UpstreamName)
		spec := host + "=http://" + host
		if opts.Alias != "" {
			host, spec = opts.Alias, opts.Alias+"="+upstream.URL.String()
		}
		up, err := name.ParseUpstream(spec)
		if err != nil {
			t.Fatalf("upstream %s: %v", spec, err)
		}
		ups = []name.Upstream{up}
	}
	buf := &mirrortest.LogBuffer{}
	m, err := mirror.New(t.Context(), mirror.Options{
		Root:            opts.Root,
		Upstreams:       ups,
		UpstreamTimeout: opts.UpstreamTimeout,
		MaxSize:         opts.MaxSize,
		Logger:          zerolog.New(buf).With().Timestamp().Logger(),
	})
	if err != nil {
		t.Fatalf("mirror.New: %v", err)
	}
	var h http.Handler = m
	if opts.Wrap != nil {
		h = opts.Wrap(m)
	}
	srv := httptest.NewServer(h)
	stopRun := func() {}
	if opts.Run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(ctx) }()
		stopRun = func() { cancel(); <-done }
	}
	t.Cleanup(func() {
		srv.Close()
		stopRun()
		_ = m.Close()
		if t.Failed() {
			t.Logf("nodecache log:\n%s", buf.String())
		}
	})
	if opts.Run {
		waitIndexLoaded(t, m)
	}
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &Nodecache{URL: srv.URL, Host: u.Host, Upstream: upstream, UpstreamHost: host, Log: buf, Close: srv.Close, Mirror: m}
}

// waitIndexLoaded waits up to 4 s for m's cache index to be loaded.
func waitIndexLoaded(t *testing.T, m *mirror.Mirror) {
	t.Helper()
	for range 400 {
		if m.Inventory().Ready {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("nodecachetest: the cache index was never loaded")
}

// UpstreamHost returns "<hostName>:<port of r>", a registry name that reaches r when hostName
// resolves to loopback; an empty hostName gives r's address.
func UpstreamHost(t *testing.T, r *mirrortest.Registry, hostName string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(r.Addr)
	if err != nil {
		t.Fatalf("registry address %q: %v", r.Addr, err)
	}
	if hostName != "" {
		host = hostName
	}
	return net.JoinHostPort(host, port)
}

// AccessLine is one access-log line of the mirror (message "request").
type AccessLine struct {
	Method     string `json:"method"`
	Upstream   string `json:"upstream"`
	Repository string `json:"repository"`
	Kind       string `json:"kind"`
	Status     int    `json:"status"`
	UserAgent  string `json:"user_agent"`
	Path       string `json:"path"`
	Query      string `json:"query"`
	Message    string `json:"message"`
}

// Requests returns the access-log lines so far.
func (n *Nodecache) Requests(t *testing.T) []AccessLine {
	t.Helper()
	return AccessLog(t, n.Log)
}

// AccessLog returns the access-log lines in log, a mirror's JSON log.
func AccessLog(t *testing.T, log *mirrortest.LogBuffer) []AccessLine {
	t.Helper()
	var out []AccessLine
	sc := bufio.NewScanner(strings.NewReader(log.String()))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var l AccessLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("nodecache log line is not JSON: %q: %v", sc.Text(), err)
		}
		if l.Message == "request" {
			out = append(out, l)
		}
	}
	return out
}
