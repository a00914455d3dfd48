package mirror

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestPanicIsAnOCIError: a handler that panics before answering gives the client a 500 with an
// OCI error body, the log one JSON line with the stack as a field, and the access log and
// nodecache_requests_total the 500 actually sent. A panic after the headers cuts the
// connection and records the status that went out.
func TestPanicIsAnOCIError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		handler    http.HandlerFunc
		wantStatus int
	}{
		{"before headers", func(http.ResponseWriter, *http.Request) { panic("index out of range [-1]") }, http.StatusInternalServerError},
		{"after headers", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("partial"))
			w.(http.Flusher).Flush()
			panic("index out of range [-1]")
		}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logs := &mirrortest.LogBuffer{}
			u, _ := url.Parse("http://127.0.0.1:1")
			m, err := New(t.Context(), Options{Upstreams: []name.Upstream{{Name: "upstream.test", URL: u}}, Logger: zerolog.New(logs)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			m.read = func(_ context.Context, w http.ResponseWriter, r *http.Request, _ route) (outcome, error) {
				tc.handler(w, r)
				return outcome{}, nil
			}
			srv := httptest.NewServer(m)
			t.Cleanup(srv.Close)

			resp, err := http.Get(srv.URL + "/v2/upstream.test/team/app/tags/list")
			if tc.wantStatus == http.StatusInternalServerError {
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 500 || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" ||
					!strings.Contains(string(body), `{"errors":[{"code":"UNKNOWN"`) {
					t.Errorf("client got %d %q %s; want 500 with an OCI error body", resp.StatusCode, resp.Header.Get("Content-Type"), body)
				}
			} else if err == nil {
				_, rerr := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if rerr == nil {
					t.Error("a panic after the headers did not cut the response")
				}
			}
			var panics, access []map[string]any
			for _, l := range logs.JSONLines(t) {
				switch l["message"] {
				case "handler panicked":
					panics = append(panics, l)
				case "request":
					access = append(access, l)
				}
			}
			if len(panics) != 1 || !strings.Contains(panics[0]["stack"].(string), "goroutine") ||
				panics[0]["panic"] != "index out of range [-1]" || panics[0]["status"] != float64(tc.wantStatus) {
				t.Errorf("panic log lines: %v; want one with the panic, its status and the stack", panics)
			}
			if len(access) != 1 || access[0]["status"] != float64(tc.wantStatus) {
				t.Errorf("access log: %v; want one line with status %d", access, tc.wantStatus)
			}
			// The 200 went out as the header said: a hit (no upstream answered this handler).
			cache := ""
			if tc.wantStatus < 400 {
				cache = mirrorapi.CacheHit
			}
			if n := testutil.ToFloat64(m.metrics.requests.WithLabelValues("upstream.test", kindTags, "GET", strconv.Itoa(tc.wantStatus), cache)); n != 1 {
				t.Errorf("nodecache_requests_total{code=%d} = %v, want 1", tc.wantStatus, n)
			}
		})
	}
}
