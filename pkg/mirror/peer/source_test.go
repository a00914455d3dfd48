package peer_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror/peer"
)

func TestParseSource(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    []string // the static list's addresses
		str     string   // String(), when not in
		wantErr string   // a part of the error
	}{
		{in: "10.0.0.1:5001", want: []string{"10.0.0.1:5001"}},
		{in: "b:2, a:1,,a:1 ", want: []string{"a:1", "b:2"}, str: "b:2, a:1,,a:1"},
		{in: "[fd00::1]:5001,peer-0.nodecache:5001", want: []string{"[fd00::1]:5001", "peer-0.nodecache:5001"}},
		{in: "dns:nodecache-peers.kube-system.svc:5001"},
		{in: "file:/etc/nodecache/peers"},
		{in: "", wantErr: `--peers is empty; want "dns:NAME:PORT", "file:PATH" or "HOST:PORT,HOST:PORT,..."`},
		{in: " , ", wantErr: `the list is empty; want "dns:NAME:PORT"`},
		{in: "10.0.0.1", wantErr: `"10.0.0.1" has no port; want "dns:NAME:PORT"`},
		{in: "a:1,b", wantErr: `"b" has no port`},
		{in: "a:0", wantErr: `port "0" is not a number from 1 to 65535`},
		{in: "a:65536", wantErr: `port "65536" is not a number from 1 to 65535`},
		{in: "a:http", wantErr: `port "http" is not a number from 1 to 65535`},
		{in: ":5001", wantErr: `":5001" has no host`},
		{in: "fd00::1:5001", wantErr: `not HOST:PORT (an IPv6 address goes in brackets: [::1]:5001)`},
		{in: "https://peer:5001", wantErr: `unknown scheme "https"; want "dns:NAME:PORT", "file:PATH"`},
		{in: "srv:peers:5001", wantErr: `unknown scheme "srv"`},
		{in: "dns:peers", wantErr: `"dns:peers": no port after the name`},
		{in: "dns:peers:", wantErr: `"dns:peers:": no port; want`},
		{in: "dns::5001", wantErr: `no name before the port`},
		{in: "dns:[::1]:5001", wantErr: `"[::1]" is not a DNS name`},
		{in: "dns:peers:x", wantErr: `port "x" is not a number from 1 to 65535`},
		{in: "file:", wantErr: `"file:": no path after file:; want`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			src, err := peer.ParseSource(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseSource(%q) = %v, %v; want an error containing %q", tc.in, src, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSource(%q): %v", tc.in, err)
			}
			str := tc.str
			if str == "" {
				str = tc.in
			}
			if src.String() != str {
				t.Errorf("String() = %q; want %q", src.String(), str)
			}
			if tc.want == nil {
				return
			}
			got, err := src.Addresses(t.Context())
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("Addresses() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// fakeResolver answers LookupIPAddr from a table, or with err; it records the names asked.
type fakeResolver struct {
	ips   map[string][]net.IPAddr
	err   error
	asked chan string
}

func (r *fakeResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	r.asked <- host
	if r.err != nil {
		return nil, r.err
	}
	ips, ok := r.ips[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return ips, nil
}

func TestDNSSource(t *testing.T) {
	t.Parallel()
	r := &fakeResolver{asked: make(chan string, 10), ips: map[string][]net.IPAddr{
		"peers.svc": {{IP: net.ParseIP("10.0.0.2")}, {IP: net.ParseIP("fd00::1")}, {IP: net.ParseIP("10.0.0.1")}, {IP: net.ParseIP("10.0.0.2")}},
	}}
	src, err := peer.ParseSourceOptions("dns:peers.svc:5001", peer.SourceOptions{Resolver: r})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.1:5001", "10.0.0.2:5001", "[fd00::1]:5001"}
	for range 2 { // resolved again on every call
		got, err := src.Addresses(t.Context())
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("Addresses() = %q, %v; want %q", got, err, want)
		}
		if name := <-r.asked; name != "peers.svc" {
			t.Fatalf("resolver asked for %q; want peers.svc", name)
		}
	}
	r.ips["peers.svc"] = r.ips["peers.svc"][:1]
	if got, err := src.Addresses(t.Context()); err != nil || !slices.Equal(got, []string{"10.0.0.2:5001"}) {
		t.Fatalf("after a change, Addresses() = %q, %v", got, err)
	}

	gone, _ := peer.ParseSourceOptions("dns:none.svc:5001", peer.SourceOptions{Resolver: r})
	if got, err := gone.Addresses(t.Context()); err != nil || len(got) != 0 {
		t.Errorf("NXDOMAIN: Addresses() = %q, %v; want no addresses and no error", got, err)
	}
	r.err = &net.DNSError{Err: "server misbehaving", Name: "peers.svc", IsTemporary: true}
	if got, err := src.Addresses(t.Context()); !errors.As(err, new(*net.DNSError)) || !strings.Contains(err.Error(), "resolve peers peers.svc") {
		t.Errorf("SERVFAIL: Addresses() = %q, %v; want the resolver's error, wrapped", got, err)
	}
}

// writeFile replaces path's content the way a Kubernetes volume update does: a new file renamed
// over the old one (a new inode, so the change is seen whatever the mtime resolution).
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestFileSource(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "peers")
	src, err := peer.ParseSource("file:" + path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := src.Addresses(t.Context()); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("before the file exists: Addresses() = %q, %v; want a not-exist error", got, err)
	}
	addresses := func(want ...string) {
		t.Helper()
		got, err := src.Addresses(t.Context())
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("Addresses() = %q, %v; want %q", got, err, want)
		}
	}

	writeFile(t, path, "# the peers\n10.0.0.2:5001   # rack 2\n\n  10.0.0.1:5001  \n[fd00::1]:5001\n10.0.0.1:5001\n")
	addresses("10.0.0.1:5001", "10.0.0.2:5001", "[fd00::1]:5001")

	writeFile(t, path, "10.0.0.3:5001\n")
	addresses("10.0.0.3:5001")

	// Changed in place, same inode: the size tells.
	if err := os.WriteFile(path, []byte("10.0.0.3:5001\n10.0.0.4:5001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addresses("10.0.0.3:5001", "10.0.0.4:5001")

	// Invalid, then unreadable: the last good list stays.
	writeFile(t, path, "10.0.0.5:5001\n10.0.0.6\n")
	addresses("10.0.0.3:5001", "10.0.0.4:5001")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	addresses("10.0.0.3:5001", "10.0.0.4:5001")

	// Readable again, and empty (comments only): no peers.
	writeFile(t, path, "# none for now\n")
	addresses()
	writeFile(t, path, "10.0.0.7:5001\n")
	addresses("10.0.0.7:5001")

	// A mtime change alone (same inode and size) is a change too.
	if err := os.WriteFile(path, []byte("10.0.0.8:5001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	addresses("10.0.0.8:5001")
}

func TestFileSourceBadLine(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "peers")
	writeFile(t, path, "10.0.0.1:5001\n# x\nfd00::1:5001\n")
	src, err := peer.ParseSource("file:" + path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Addresses(t.Context())
	if err == nil || !strings.Contains(err.Error(), "line 3: ") || !strings.Contains(err.Error(), "want one HOST:PORT a line") {
		t.Fatalf("Addresses() error = %v; want line 3 named and what is accepted", err)
	}
}
