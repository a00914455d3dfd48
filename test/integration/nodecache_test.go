package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// syncBuffer is a bytes.Buffer safe for the mirror's concurrent log writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// nodecache is a running nodecache mirror on a loopback port, with its JSON log in a buffer.
type nodecache struct {
	// URL is "http://127.0.0.1:<port>".
	URL string
	// Host is "127.0.0.1:<port>".
	Host string
	log  *syncBuffer
	// Close stops serving (the mirror is down from then on); the test's cleanup calls it too.
	Close func()
}

// accessLine is one access-log line of the mirror (message "request").
type accessLine struct {
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

// startNodecache serves mirror.New with upstream as its only upstream (name = upstreamHost of
// it, reached at http://upstream.test:<port>) on 127.0.0.1, in memory, until the test ends.
func startNodecache(t *testing.T, upstream *mirrortest.Registry) *nodecache {
	t.Helper()
	host := upstreamHost(t, upstream)
	up, err := name.ParseUpstream(host + "=http://" + host)
	if err != nil {
		t.Fatalf("upstream %s: %v", host, err)
	}
	buf := &syncBuffer{}
	m, err := mirror.New(t.Context(), mirror.Options{
		Upstreams: []name.Upstream{up},
		Logger:    zerolog.New(buf).With().Timestamp().Logger(),
	})
	if err != nil {
		t.Fatalf("mirror.New: %v", err)
	}
	srv := httptest.NewServer(m)
	t.Cleanup(func() {
		srv.Close()
		_ = m.Close()
		if t.Failed() {
			t.Logf("nodecache log:\n%s", buf.String())
		}
	})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &nodecache{URL: srv.URL, Host: u.Host, log: buf, Close: srv.Close}
}

// requests returns the access-log lines so far.
func (n *nodecache) requests(t *testing.T) []accessLine {
	t.Helper()
	var out []accessLine
	sc := bufio.NewScanner(strings.NewReader(n.log.String()))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var l accessLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("nodecache log line is not JSON: %q: %v", sc.Text(), err)
		}
		if l.Message == "request" {
			out = append(out, l)
		}
	}
	return out
}

// checkAccessLog fails the test unless nodecache logged requests from userAgent with ?ns=ns,
// routed to upstream ns, that fetched the image's manifest and at least one blob successfully.
// Requests from other clients (none expected) are reported.
func checkAccessLog(t *testing.T, lines []accessLine, userAgent, ns string) {
	t.Helper()
	var manifests, blobs int
	for _, l := range lines {
		if l.UserAgent != userAgent {
			t.Errorf("nodecache logged %s %s from User-Agent %q, want %q", l.Method, l.Path, l.UserAgent, userAgent)
			continue
		}
		q, err := url.ParseQuery(l.Query)
		if err != nil || q.Get("ns") != ns {
			t.Errorf("nodecache logged %s %s?%s: want ns=%s", l.Method, l.Path, l.Query, ns)
		}
		if l.Upstream != ns {
			t.Errorf("nodecache routed %s %s to upstream %q, want %q", l.Method, l.Path, l.Upstream, ns)
		}
		if l.Status >= 400 {
			t.Errorf("nodecache answered %s %s?%s with %d", l.Method, l.Path, l.Query, l.Status)
		}
		switch {
		case strings.Contains(l.Path, "/manifests/"):
			manifests++
		case strings.Contains(l.Path, "/blobs/"):
			blobs++
		}
	}
	if manifests == 0 || blobs == 0 {
		t.Errorf("nodecache logged %d manifest and %d blob requests from %s, want both > 0", manifests, blobs, userAgent)
	}
}
