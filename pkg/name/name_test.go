package name_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/distribution/reference"

	"github.com/nodecache/nodecache/pkg/name"
)

func TestParseRegistry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
		refused  string // substring of the error; "" = accepted
	}{
		{in: "docker.io", want: "docker.io"},
		{in: " GHCR.IO ", want: "ghcr.io"},
		{in: "Registry.Local:5000", want: "registry.local:5000"},
		{in: "localhost:5001", want: "localhost:5001"},
		{in: "reg:05000", want: "reg:05000"},
		{in: "10.0.0.5:5000", want: "10.0.0.5:5000"},
		{in: "[::1]:5000", want: "[::1]:5000"},
		{in: "[::1]", want: "[::1]"},
		{in: "", refused: "empty registry name"},
		{in: "https://ghcr.io", refused: "no scheme, path or credentials"},
		{in: "ghcr.io/team", refused: "want a host"},
		{in: "user@ghcr.io", refused: "want a host"},
		{in: "reg:0", refused: "port 0 is out of range"},
		{in: "reg:65536", refused: "port 65536 is out of range"},
		{in: "reg:99999", refused: "out of range"},
		{in: "reg:", refused: "want a host"},
		{in: "my_reg.local", refused: "want a host"},
		{in: "[fe80::1%eth0]:5000", refused: "want a host"},
		{in: "[::::]:5000", refused: "not an IPv6 address"},
		{in: "-bad.io", refused: "want a host"},
		// FuzzParseRegistry found a 300-character name accepted whose path alias was no path
		// component; the longest DNS name is 253 characters, port included here.
		{in: strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 56) + ":5000",
			want: strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 56) + ":5000"},
		{in: strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 57) + ":5000",
			refused: "is 254 characters long: want at most 253"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := name.ParseRegistry(tc.in)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("ParseRegistry(%q) = %q, %v; want an error containing %q", tc.in, got, err, tc.refused)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseRegistry(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
			// Every accepted name is a registry host for distribution's reference grammar too.
			r, err := reference.ParseNamed(got + "/team/app")
			if err != nil || reference.Domain(r) != got {
				t.Fatalf("reference.ParseNamed(%q) = %v, %v: not a registry host", got+"/team/app", r, err)
			}
		})
	}
}

func TestAliases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, canonical, url string
		aliases            int
	}{
		{"docker.io", "docker.io", name.DockerHubURL, 3},
		{"index.docker.io", "docker.io", name.DockerHubURL, 3},
		{"Registry-1.Docker.IO", "docker.io", name.DockerHubURL, 3},
		{"ghcr.io", "ghcr.io", "https://ghcr.io", 1},
		{"docker.io:443", "docker.io:443", "https://docker.io:443", 1},
		{"hub.docker.com", "hub.docker.com", "https://hub.docker.com", 1},
		{"registry.local:5000", "registry.local:5000", "https://registry.local:5000", 1},
	} {
		if got := name.Canonical(tc.in); got != tc.canonical {
			t.Errorf("Canonical(%q) = %q, want %q", tc.in, got, tc.canonical)
		}
		if got := name.RegistryURL(tc.in); got != tc.url {
			t.Errorf("RegistryURL(%q) = %q, want %q", tc.in, got, tc.url)
		}
		al := name.Aliases(tc.in)
		if len(al) != tc.aliases || al[0] != tc.canonical {
			t.Errorf("Aliases(%q) = %v, want %d names starting with %q", tc.in, al, tc.aliases, tc.canonical)
		}
		for _, a := range al {
			if name.Canonical(a) != tc.canonical {
				t.Errorf("Canonical(%q) = %q: the alias table is not closed", a, name.Canonical(a))
			}
		}
	}
	// distribution's own normalisation agrees that index.docker.io is docker.io.
	r, err := reference.ParseNormalizedNamed("index.docker.io/library/alpine")
	if err != nil || reference.Domain(r) != name.Canonical("index.docker.io") {
		t.Errorf("reference normalises index.docker.io to %v (%v), Canonical says %q", r, err, name.Canonical("index.docker.io"))
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	want := []string{"docker.io=https://registry-1.docker.io", "ghcr.io=https://ghcr.io", "registry.k8s.io=https://registry.k8s.io", "quay.io=https://quay.io", "gcr.io=https://gcr.io"}
	ups := name.DefaultUpstreams()
	if len(ups) != len(want) {
		t.Fatalf("DefaultUpstreams = %v", ups)
	}
	for i, u := range ups {
		if u.String() != want[i] || name.DefaultNames()[i] != u.Name {
			t.Errorf("default[%d] = %s, want %s", i, u, want[i])
		}
		if _, err := name.ParseUpstream(u.String()); err != nil {
			t.Errorf("default %s does not parse: %v", u, err)
		}
	}
}

func TestParseUpstreams(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      []string
		want    []string
		refused string
	}{
		{"name only", []string{"GHCR.io", "docker.io"}, []string{"ghcr.io=https://ghcr.io", "docker.io=https://registry-1.docker.io"}, ""},
		{"name and url", []string{"registry.local:5000=HTTP://10.0.0.9:5000/"}, []string{"registry.local:5000=http://10.0.0.9:5000"}, ""},
		// Each thing said once (newuser F3: was `--upstream: upstream[0]: upstream "docker.io=ftp://x":
		// url "ftp://x": scheme ...`); the refused value is the whole message but for the reason.
		{"twice", []string{"ghcr.io", "GHCR.IO=http://x:1"}, nil, `--upstream: "ghcr.io" is configured twice`},
		{"alias twice", []string{"docker.io", "index.docker.io=http://x:1"}, nil, `--upstream: "index.docker.io" is configured twice (as "docker.io": the same registry)`},
		{"bad name", []string{"ghcr.io/x=http://x:1"}, nil, `--upstream: registry name "ghcr.io/x": want a host such as ghcr.io, registry.local:5000 or [::1]:5000 (no scheme, path or credentials)`},
		{"url scheme", []string{"docker.io=ftp://x"}, nil, `--upstream docker.io: URL "ftp://x": scheme "ftp": want http://HOST[:PORT] or https://HOST[:PORT]`},
		{"url path", []string{"ghcr.io=http://x:1/v2"}, nil, `--upstream ghcr.io: URL "http://x:1/v2": path "/v2" is not accepted: want http://HOST[:PORT] or https://HOST[:PORT] (the registry API is at /v2/ of the host)`},
		{"url no scheme", []string{"ghcr.io=10.0.0.5:5000"}, nil, `--upstream ghcr.io: URL "10.0.0.5:5000": no scheme: did you mean http://10.0.0.5:5000?`},
		{"url credentials not echoed", []string{"ghcr.io=http://me:s3cret@x"}, nil, `--upstream ghcr.io: URL "http://me:xxxxx@x": credentials`},
		{"url port", []string{"ghcr.io=http://x:0"}, nil, `--upstream ghcr.io: URL "http://x:0": port 0 is out of range`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ups, err := name.ParseUpstreams(tc.in)
			if tc.refused != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.refused) || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("ParseUpstreams(%q) err %v, want %q", tc.in, err, tc.refused)
				}
				return
			}
			if err != nil || len(ups) != len(tc.want) {
				t.Fatalf("ParseUpstreams(%q) = %v, %v", tc.in, ups, err)
			}
			for i := range ups {
				if ups[i].String() != tc.want[i] {
					t.Errorf("[%d] = %s, want %s", i, ups[i], tc.want[i])
				}
			}
		})
	}
}

func TestHostDir(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, tc := range []struct{ host, dir string }{
		{"ghcr.io", "ghcr.io"},
		{"docker.io", "docker.io"},
		{"registry.local:5000", "registry.local_5000_"},
		{"localhost:5001", "localhost_5001_"},
		{"[::1]:5000", "[::1]_5000_"},
	} {
		if got := name.HostDir(tc.host); got != tc.dir {
			t.Errorf("HostDir(%q) = %q, want %q", tc.host, got, tc.dir)
		}
		if got := name.HostFromDir(tc.dir); got != tc.host {
			t.Errorf("HostFromDir(%q) = %q, want %q", tc.dir, got, tc.host)
		}
		// containerd itself finds the directory under each name HostDirs gives, in that order:
		// alone, each candidate is found; all together, the first wins.
		dirs := name.HostDirs(tc.host)
		if dirs[0] != tc.dir || (tc.dir != tc.host) != (len(dirs) == 2) || (len(dirs) == 2 && dirs[1] != tc.host) {
			t.Errorf("HostDirs(%q) = %q", tc.host, dirs)
		}
		for _, d := range dirs {
			if got := name.HostFromDir(d); got != tc.host {
				t.Errorf("HostFromDir(%q) = %q, want %q", d, got, tc.host)
			}
			alone := t.TempDir()
			if err := os.MkdirAll(filepath.Join(alone, d), 0o755); err != nil {
				t.Fatal(err)
			}
			got, err := config.HostDirFromRoot(alone)(tc.host)
			if err != nil || got != filepath.Join(alone, d) {
				t.Errorf("containerd looks up %q in %q (%v), HostDirs says %q", tc.host, got, err, d)
			}
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		got, err := config.HostDirFromRoot(root)(tc.host)
		if err != nil || got != filepath.Join(root, dirs[0]) {
			t.Errorf("containerd looks up %q in %q (%v), HostDirs says %q first", tc.host, got, err, dirs[0])
		}
	}
	for _, dir := range []string{"_default", "my_reg_", "reg_x_", "_5000_", "plain"} {
		if got := name.HostFromDir(dir); got != dir {
			t.Errorf("HostFromDir(%q) = %q: not a host_port_ name, want it unchanged", dir, got)
		}
	}
}

func TestPathAlias(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, alias string
		ok          bool
	}{
		{"reg.local:5005", "reg.local_5005", true},
		{"localhost:5000", "localhost_5000", true},
		{"10.0.0.9:5000", "10.0.0.9_5000", true},
		{"my-reg.example.com:443", "my-reg.example.com_443", true},
		{"ghcr.io", "", false},
		{"[::1]:5000", "", false},
	} {
		a, ok := name.PathAlias(tc.name)
		if a != tc.alias || ok != tc.ok {
			t.Errorf("PathAlias(%q) = %q, %v; want %q, %v", tc.name, a, ok, tc.alias, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		// A valid repository path component: distribution accepts it as the first one.
		if _, err := reference.WithName(a + "/team/app"); err != nil {
			t.Errorf("PathAlias(%q) = %q is not a repository path component: %v", tc.name, a, err)
		}
		back, ok := name.ParsePathAlias(a)
		if !ok || back != tc.name {
			t.Errorf("ParsePathAlias(%q) = %q, %v; want %q", a, back, ok, tc.name)
		}
	}
	for _, c := range []string{"app", "app_", "_5000", "reg_0", "reg_99999", "reg_x", "Reg_5000", "a__5000"} {
		if n, ok := name.ParsePathAlias(c); ok {
			t.Errorf("ParsePathAlias(%q) = %q: want not an alias", c, n)
		}
	}
}
