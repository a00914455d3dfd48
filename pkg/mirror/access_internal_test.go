package mirror

import (
	"bytes"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/upstreamauth"
)

// TestAccessStartLine (issue 13): one start-up line on a non-loopback listener without
// --pull-allow; a warning when upstream credentials are set; nothing on loopback or with
// --pull-allow.
func TestAccessStartLine(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"auths":{"ghcr.io":{"auth":"dTpw"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, err := upstreamauth.LoadCredentials(cfg, "ghcr.io", upstreamauth.CredentialsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, addr string
		pullAllow  bool
		creds      bool
		want       string // "" no line; else level:substring
	}{
		{name: "loopback", addr: "127.0.0.1:5000"},
		{name: "loopback v6", addr: "[::1]:5000", creds: true},
		{name: "localhost", addr: "localhost:5000", creds: true},
		{name: "all interfaces", addr: "[::]:5000", want: "info:every client that reaches this address may pull"},
		{name: "an address", addr: "10.0.0.5:5000", want: "info:(no --pull-allow)"},
		{name: "credentials without pull-allow", addr: "0.0.0.0:5000", creds: true, want: "warn:--upstream-auth credentials can read"},
		{name: "pull-allow set", addr: "0.0.0.0:5000", creds: true, pullAllow: true},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			opts := Options{
				Upstreams: []name.Upstream{{Name: "ghcr.io", URL: &url.URL{Scheme: "https", Host: "ghcr.io"}}},
			}
			if tc.pullAllow {
				opts.PullAllow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
			}
			if tc.creds {
				opts.UpstreamCredentials = map[string]*upstreamauth.Credentials{"ghcr.io": creds}
			}
			mirrortest.QuietLogrus()
			m, err := New(t.Context(), opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			m.log = zerolog.New(&buf)
			m.logAccess(tc.addr)
			lines := strings.Count(buf.String(), "\n")
			if tc.want == "" {
				if lines != 0 {
					t.Errorf("want no line, got %s", buf.String())
				}
				return
			}
			level, substr, _ := strings.Cut(tc.want, ":")
			if lines != 1 || !strings.Contains(buf.String(), `"level":"`+level+`"`) || !strings.Contains(buf.String(), substr) {
				t.Errorf("got %q, want one %s line containing %q", buf.String(), level, substr)
			}
		})
	}
}

// TestCertificateReload (issue 13): the listener's certificate is read again when the files a
// symlink swap points them at change, checked at most every CertificateRecheck; a broken pair
// keeps the certificate loaded before.
func TestCertificateReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca1, ca2 := mirrortest.NewCA(t), mirrortest.NewCA(t)
	for _, v := range []string{"v1", "v2"} {
		if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mirrortest.QuietLogrus()
	ca1.WriteFiles(t, filepath.Join(dir, "v1"), "tls", "127.0.0.1")
	ca2.WriteFiles(t, filepath.Join(dir, "v2"), "tls", "127.0.0.1")
	if err := os.Symlink("v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	clock := mirrortest.NewClock(time.Unix(1_700_000_000, 0))
	var logs bytes.Buffer
	c, err := LoadCertificate(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	c.now = clock.Now
	c.checked = c.now()
	issuer := func() string {
		t.Helper()
		crt, err := c.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(crt.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return string(leaf.AuthorityKeyId) // the signing CA's key
	}
	first := issuer()
	if err := os.Symlink("v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(CertificateRecheck - time.Second)
	if issuer() != first {
		t.Fatalf("certificate changed before %s", CertificateRecheck)
	}
	clock.Advance(time.Second)
	second := issuer()
	if second == first {
		t.Fatalf("certificate not reloaded after the swap and %s: %s", CertificateRecheck, logs.String())
	}
	// A key that no longer matches: the certificate loaded before stays.
	if err := os.WriteFile(filepath.Join(dir, "v2", "tls.key"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	clock.Advance(CertificateRecheck)
	if issuer() != second {
		t.Fatal("a broken pair replaced the certificate")
	}
	if !strings.Contains(logs.String(), "cannot reload the TLS certificate") {
		t.Errorf("the broken pair was not logged: %s", logs.String())
	}
}

// addressMirror is a mirror with --pull-allow 10.0.0.0/8 and --allow 192.168.0.0/16 in front of
// an upstream it never reaches: for the refusals by client address.
func addressMirror(t *testing.T) *Mirror {
	t.Helper()
	mirrortest.QuietLogrus()
	m, err := New(t.Context(), Options{
		Upstreams:           []name.Upstream{{Name: "ghcr.io", URL: &url.URL{Scheme: "https", Host: "ghcr.io"}}},
		PullAllow:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ClientEvidenceAllow: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// serveFrom is m's answer to method path from the client address from (host:port).
func serveFrom(m *Mirror, method, path, from string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, nil)
	req.RemoteAddr = from
	rec := httptest.NewRecorder()
	m.ServeHTTP(rec, req)
	return rec
}

// metricsText is m's /metrics in the Prometheus text format.
func metricsText(m *Mirror) string {
	rec := httptest.NewRecorder()
	m.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// TestRefusedByAddress: a registry request from an address outside --pull-allow and a
// client-evidence request from outside loopback and --allow are refused with 403 and counted by
// reason; an allowed network is served.
func TestRefusedByAddress(t *testing.T) {
	t.Parallel()
	m := addressMirror(t)
	for _, tc := range []struct {
		from, path string
		want       int
	}{
		{"203.0.113.7:4000", "/v2/", 403},
		{"[2001:db8::1]:4000", "/v2/", 403},
		{"[::ffff:203.0.113.7]:4000", "/v2/", 403},
		{"10.1.2.3:4000", "/v2/", 200},
		{"[::1]:4000", "/v2/", 200},
		{"203.0.113.7:4000", "/nodecache/v1/clients", 403},
		{"10.1.2.3:4000", "/nodecache/v1/clients", 403},
		{"192.168.1.1:4000", "/nodecache/v1/clients", 200},
		{"203.0.113.7:4000", "/healthz", 200},
		{"203.0.113.7:4000", "/metrics", 200},
	} {
		if rec := serveFrom(m, http.MethodGet, tc.path, tc.from); rec.Code != tc.want {
			t.Errorf("GET %s from %s: %d, want %d: %s", tc.path, tc.from, rec.Code, tc.want, rec.Body)
		}
	}
	metrics := metricsText(m)
	for _, want := range []string{`nodecache_refused_total{reason="pull_allow"} 3`, `nodecache_refused_total{reason="allow"} 2`} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestPinsByAddress (issue 24): pin, unpin and the pin list are accepted from loopback and the
// --allow networks only, the rule of /nodecache/v1/clients (a --pull-allow network is not
// enough): 403 otherwise, counted as reason="allow"; an accepted request goes on to the cache
// (503 here: the index is not loaded, as before Run).
func TestPinsByAddress(t *testing.T) {
	t.Parallel()
	m := addressMirror(t)
	spec := mirrorapi.CachePinsPath + "/ghcr.io/team/app:v1"
	refused := 0
	for _, from := range []string{"203.0.113.7:4000", "10.1.2.3:4000", "192.168.1.1:4000", "127.0.0.1:4000", "[::1]:4000"} {
		for _, rq := range []struct{ method, path string }{{http.MethodPut, spec}, {http.MethodDelete, spec}, {http.MethodGet, mirrorapi.CachePinsPath}} {
			rec := serveFrom(m, rq.method, rq.path, from)
			want := http.StatusServiceUnavailable
			if !strings.HasPrefix(from, "192.168.") && !strings.HasPrefix(from, "127.") && from != "[::1]:4000" {
				want = http.StatusForbidden
				refused++
			}
			if rec.Code != want || want == http.StatusForbidden && !strings.Contains(rec.Body.String(), "loopback and the --allow networks only") {
				t.Errorf("%s %s from %s: %d %s, want %d", rq.method, rq.path, from, rec.Code, rec.Body, want)
			}
		}
	}
	if want := `nodecache_refused_total{reason="allow"} ` + "6\n"; refused != 6 || !strings.Contains(metricsText(m), want) {
		t.Errorf("refused %d; metrics lack %q", refused, want)
	}
}
