package mirror_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
)

// TestListenAddresses (newuser F19): --metrics-listen on the port --listen binds is refused
// before anything starts (it used to fail at the second bind, exit 1), and so is an empty
// bracketed host; distinct ports, and one host's port next to another host's, are accepted.
// Every accepted pair is then really bound, so the check cannot refuse what would work.
func TestListenAddresses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		listen, metrics string
		want            string // "" accepted
	}{
		{"127.0.0.1:5024", "127.0.0.1:5024", "would bind the same port"},
		{":5024", "127.0.0.1:5024", "would bind the same port"},
		{"127.0.0.1:5024", ":5024", "would bind the same port"},
		{"0.0.0.0:5024", "[::1]:5024", "would bind the same port"},
		{"[::]:5024", "127.0.0.1:5024", "would bind the same port"},
		{"LOCALHOST:5024", "localhost:5024", "would bind the same port"},
		{"[::1]:5024", "[0:0:0:0:0:0:0:1]:5024", "would bind the same port"},
		{"127.0.0.1:5000", "[]:9467", "empty brackets"},
		{"[]:5000", "", "empty brackets"},
		{"127.0.0.1:0", "127.0.0.1:0", ""},
		{"127.0.0.1:0", "", ""},
		{"127.0.0.1:0", "127.0.0.2:0", ""},
	} {
		t.Run(tc.listen+"_"+tc.metrics, func(t *testing.T) {
			t.Parallel()
			c := mirror.Config{Listen: tc.listen, MetricsListen: tc.metrics, Root: t.TempDir(),
				Upstreams: []string{"ghcr.io=https://ghcr.io"}, UpstreamTimeout: time.Second, FillTimeout: time.Hour}
			_, err := c.Options(zerolog.Nop())
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want one saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			for _, addr := range []string{tc.listen, tc.metrics} {
				if addr == "" {
					continue
				}
				l, err := net.Listen("tcp", addr)
				if err != nil {
					t.Fatalf("accepted but cannot bind %s: %v", addr, err)
				}
				defer l.Close()
			}
		})
	}
}

// TestBareUpstream (newuser F2): serve's --upstream NAME without =URL is the real registry
// called NAME (https://NAME; Docker Hub's API host for docker.io), as docs/serve.md and --help say.
func TestBareUpstream(t *testing.T) {
	t.Parallel()
	c := mirror.Config{Listen: ":5000", Root: t.TempDir(), UpstreamTimeout: time.Second, FillTimeout: time.Hour,
		Upstreams: []string{"docker.io", "ghcr.io", "registry.local:5005", "quay.io=http://127.0.0.1:5001"}}
	o, err := c.Options(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"docker.io": "https://registry-1.docker.io", "ghcr.io": "https://ghcr.io",
		"registry.local:5005": "https://registry.local:5005", "quay.io": "http://127.0.0.1:5001"}
	if len(o.Upstreams) != len(want) {
		t.Fatalf("upstreams %v, want %v", o.Upstreams, want)
	}
	for _, u := range o.Upstreams {
		if got := strings.TrimSuffix(u.URL.String(), "/"); got != want[u.Name] {
			t.Errorf("--upstream %s: URL %s, want %s", u.Name, got, want[u.Name])
		}
	}
}
