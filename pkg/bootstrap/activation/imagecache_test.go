package activation

import (
	"strings"
	"testing"
)

// The hosts.toml files Talos writes while its image cache is on (issue 24). machined's
// RegistriesConfigController (siderolabs/talos,
// internal/app/machined/pkg/controllers/cri/registries_config.go) puts
// "http://" + constants.RegistrydListenAddress (127.0.0.1:3172) first in every registry's
// endpoints and adds a "*" entry when there is none; GenerateHosts and RenderTOML
// (internal/pkg/containers/cri/containerd/hosts.go) render each registry's endpoints in order
// with capabilities pull and resolve, with pelletier/go-toml v2's encoder (literal strings,
// indented tables), and put "*" in the directory _default. These are those renderings, for a
// machine config whose docker.io and ghcr.io mirror is nodecache (mirrorURL), and, with
// skipFallback, the last endpoint moved to the top-level server.
const (
	talosCacheThenMirror = `[host]
  [host.'http://127.0.0.1:3172']
    capabilities = ['pull', 'resolve']
  [host.'` + mirrorURL + `']
    capabilities = ['pull', 'resolve']
`
	talosCacheThenMirrorSkipFallback = `server = '` + mirrorURL + `'
capabilities = ['pull', 'resolve']
[host]
  [host.'http://127.0.0.1:3172']
    capabilities = ['pull', 'resolve']
`
	talosCacheOnly = `[host]
  [host.'http://127.0.0.1:3172']
    capabilities = ['pull', 'resolve']
`
	talosCacheThenOther = `[host]
  [host.'http://127.0.0.1:3172']
    capabilities = ['pull', 'resolve']
  [host.'https://mirror.gcr.io']
    capabilities = ['pull', 'resolve']
`
)

// newTalosNode is a Talos node (its /etc/os-release, its CRI containerd) with the image cache
// on: the "*" entry in _default, and hosts.toml for each registry given (directory name ->
// content).
func newTalosNode(t *testing.T, files map[string]string) *testNode {
	t.Helper()
	n := newTestNode(t)
	n.file("/etc/os-release", "NAME=\"Talos\"\nID=talos\nVERSION_ID=v1.13.8\n", t0)
	n.containerdProc(77, t0, "/system/run/containerd/containerd.sock")
	n.file(DefaultTalosHostsDir+"/_default/hosts.toml", talosCacheOnly, t0+50)
	for dir, content := range files {
		n.file(DefaultTalosHostsDir+"/"+dir+"/hosts.toml", content, t0+50)
	}
	return n
}

// TestTalosImageCache (issue 24): with Talos's image cache on, containerd tries registryd
// (http://127.0.0.1:3172) first for every registry, and the mirror after it. status judges the
// mirror as the first host after registryd: ACTIVE with the usual evidence (the hosts rows name
// the mirror, the report's mirror is nodecache's, not registryd), and NOT ACTIVE when the
// mirror is missing. Before, every registry was NOT ACTIVE ("first host is
// http://127.0.0.1:3172, not the mirror").
func TestTalosImageCache(t *testing.T) {
	t.Parallel()
	both := map[string]string{"docker.io": talosCacheThenMirror, "ghcr.io": talosCacheThenMirror}
	for _, tc := range []struct {
		name      string
		files     map[string]string
		upstreams []string
		state     State
		has       string
	}{
		{"mirror second", both, nil, Active, ""},
		{"mirror second, upstreams given", both, []string{"docker.io", "ghcr.io"}, Active, ""},
		{"mirror second with skipFallback", map[string]string{"docker.io": talosCacheThenMirrorSkipFallback}, []string{"docker.io"}, Active, ""},
		// ghcr.io has no directory of its own: containerd uses "*" (_default), registryd and
		// then ghcr.io itself.
		{"no mirror for one registry", map[string]string{"docker.io": talosCacheThenMirror}, []string{"docker.io", "ghcr.io"}, NotActive, "ghcr.io"},
		{"only the image cache", nil, []string{"docker.io"}, NotActive, "first host after Talos's image cache http://127.0.0.1:3172/v2 is https://registry-1.docker.io/v2, not the mirror"},
		{"another mirror after the image cache", map[string]string{"docker.io": talosCacheThenOther}, []string{"docker.io"}, NotActive, "first host after Talos's image cache http://127.0.0.1:3172/v2 is https://mirror.gcr.io/v2, not the mirror"},
		{"no mirror anywhere, no upstreams given", nil, nil, NotActive, "no registry mirror configured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newTalosNode(t, tc.files)
			r := n.evaluate(n.hostsOpts(t, tc.upstreams, mirrorURL))
			want(t, r, tc.state, tc.state.ExitCode(), tc.has)
			rt, ok := r.Runtime(RuntimeTalos)
			if !ok || len(r.Runtimes) != 1 {
				t.Fatalf("runtimes %+v: want talos alone\n%s", r.Runtimes, dump(r))
			}
			if tc.state != Active {
				if rt.Remedy == "" {
					t.Fatalf("NOT ACTIVE without a remedy\n%s", dump(r))
				}
				return
			}
			if rt.Mirror != mirrorURL+"/v2" || rt.Evidence != "live" {
				t.Fatalf("mirror %q evidence %q, want %s/v2 and live\n%s", rt.Mirror, rt.Evidence, mirrorURL, dump(r))
			}
			for up := range tc.files {
				c, ok := check(r, RuntimeTalos, "hosts "+up)
				if !ok || c.Result != Pass || !strings.Contains(c.Reason, "http://127.0.0.1:3172") || !strings.Contains(c.Reason, mirrorURL) {
					t.Fatalf("row hosts %s = %+v: want a pass naming the image cache and the mirror\n%s", up, c, dump(r))
				}
			}
		})
	}
}

// TestImageCacheOnlyOnTalos: the same files on a node that is not Talos (containerd 2.4 with
// config_path /etc/containerd/certs.d) are NOT ACTIVE: there, 127.0.0.1:3172 is whatever
// listens on it, and containerd pulls from it first.
func TestImageCacheOnlyOnTalos(t *testing.T) {
	t.Parallel()
	n := newContainerd24Node(t)
	n.file(certsDir+"/docker.io/hosts.toml", talosCacheThenMirror, t0+50)
	r := n.evaluate(n.hostsOpts(t, []string{"docker.io"}, mirrorURL))
	want(t, r, NotActive, 1, "first host is http://127.0.0.1:3172/v2, not the mirror")
}
