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
				Upstreams: []string{"ghcr.io=https://ghcr.io"}, UpstreamTimeout: time.Second}
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
