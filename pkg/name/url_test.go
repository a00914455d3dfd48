package name_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/name"
)

// TestParseMirror is the table of mirror URLs from issue 8, plus the edges around it. The CLI
// test (cmd/nodecache) feeds the same values to every command.
func TestParseMirror(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
		refused  string // the whole error message; "" = accepted
		loopback bool
	}{
		{in: "http://h:5000", want: "http://h:5000"},
		{in: "http://h:5000/", want: "http://h:5000"},
		{in: "HTTP://H:5000", want: "http://h:5000"},
		{in: " https://Cache.Example ", want: "https://cache.example"},
		{in: "http://[::1]:5000", want: "http://[::1]:5000", loopback: true},
		{in: "http://[::1]", want: "http://[::1]", loopback: true},
		{in: "http://127.0.0.1:5000", want: "http://127.0.0.1:5000", loopback: true},
		{in: "http://localhost:5000", want: "http://localhost:5000", loopback: true},
		{in: "http://localhost:5000/", want: "http://localhost:5000", loopback: true},
		{in: "http://app.localhost:5000", want: "http://app.localhost:5000", loopback: true},
		{in: "http://10.0.0.5:5000", want: "http://10.0.0.5:5000"},
		{in: "http://h:65535", want: "http://h:65535"},
		{in: "http://h:1", want: "http://h:1"},
		{in: "", refused: `--mirror: required: want http://HOST[:PORT] or https://HOST[:PORT], e.g. http://10.0.0.5:5000`},
		{in: "http://h:0", refused: `--mirror "http://h:0": port 0 is out of range: want 1 to 65535`},
		{in: "http://h:65536", refused: `--mirror "http://h:65536": port 65536 is out of range: want 1 to 65535`},
		{in: "http://h:99999", refused: `--mirror "http://h:99999": port 99999 is out of range: want 1 to 65535`},
		{in: "http://h:5x", refused: `--mirror "http://h:5x": not a URL (invalid port ":5x" after host): want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "http://h:", refused: `--mirror "http://h:": empty port: want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "http://h:5000#x", refused: `--mirror "http://h:5000#x": a fragment is not accepted: want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "http://h:5000#", refused: `--mirror "http://h:5000#": a fragment is not accepted: want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "http://u:secret@h:5000", refused: `--mirror "http://u:xxxxx@h:5000": credentials (user:password@) are not accepted: want http://HOST[:PORT] or https://HOST[:PORT]; nodecache pulls anonymously`},
		{in: "http://h:5000/v2", refused: `--mirror "http://h:5000/v2": path "/v2" is not accepted: want http://HOST[:PORT] or https://HOST[:PORT] (the registry API is at /v2/ of the host)`},
		{in: "http://h:5000/docker.io", refused: `--mirror "http://h:5000/docker.io": path "/docker.io" is not accepted: want http://HOST[:PORT] or https://HOST[:PORT] (the registry API is at /v2/ of the host)`},
		{in: "http://h:5000?ns=x", refused: `--mirror "http://h:5000?ns=x": a query is not accepted: want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "10.0.0.5:5000", refused: `--mirror "10.0.0.5:5000": no scheme: did you mean http://10.0.0.5:5000?`},
		{in: "registry.local:5000", refused: `--mirror "registry.local:5000": no scheme: did you mean http://registry.local:5000?`},
		{in: "Registry.Local", refused: `--mirror "Registry.Local": no scheme: did you mean http://registry.local?`},
		{in: "10.0.0.5:99999", refused: `--mirror "10.0.0.5:99999": no scheme: want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "ftp://h:21", refused: `--mirror "ftp://h:21": scheme "ftp": want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "http://", refused: `--mirror "http://": no host: want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "http://my_host:5000", refused: `--mirror "http://my_host:5000": host "my_host" is not a DNS name or IP address: want http://HOST[:PORT] or https://HOST[:PORT]`},
		{in: "http://h :5000", refused: `--mirror "http://h :5000": character ' ' at byte 8: want http://HOST[:PORT] or https://HOST[:PORT] (ASCII, no spaces)`},
		{in: "http://h:5000\n/x", refused: `--mirror "http://h:5000\n/x": character '\n' at byte 13: want http://HOST[:PORT] or https://HOST[:PORT] (ASCII, no spaces)`},
		// FuzzParseURL found the password shown beside a character refused before the credentials were.
		{in: "http://u:s3cret pass@h:5000", refused: `--mirror "http://xxxxx@h:5000": a space, control or non-ASCII character: want http://HOST[:PORT] or https://HOST[:PORT] (ASCII, no spaces)`},
		{in: "https://u:s3cret@h\u00e9", refused: `--mirror "https://u:xxxxx@h%C3%A9": a space, control or non-ASCII character: want http://HOST[:PORT] or https://HOST[:PORT] (ASCII, no spaces)`},
		{in: "http://[fe80::1%25eth0]:5000", refused: `--mirror "http://[fe80::1%25eth0]:5000": host [fe80::1%eth0] is not an IPv6 address without zone: want http://HOST[:PORT] or https://HOST[:PORT]`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			m, err := name.ParseMirror(tc.in)
			if tc.refused != "" {
				var ue *name.URLError
				if err == nil || err.Error() != tc.refused || !errors.As(err, &ue) {
					t.Fatalf("ParseMirror(%q) = %v, %v\nwant refused: %s", tc.in, m, err, tc.refused)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Fatalf("error shows the password: %v", err)
				}
				return
			}
			if err != nil || m.String() != tc.want || m.URL.String() != tc.want {
				t.Fatalf("ParseMirror(%q) = %v, %v; want %s", tc.in, m, err, tc.want)
			}
			if m.Loopback() != tc.loopback {
				t.Errorf("ParseMirror(%q).Loopback() = %v", tc.in, m.Loopback())
			}
			if m.HTTP() != strings.HasPrefix(tc.want, "http:") || m.Host() != strings.SplitN(tc.want, "://", 2)[1] {
				t.Errorf("ParseMirror(%q): HTTP %v, Host %q", tc.in, m.HTTP(), m.Host())
			}
			// Normalised output parses to itself.
			again, err := name.ParseMirror(m.String())
			if err != nil || again.String() != m.String() {
				t.Errorf("ParseMirror(%q) is not stable: %v, %v", m.String(), again, err)
			}
		})
	}
	// gen --remove runs without --mirror: every method of the zero Mirror answers (String ""
	// rather than a nil-pointer panic inside fmt's %s).
	var zero name.Mirror
	//nolint:staticcheck // S1025: fmt's %s verb itself is under test
	if !zero.IsZero() || zero.String() != "" || zero.HTTP() || zero.Loopback() || zero.Host() != "" || fmt.Sprintf("%s", zero) != "" {
		t.Error("the zero Mirror is not empty")
	}
}

// TestMirrorClusterDNS (issue 26): the Kubernetes DNS names of a Service or pod, with or without
// the cluster domain, and anything under cluster.local are cluster DNS names; addresses, other
// names and single labels are not.
func TestMirrorClusterDNS(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"http://nodecache-shared.nodecache.svc:5000":               true,
		"http://nodecache-shared.nodecache.svc.cluster.local:5000": true,
		"http://NodeCache-Shared.NodeCache.SVC.Cluster.Local:5000": true,
		"http://nodecache-regional.nodecache.svc.k8s.example:5000": true,
		"http://nodecache-0.nodecache-peers.nodecache.svc:5001":    true,
		"http://10-244-1-7.nodecache.pod.cluster.local:5000":       true,
		"http://10-244-1-7.nodecache.pod:5000":                     true,
		"http://anything.cluster.local:5000":                       true,
		"http://10.0.0.5:5000":                                     false,
		"http://[fd00::5]:5000":                                    false,
		"http://127.0.0.1:5000":                                    false,
		"http://registry.example.com:5000":                         false,
		"http://svc.example.com:5000":                              false,
		"http://cache.svc:5000":                                    false, // a host named cache in a domain svc
		"http://nodecache-shared:5000":                             false,
		"http://nodecache.local:5000":                              false,
		"https://registry.svc-team.example.com":                    false,
	} {
		m, err := name.ParseMirror(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := m.ClusterDNS(); got != want {
			t.Errorf("ParseMirror(%q).ClusterDNS() = %v, want %v", in, got, want)
		}
	}
	if (name.Mirror{}).ClusterDNS() {
		t.Error("the zero Mirror is a cluster DNS name")
	}
}
