package mirror

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestPinsByAddress (issue 24): pin, unpin and the pin list are accepted from loopback and the
// --allow networks only, the rule of /nodecache/v1/clients (a --pull-allow network is not
// enough): 403 otherwise, counted as reason="allow"; an accepted request goes on to the cache
// (503 here: the index is not loaded, as before Run).
func TestPinsByAddress(t *testing.T) {
	t.Parallel()
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
	spec := mirrorapi.CachePinsPath + "/ghcr.io/team/app:v1"
	refused := 0
	for _, from := range []string{"203.0.113.7:4000", "10.1.2.3:4000", "192.168.1.1:4000", "127.0.0.1:4000", "[::1]:4000"} {
		for _, rq := range []struct{ method, path string }{{http.MethodPut, spec}, {http.MethodDelete, spec}, {http.MethodGet, mirrorapi.CachePinsPath}} {
			req := httptest.NewRequest(rq.method, rq.path, nil)
			req.RemoteAddr = from
			rec := httptest.NewRecorder()
			m.ServeHTTP(rec, req)
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
	rec := httptest.NewRecorder()
	m.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if want := `nodecache_refused_total{reason="allow"} ` + "6\n"; refused != 6 || !strings.Contains(rec.Body.String(), want) {
		t.Errorf("refused %d; metrics lack %q", refused, want)
	}
}
