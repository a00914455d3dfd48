package mirror_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// clientFrom returns an HTTP client whose connections leave from the loopback address local
// (e.g. 127.0.0.2: Linux routes all of 127.0.0.0/8 to lo), so the mirror sees that address.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}}
}

// TestPullAllow (issue 13): --pull-allow gates every registry request; 127.0.0.1 is always
// served; the probes and metrics stay open; a refused client gets 403 DENIED with a message and
// Connection: close (issue 23: it holds no connection) and is counted; without --pull-allow
// everyone is served.
func TestPullAllow(t *testing.T) {
	t.Parallel()
	ten := netip.MustParsePrefix("10.0.0.0/8")
	two := netip.MustParsePrefix("127.0.0.2/32")
	type probe struct {
		from, path string
		want       int
	}
	manifest := "/v2/team/app/manifests/v1?ns=upstream.test"
	cases := []struct {
		name   string
		allow  []netip.Prefix
		probes []probe
		// refused is the nodecache_refused_total{reason="pull_allow"} count afterwards.
		refused int
	}{
		{name: "no pull-allow serves everyone", probes: []probe{
			{"127.0.0.2", "/v2/", 200}, {"127.0.0.2", manifest, 200}, {"127.0.0.1", manifest, 200},
		}},
		{name: "outside pull-allow refused, 127.0.0.1 served", allow: []netip.Prefix{ten}, refused: 4, probes: []probe{
			{"127.0.0.2", "/v2/", 403}, {"127.0.0.2", manifest, 403},
			{"127.0.0.2", "/v2/upstream.test/team/app/tags/list", 403},
			{"127.0.0.2", "/v2/nodecache-canary/probe/manifests/x?ns=upstream.test", 403},
			{"127.0.0.1", "/v2/", 200}, {"127.0.0.1", manifest, 200},
			{"127.0.0.2", "/healthz", 200}, {"127.0.0.2", "/readyz", 200}, {"127.0.0.2", "/metrics", 200},
			{"127.0.0.2", "/nodecache/v1/clients", 200}, // loopback: --allow's rule
		}},
		{name: "inside pull-allow served", allow: []netip.Prefix{ten, two}, probes: []probe{
			{"127.0.0.2", "/v2/", 200}, {"127.0.0.2", manifest, 200},
		}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			upstream, _ := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 4096)
			upstream.ResetRequests()
			h := newHarness(t, mirror.Options{
				Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", upstream)},
				PullAllow: tc.allow,
			})
			for _, p := range tc.probes {
				before := len(upstream.Requests())
				resp, body := send(t, clientFrom(p.from), newRequest(t, http.MethodGet, fmtURL(h, p.path), manifestAccept))
				if resp.StatusCode != p.want {
					t.Errorf("GET %s from %s: %d, want %d: %s", p.path, p.from, resp.StatusCode, p.want, body)
					continue
				}
				if p.want == http.StatusForbidden {
					if !resp.Close {
						t.Errorf("GET %s from %s: refused on a kept-alive connection; want Connection: close", p.path, p.from)
					}
					var e struct {
						Errors []struct{ Code, Message string }
					}
					if err := json.Unmarshal(body, &e); err != nil || len(e.Errors) != 1 || e.Errors[0].Code != "DENIED" ||
						!strings.Contains(e.Errors[0].Message, "127.0.0.2 is not among them") ||
						!strings.Contains(e.Errors[0].Message, "--pull-allow") {
						t.Errorf("GET %s from %s: body %s, want DENIED naming the address and --pull-allow", p.path, p.from, body)
					}
					if after := upstream.Requests(); len(after) != before {
						t.Errorf("refused GET %s reached the upstream: %+v", p.path, after[before:])
					}
				}
			}
			if got := metricValue(t, h, `nodecache_refused_total{reason="pull_allow"}`); got != float64(tc.refused) {
				t.Errorf(`nodecache_refused_total{reason="pull_allow"} = %v, want %d (-1: not exposed)`, got, tc.refused)
			}
			for _, l := range h.logs.requests(t) {
				if s, _ := l["status"].(float64); s == 403 && l["client"] == nil {
					t.Errorf("refused request logged without its client: %v", l)
				}
			}
		})
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
