package mirror_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// blockedResolver is testResolver, except that the names in blocked do not resolve (NXDOMAIN), as
// a CDN host a node's DNS or firewall blocks.
type blockedResolver struct{ blocked []string }

func (r blockedResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	for _, b := range r.blocked {
		if strings.TrimSuffix(host, ".") == b {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
	}
	return testResolver{}.LookupNetIP(ctx, network, host)
}

// rateLimited wraps a real registry's manifest answers (GET and HEAD): while status is set it
// answers that status instead, and it adds header as ratelimit-remaining when set, as Docker
// Hub does.
type rateLimited struct {
	mu     sync.Mutex
	status int
	header string
}

func (l *rateLimited) set(status int, header string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status, l.header = status, header
}

func (l *rateLimited) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/manifests/") {
			next.ServeHTTP(w, r)
			return
		}
		l.mu.Lock()
		status, header := l.status, l.header
		l.mu.Unlock()
		if header != "" {
			w.Header().Set("RateLimit-Remaining", header)
		}
		if status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = fmt.Fprintln(w, `{"errors":[{"code":"TOOMANYREQUESTS","message":"You have reached your pull rate limit."}]}`)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// upstreamsDoc reads /nodecache/v1/upstreams.
func upstreamsDoc(t *testing.T, h *harness) mirrorapi.Upstreams {
	t.Helper()
	resp, body := get(t, http.MethodGet, fmtURL(h, mirrorapi.UpstreamsPath), nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: %d %s %q", mirrorapi.UpstreamsPath, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var doc mirrorapi.Upstreams
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("%s: %v: %q", mirrorapi.UpstreamsPath, err, body)
	}
	return doc
}

// tierOf is upstream's tier entry in doc, nil when it has none.
func tierOf(doc mirrorapi.Upstreams, upstream, tier string) *mirrorapi.TierHealth {
	for _, u := range doc.Upstreams {
		if u.Name != upstream {
			continue
		}
		for i := range u.Tiers {
			if u.Tiers[i].Tier == tier {
				return &u.Tiers[i]
			}
		}
	}
	return nil
}

func upstreamOf(doc mirrorapi.Upstreams, upstream string) *mirrorapi.UpstreamHealth {
	for i := range doc.Upstreams {
		if doc.Upstreams[i].Name == upstream {
			return &doc.Upstreams[i]
		}
	}
	return nil
}

// failureLines are the health log's lines for upstream and reason.
func failureLines(t *testing.T, h *harness, upstream, reason string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range h.logs.JSONLines(t) {
		if l["upstream"] == upstream && l["reason"] == reason && l["count"] != nil {
			out = append(out, l)
		}
	}
	return out
}

// untrustedRegistry is a registry over TLS with a certificate for name from a CA nodecache is
// not given; its refused handshakes are not logged.
func untrustedRegistry(t *testing.T, name string) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(mirrortest.NewHandler(t))
	srv.TLS = mirrortest.NewCA(t).TLSConfig(t, name)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func failures(t *testing.T, h *harness, upstream, reason string) float64 {
	t.Helper()
	return metricValue(t, h, fmt.Sprintf(`nodecache_upstream_failures_total{reason=%q,tier="upstream",upstream=%q}`, reason, upstream))
}

// TestUpstreamHealth (issue 25): three upstreams failing as they do in production — one whose
// certificate no CA nodecache trusts signed, one answering 429 with Docker Hub's
// ratelimit-remaining, one whose blob redirect names a CDN host that does not resolve — each show
// up with their reason in nodecache_upstream_failures_total, /nodecache/v1/upstreams and the log
// (the x509 text included); a 404 is not a failure; a success sets the last success; the rate
// limit gauge follows the header, ignores a malformed one and goes when the header does.
func TestUpstreamHealth(t *testing.T) {
	t.Parallel()
	clock := mirrortest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))

	// An upstream with a certificate from a CA nodecache is not given.
	tlsSrv := untrustedRegistry(t, "untrusted.test")
	_, tlsPort, _ := net.SplitHostPort(tlsSrv.Listener.Addr().String())

	// Docker Hub's rate limit, in front of a real registry.
	hub, _ := mirrortest.NewRegistryWithImage(t, "library/app", "latest", 2048)
	var limit rateLimited
	hub.Wrap(limit.wrap)

	// A registry whose blob GETs redirect to a CDN host that does not resolve.
	cdn, img := mirrortest.NewRegistryWithImage(t, "library/app", "latest", 2048)
	layer := digest.Digest(mirrortest.LayerDigests(t, img)[0].String())
	cdn.Intercept(http.MethodGet, "/blobs/", func(_ http.Handler, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://blocked-cdn.test:9/blobs/"+layer.Encoded()+"?sig=SECRET", http.StatusTemporaryRedirect)
	})

	good, _ := mirrortest.NewRegistryWithImage(t, "library/app", "latest", 2048)

	h := newHarness(t, mirror.Options{
		Upstreams: []regname.Upstream{
			parseUpstream(t, "untrusted.test=https://untrusted.test:"+tlsPort),
			upstreamFor(t, "hub.test", hub),
			upstreamFor(t, "cdn.test", cdn),
			upstreamFor(t, "good.test", good),
		},
		UpstreamResolver: blockedResolver{blocked: []string{"blocked-cdn.test"}},
		Clock:            clock.Now,
	})
	manifest := func(upstream, repo string) int {
		resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/"+repo+"/manifests/latest?ns="+upstream), manifestAccept)
		return resp.StatusCode
	}

	// Nothing has happened: the failure series are there at 0, no success, no rate limit.
	if got := failures(t, h, "hub.test", "http_429"); got != 0 {
		t.Fatalf("before any request: http_429 failures %v, want 0 (the series at 0)", got)
	}
	if got := metricValue(t, h, `nodecache_upstream_last_success_timestamp_seconds{tier="upstream",upstream="good.test"}`); got != -1 {
		t.Fatalf("before any request: last success %v, want no series", got)
	}

	// The untrusted certificate.
	if code := manifest("untrusted.test", "library/app"); code != http.StatusServiceUnavailable {
		t.Fatalf("untrusted certificate: status %d, want 503", code)
	}
	// 429 with ratelimit-remaining.
	limit.set(http.StatusTooManyRequests, "0;w=21600")
	if code := manifest("hub.test", "library/app"); code != http.StatusTooManyRequests {
		t.Fatalf("rate limited: status %d, want 429", code)
	}
	limit.set(http.StatusTooManyRequests, "76;w=21600")
	clock.Advance(time.Second)
	if code := manifest("hub.test", "library/app"); code != http.StatusTooManyRequests {
		t.Fatalf("rate limited: status %d, want 429", code)
	}
	if got := metricValue(t, h, `nodecache_upstream_ratelimit_remaining{upstream="hub.test"}`); got != 76 {
		t.Errorf("ratelimit remaining %v, want 76", got)
	}
	// The CDN host that does not resolve.
	resp, _ := get(t, http.MethodGet, fmtURL(h, "/v2/library/app/blobs/"+layer.String()+"?ns=cdn.test"), nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("blob behind an unresolvable redirect: status %d, want 503", resp.StatusCode)
	}
	h.waitIdle(t)
	// A 404 and a success.
	if code := manifest("good.test", "library/missing"); code != http.StatusNotFound {
		t.Fatalf("missing manifest: status %d, want 404", code)
	}
	clock.Advance(time.Second)
	if code := manifest("good.test", "library/app"); code != http.StatusOK {
		t.Fatalf("good upstream: status %d, want 200", code)
	}

	doc := upstreamsDoc(t, h)
	for _, c := range []struct {
		upstream, reason string
		n                float64
		cause            string
		noSuccess        bool
	}{
		{"untrusted.test", "tls", 1, "x509: certificate signed by unknown authority", true},
		{"hub.test", "http_429", 2, "HTTP 429", true},
		{"cdn.test", "redirect_host", 1, "blocked-cdn.test", false},
	} {
		if got := failures(t, h, c.upstream, c.reason); got != c.n {
			t.Errorf("%s: failures{reason=%q} %v, want %v", c.upstream, c.reason, got, c.n)
		}
		th := tierOf(doc, c.upstream, "upstream")
		switch {
		case th == nil:
			t.Errorf("%s: no upstream tier in the document %+v", c.upstream, doc)
			continue
		case th.Failures[c.reason] != int64(c.n) || len(th.Failures) != 1:
			t.Errorf("%s: failures %v, want only %s: %v", c.upstream, th.Failures, c.reason, c.n)
		case th.LastFailure == nil || th.LastFailure.Reason != c.reason || !strings.Contains(th.LastFailure.Cause, c.cause):
			t.Errorf("%s: last failure %+v, want reason %s and a cause naming %q", c.upstream, th.LastFailure, c.reason, c.cause)
		case !th.Failing || th.LastSuccess.IsZero() != c.noSuccess:
			// cdn.test answered the blob's HEAD itself: a success before the fill failed.
			t.Errorf("%s: failing %v, last success %v; want failing, a success only after a HEAD answered", c.upstream, th.Failing, th.LastSuccess)
		}
		lines := failureLines(t, h, c.upstream, c.reason)
		if len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0]["cause"]), c.cause) || lines[0]["level"] != "warn" {
			t.Errorf("%s: log lines %v, want one warning whose cause names %q (the second 429 within a minute is not logged)", c.upstream, lines, c.cause)
		}
	}
	if strings.Contains(h.logs.String(), "SECRET") {
		t.Errorf("the redirect's signed query reached the log")
	}
	// The CDN failure is the redirect's, not the registry's: no dns or connect for it.
	if got := failures(t, h, "cdn.test", "dns") + failures(t, h, "cdn.test", "connect"); got != 0 {
		t.Errorf("cdn.test: %v dns/connect failures, want the redirect_host alone", got)
	}
	if rl := upstreamOf(doc, "hub.test").RateLimit; rl == nil || rl.Remaining != 76 || rl.WindowSeconds != 21600 {
		t.Errorf("hub.test rate limit %+v, want 76 in 21600 s", rl)
	}

	// good.test: the 404 is no failure, the success is its last success.
	th := tierOf(doc, "good.test", "upstream")
	if th == nil || len(th.Failures) != 0 || th.LastFailure != nil || th.Failing || !th.LastSuccess.Equal(clock.Now()) {
		t.Errorf("good.test: %+v, want no failure and the last success at %v", th, clock.Now())
	}
	for _, r := range []string{"other", "http_5xx", "connect"} {
		if got := failures(t, h, "good.test", r); got != 0 {
			t.Errorf("good.test: the 404 counted as %s (%v)", r, got)
		}
	}
	// ... nor an error in the fetch durations the alert NodecacheUpstreamFailing reads.
	if got := metricValue(t, h, `nodecache_upstream_fetch_duration_seconds_count{kind="manifest",result="error",tier="upstream",upstream="good.test"}`); got > 0 {
		t.Errorf(`good.test: the 404 counted as result="error" in nodecache_upstream_fetch_duration_seconds (%v), want result="not_found"`, got)
	}
	if got := metricValue(t, h, `nodecache_upstream_fetch_duration_seconds_count{kind="manifest",result="not_found",tier="upstream",upstream="good.test"}`); got < 1 {
		t.Errorf(`good.test: nodecache_upstream_fetch_duration_seconds{result="not_found"} = %v after a 404, want >= 1`, got)
	}
	if got := metricValue(t, h, `nodecache_upstream_last_success_timestamp_seconds{tier="upstream",upstream="good.test"}`); got != float64(clock.Now().Unix()) {
		t.Errorf("good.test last success %v, want %d", got, clock.Now().Unix())
	}
	if got := metricValue(t, h, `nodecache_upstream_ratelimit_remaining{upstream="good.test"}`); got != -1 {
		t.Errorf("good.test sends no ratelimit-remaining, yet the gauge is %v", got)
	}

	// The rate limit lifts: a success with the header sets it; a malformed header is ignored; an
	// answer without it removes the series. hub.test is failing no longer.
	limit.set(0, "75;w=21600")
	clock.Advance(time.Second)
	if code := manifest("hub.test", "library/app"); code != http.StatusOK {
		t.Fatalf("hub.test after the limit: status %d, want 200", code)
	}
	if got := metricValue(t, h, `nodecache_upstream_ratelimit_remaining{upstream="hub.test"}`); got != 75 {
		t.Errorf("ratelimit remaining %v, want 75", got)
	}
	if th := tierOf(upstreamsDoc(t, h), "hub.test", "upstream"); th == nil || th.Failing || th.LastSuccess.IsZero() {
		t.Errorf("hub.test after a success: %+v, want not failing", th)
	}
	for _, bad := range []string{"74", "74;w=", "74; w=21600", "-1;w=21600", "74;w=0", "74;w=21600;x=1", "seventy;w=21600"} {
		limit.set(0, bad)
		if code := manifest("hub.test", "library/app"); code != http.StatusOK {
			t.Fatalf("hub.test: status %d, want 200", code)
		}
		if got := metricValue(t, h, `nodecache_upstream_ratelimit_remaining{upstream="hub.test"}`); got != 75 {
			t.Errorf("after the malformed ratelimit-remaining %q: gauge %v, want 75 unchanged", bad, got)
		}
	}
	limit.set(0, "")
	if code := manifest("hub.test", "library/app"); code != http.StatusOK {
		t.Fatalf("hub.test: status %d, want 200", code)
	}
	if got := metricValue(t, h, `nodecache_upstream_ratelimit_remaining{upstream="hub.test"}`); got != -1 {
		t.Errorf("answers without ratelimit-remaining, yet the gauge is %v", got)
	}
	if rl := upstreamOf(upstreamsDoc(t, h), "hub.test").RateLimit; rl != nil {
		t.Errorf("answers without ratelimit-remaining, yet the document says %+v", rl)
	}
}

// TestUpstreamHealthUntrustedAtAddress: an https upstream reached at an IP address (a private
// registry at 10.x, here 127.0.0.1) whose certificate no trusted CA signed is reason tls with the
// x509 text, as one reached by name is. go-containerregistry's ping also tries plain http for such
// an address, and the TLS port's "400 Bad Request" to that attempt was reported instead: reason
// other, cause "HTTP 400".
func TestUpstreamHealthUntrustedAtAddress(t *testing.T) {
	t.Parallel()
	srv := untrustedRegistry(t, "127.0.0.1")

	h := newHarness(t, mirror.Options{
		Upstreams: []regname.Upstream{parseUpstream(t, "private.test=https://"+srv.Listener.Addr().String())},
	})
	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/library/app/manifests/latest?ns=private.test"), manifestAccept)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "x509") {
		t.Errorf("untrusted certificate at an address: %d %q, want 503 naming the x509 error", resp.StatusCode, body)
	}
	if got := failures(t, h, "private.test", "tls"); got != 1 {
		t.Errorf("failures{reason=\"tls\"} %v, want 1 (other: %v)", got, failures(t, h, "private.test", "other"))
	}
	th := tierOf(upstreamsDoc(t, h), "private.test", "upstream")
	if th == nil || th.LastFailure == nil || th.LastFailure.Reason != "tls" ||
		!strings.Contains(th.LastFailure.Cause, "x509: certificate signed by unknown authority") {
		t.Errorf("document: %+v, want the last failure tls with the x509 text", th)
	}
	if lines := failureLines(t, h, "private.test", "tls"); len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0]["cause"]), "x509") {
		t.Errorf("log lines %v, want one whose cause has the x509 text", lines)
	}
}

// TestUpstreamHealthLogRate: failures of one upstream for one reason are logged once a minute of
// the injected clock, each line with the count since the line before it and the latest cause;
// what no line told yet is logged at Close.
func TestUpstreamHealthLogRate(t *testing.T) {
	t.Parallel()
	clock := mirrortest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	reg := mirrortest.NewRegistry(t)
	reg.Wrap(func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		})
	})
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "flaky.test", reg)}, Clock: clock.Now})
	fail := func(n int) {
		for i := range n {
			resp, _ := get(t, http.MethodGet, fmtURL(h, fmt.Sprintf("/v2/team/app%d/manifests/latest?ns=flaky.test", i)), manifestAccept)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", resp.StatusCode)
			}
		}
	}
	counts := func() []float64 {
		var out []float64
		for _, l := range failureLines(t, h, "flaky.test", "http_5xx") {
			out = append(out, l["count"].(float64))
		}
		return out
	}
	fail(3) // logged: the first; counted: all
	clock.Advance(59 * time.Second)
	fail(2)
	if got := fmt.Sprint(counts()); got != "[1]" {
		t.Fatalf("within the first minute: line counts %s, want [1]", got)
	}
	clock.Advance(time.Second)
	fail(1) // a minute after the first line: the 4 before it and itself
	if got := fmt.Sprint(counts()); got != "[1 5]" {
		t.Fatalf("after a minute: line counts %s, want [1 5]", got)
	}
	fail(2)
	if got := failures(t, h, "flaky.test", "http_5xx"); got != 8 {
		t.Errorf("failures %v, want 8 (every one counted)", got)
	}
	h.close(t)
	if got := fmt.Sprint(counts()); got != "[1 5 2]" {
		t.Fatalf("after Close: line counts %s, want [1 5 2]", got)
	}
	lines := failureLines(t, h, "flaky.test", "http_5xx")
	if c := fmt.Sprint(lines[1]["cause"]); !strings.Contains(c, "HTTP 503") {
		t.Errorf("cause %q does not name the status", c)
	}
	if lines[1]["since"] == nil {
		t.Errorf("the second line does not say since when it counts: %v", lines[1])
	}
}

// TestUpstreamsAccess: /nodecache/v1/upstreams follows the rule of client evidence: a client
// outside loopback and --allow gets 403 (counted as refused, reason allow).
func TestUpstreamsAccess(t *testing.T) {
	t.Parallel()
	reg := mirrortest.NewRegistry(t)
	h := newHarness(t, mirror.Options{Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", reg)},
		ClientEvidenceAllow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	for _, c := range []struct {
		remote string
		want   int
	}{{"127.0.0.1:4000", http.StatusOK}, {"10.1.2.3:4000", http.StatusOK}, {"192.0.2.7:4000", http.StatusForbidden}} {
		req := httptest.NewRequest(http.MethodGet, mirrorapi.UpstreamsPath, nil)
		req.RemoteAddr = c.remote
		rec := httptest.NewRecorder()
		h.m.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("from %s: %d %q, want %d", c.remote, rec.Code, rec.Body.String(), c.want)
		}
	}
	if got := metricValue(t, h, `nodecache_refused_total{reason="allow"}`); got != 1 {
		t.Errorf("refused{allow} %v, want 1", got)
	}
}

// TestUpstreamHealthStaleWarnsOnce (issue 25: one log line per upstream and reason per minute): a
// client polling a cached tag while its upstream answers 503 gets every answer stale, and the
// log warns once — the rate-limited "upstream failures" line with its cause — not once a request.
// Fails before: a "serving the cached tag" warning for each of the five requests.
func TestUpstreamHealthStaleWarnsOnce(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/app", "v1", mirrortest.Image(t, 1024, 1, "linux/amd64"))
	h := newHarnessFor(t, up)
	url := fmtURL(h, "/v2/upstream.test/team/app/manifests/v1")
	if resp, _ := get(t, http.MethodGet, url, manifestAccept); resp.StatusCode != http.StatusOK {
		t.Fatalf("first pull: %d", resp.StatusCode)
	}
	up.Wrap(func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		})
	})
	for i := range 5 {
		if resp, _ := get(t, http.MethodGet, url, manifestAccept); resp.StatusCode != http.StatusOK ||
			resp.Header.Get(mirrorapi.HeaderCache) != mirrorapi.CacheStale {
			t.Fatalf("poll %d with the upstream down: %d %s=%q, want 200 stale", i, resp.StatusCode, mirrorapi.HeaderCache, resp.Header.Get(mirrorapi.HeaderCache))
		}
	}
	var warns []map[string]any
	for _, l := range h.logs.JSONLines(t) {
		if l["level"] == "warn" {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || warns[0]["message"] != "upstream failures" || warns[0]["reason"] != "http_5xx" ||
		!strings.Contains(fmt.Sprint(warns[0]["cause"]), "503") {
		t.Fatalf("five stale answers logged %d warnings, want the one rate-limited upstream failures line (http_5xx, its cause):\n%v", len(warns), warns)
	}
}
