package upstreamauth

import (
	"errors"
	"net/url"
	"testing"
)

// TestRealmAllowed: an upstream's credentials go to its own host, or to an https host on its
// registrable domain (http only for an http upstream); never to another site or a public
// suffix's other tenant.
func TestRealmAllowed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		upstream, target string
		ok               bool
	}{
		{"https://registry-1.docker.io", "https://auth.docker.io/token", true},
		{"https://registry-1.docker.io", "https://registry-1.docker.io/v2/x", true},
		{"https://ghcr.io", "https://ghcr.io/token", true},
		{"https://registry-1.docker.io", "http://auth.docker.io/token", false},
		{"https://registry-1.docker.io", "https://auth.docker.com/token", false},
		{"https://registry-1.docker.io", "https://evil.io/token", false},
		{"https://quay.io", "https://quay.io.evil.com/token", false},
		// A public suffix is not a registrable domain shared by its tenants.
		{"https://a.github.io", "https://b.github.io/token", false},
		{"https://registry.example.co.uk", "https://auth.example.co.uk/token", true},
		{"https://registry.example.co.uk", "https://auth.other.co.uk/token", false},
		{"http://registry.hub.test:5000", "http://auth.hub.test:5001/token", true},
		{"http://registry.hub.test:5000", "https://auth.hub.test/token", true},
		{"http://registry.hub.test:5000", "http://auth.elsewhere.test/token", false},
		{"https://registry.hub.test", "http://registry.hub.test/v2/", false},
		{"https://10.0.0.5:5000", "https://10.0.0.5:5001/token", true},
		{"https://10.0.0.5:5000", "https://10.0.0.6/token", false},
		{"http://localhost:5000", "http://localhost:5001/token", true},
		{"http://localhost:5000", "http://other:5001/token", false},
		{"https://Registry.Example.com.", "https://auth.example.com/token", true},
		{"https://registry.example.com", "ftp://auth.example.com/token", false},
	}
	for _, tc := range cases {
		u, _ := url.Parse(tc.upstream)
		tg, _ := url.Parse(tc.target)
		err := RealmAllowed(u, tg)
		if (err == nil) != tc.ok {
			t.Errorf("RealmAllowed(%s, %s) = %v, want ok=%v", tc.upstream, tc.target, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrRealmRefused) {
			t.Errorf("RealmAllowed(%s, %s): %v does not wrap ErrRealmRefused", tc.upstream, tc.target, err)
		}
	}
}
