package bootstrap_test

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap"
)

// TestFallbacks: gen keeps an --upstream URL only when it is the registry itself; docker.io
// stays registry-1.docker.io; another host is refused (issue 11, http fallbacks).
func TestFallbacks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		in     []string
		want   map[string]string
		refuse string
	}{
		{"http private registry", []string{"registry.lan:5000=http://registry.lan:5000"}, map[string]string{"registry.lan:5000": "http://registry.lan:5000"}, ""},
		{"case and default port", []string{"Registry.LAN=HTTP://registry.lan:80"}, map[string]string{"registry.lan": "http://registry.lan"}, ""},
		{"https itself is the default", []string{"ghcr.io=https://ghcr.io:443", "quay.io=https://quay.io"}, map[string]string{}, ""},
		{"name alone", []string{"ghcr.io", "registry.lan:5000"}, map[string]string{}, ""},
		{"docker.io aliases", []string{"docker.io=https://registry-1.docker.io"}, map[string]string{}, ""},
		{"docker.io elsewhere", []string{"docker.io=https://mirror.gcr.io"}, nil, "docker.io's is https://registry-1.docker.io"},
		{"docker.io over http", []string{"docker.io=http://registry-1.docker.io"}, nil, "docker.io's is https://registry-1.docker.io"},
		{"another host", []string{"ghcr.io=https://cache.example:5000"}, nil, "names another host than ghcr.io"},
		{"another port", []string{"registry.lan:5000=http://registry.lan:5001"}, nil, "names another host"},
		{"bad url", []string{"ghcr.io=ftp://ghcr.io"}, nil, "scheme"},
		// serve's NAME=offline (issue 24) says nothing of where the registry is: the registry
		// itself stays the fallback, as for NAME alone (was a nil-pointer panic).
		{"offline", []string{"docker.io=offline", "registry.lan:5000=OFFLINE"}, map[string]string{}, ""},
		{"offline misspelt", []string{"ghcr.io=ofline"}, nil, "did you mean offline?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := bootstrap.Fallbacks(tc.in)
			if tc.refuse != "" {
				if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.refuse) {
					t.Fatalf("Fallbacks(%q) = %v, %v; want refusal with %q", tc.in, got, err, tc.refuse)
				}
				return
			}
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("Fallbacks(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}
