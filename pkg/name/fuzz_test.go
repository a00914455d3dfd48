package name_test

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/distribution/reference"

	"github.com/nodecache/nodecache/pkg/name"
)

func FuzzParseRegistry(f *testing.F) {
	for _, s := range []string{"docker.io", "Registry.Local:5000", "[::1]:5000", "reg:0", "a/b", "", "x:99999", "[fe80::1%eth0]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := name.ParseRegistry(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParseRegistry(%q): empty error", s)
			}
			return
		}
		if n != strings.ToLower(n) {
			t.Fatalf("ParseRegistry(%q) = %q: not lower case", s, n)
		}
		if again, err := name.ParseRegistry(n); err != nil || again != n {
			t.Fatalf("ParseRegistry(%q) = %q, but that gives %q, %v", s, n, again, err)
		}
		if r, err := reference.WithName(n + "/x"); err != nil || reference.Domain(r) != n {
			t.Fatalf("ParseRegistry accepted %q, reference gives %v, %v", n, r, err)
		}
		if name.HostFromDir(name.HostDir(n)) != n && !strings.HasPrefix(n, "[") {
			t.Fatalf("HostFromDir(HostDir(%q)) = %q", n, name.HostFromDir(name.HostDir(n)))
		}
		if a, ok := name.PathAlias(n); ok {
			back, ok := name.ParsePathAlias(a)
			if !ok || back != n {
				t.Fatalf("ParsePathAlias(PathAlias(%q) = %q) = %q, %v", n, a, back, ok)
			}
			if _, err := reference.WithName(a + "/x"); err != nil {
				t.Fatalf("PathAlias(%q) = %q is not a path component: %v", n, a, err)
			}
		}
	})
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"http://h:5000", "HTTP://H:5000/", "http://[::1]:5000", "http://h:0", "http://h:99999",
		"http://h#x", "http://u:p@h", "http://h/x", "10.0.0.5:5000", "registry.local:5000", "", "http://h:5000?", "https://[::1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := name.ParseURL("--mirror", s)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "--mirror") {
				t.Fatalf("ParseURL(%q): error does not name the field: %s", s, msg)
			}
			// The value shown must not carry the password after the user name (the same
			// characters may be part of the user name, host or path, which are shown).
			var ue *name.URLError
			if pu, perr := url.Parse(s); perr == nil && pu.User != nil && errors.As(err, &ue) {
				// As url.Parse splits it: the authority ends at the first "/", "?" or "#", the
				// user information at its last "@", and the password follows its first ":".
				_, rest, _ := strings.Cut(ue.Value, "://")
				authority := rest
				if i := strings.IndexAny(rest, "/?#"); i >= 0 {
					authority = rest[:i]
				}
				at := strings.LastIndex(authority, "@")
				_, shown, _ := strings.Cut(authority[:max(at, 0)], ":")
				if p, set := pu.User.Password(); set && len(p) > 3 && shown != "xxxxx" && strings.Contains(shown, p) {
					t.Fatalf("ParseURL(%q): error shows the password: %s", s, msg)
				}
			}
			return
		}
		if u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil || (u.Scheme != "http" && u.Scheme != "https") {
			t.Fatalf("ParseURL(%q) = %#v: more than scheme://host[:port]", s, u)
		}
		if p := u.Port(); p != "" {
			if v, err := strconv.Atoi(p); err != nil || v < 1 || v > 65535 {
				t.Fatalf("ParseURL(%q) accepted port %q", s, p)
			}
		}
		again, err := name.ParseURL("--mirror", u.String())
		if err != nil || again.String() != u.String() {
			t.Fatalf("ParseURL(%q) = %s, which gives %v, %v", s, u, again, err)
		}
	})
}

func FuzzHostDir(f *testing.F) {
	for _, s := range []string{"ghcr.io", "reg_5000_", "_default", "a_b_c_", "_1_", "x_"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dir string) {
		h := name.HostFromDir(dir)
		if h != dir && name.HostDir(h) != dir {
			t.Fatalf("HostDir(HostFromDir(%q) = %q) = %q", dir, h, name.HostDir(h))
		}
	})
}

func FuzzParsePathAlias(f *testing.F) {
	for _, s := range []string{"reg.local_5005", "app", "a_1", "x_0", "_5", "a__5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, c string) {
		n, ok := name.ParsePathAlias(c)
		if !ok {
			return
		}
		if a, ok := name.PathAlias(n); !ok || a != c {
			t.Fatalf("ParsePathAlias(%q) = %q, but PathAlias gives %q, %v", c, n, a, ok)
		}
	})
}

func FuzzParseUpstream(f *testing.F) {
	for _, s := range []string{"ghcr.io", "docker.io=https://registry-1.docker.io", "reg:5000=http://10.0.0.9:5000/", "=", "a=b=c", "quay.io=offline", "quay.io=off-line"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := name.ParseUpstream(s)
		if err != nil {
			return
		}
		again, err := name.ParseUpstream(u.String())
		if err != nil || again.String() != u.String() {
			t.Fatalf("ParseUpstream(%q) = %s, which gives %v, %v", s, u, again, err)
		}
	})
}
