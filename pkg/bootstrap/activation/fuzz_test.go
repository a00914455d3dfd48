package activation

import (
	"bytes"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker/config"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// FuzzStatusHostsTOML: `nodecache status` on a Talos node reads the hosts.toml Talos wrote for
// docker.io (data), with or without --mirror. Any file gives a report, never a panic or an
// error (evidence that cannot be read is a state, not a failure), with a state and a reason,
// JSON output, and nothing under the host root changed. ACTIVE only when containerd's own
// hosts parser tries the mirror first for docker.io, after Talos's image cache
// (http://127.0.0.1:3172, which Talos puts first while its image cache is on): --mirror, or
// without it a host other than docker.io's own that nodecache's own or adopted file names.
func FuzzStatusHostsTOML(f *testing.F) {
	f.Add([]byte("server = \"https://registry-1.docker.io\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"), true)
	f.Add([]byte("server = \"https://registry-1.docker.io\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\"]\n"), true)
	f.Add([]byte("# managed by nodecache\nserver = \"https://registry-1.docker.io\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"), false)
	f.Add([]byte("server = \"https://registry-1.docker.io\"\n[host.\"https://other.example\"]\n[host.\"http://127.0.0.1:5000\"]\n"), true)
	f.Add([]byte("[host.\"http://127.0.0.1:5000\"\n"), true)
	f.Add([]byte(talosCacheThenMirror), true)
	f.Add([]byte(talosCacheThenMirrorSkipFallback), true)
	f.Add([]byte(talosCacheOnly), true)
	f.Add([]byte("server = 5\n"), false)
	f.Add([]byte(""), true)
	f.Fuzz(func(t *testing.T, data []byte, withMirror bool) {
		n := newTestNode(t)
		n.file("/etc/os-release", "NAME=\"Talos\"\nID=talos\nVERSION_ID=v1.13.8\n", t0)
		n.containerdProc(77, t0, "/system/run/containerd/containerd.sock")
		n.file(DefaultTalosHostsDir+"/docker.io/hosts.toml", string(data), t0+50)
		o := n.opts()
		o.Upstreams = []string{"docker.io"}
		if withMirror {
			o.Mirror = parseMirror(t, mirrorURL)
			o.HTTPClient = &http.Client{Transport: answer{}}
		}
		var r *Report
		if err := bootstraptest.ReadOnly(t, n.Root, "status", func() (err error) {
			r, err = Evaluate(t.Context(), o)
			return err
		}); err != nil {
			t.Fatalf("Evaluate: %v", err)
		}
		switch r.State {
		case Active, NotActive, Unknown:
		default:
			t.Fatalf("state %q on a Talos node with a hosts.toml\n%s", r.State, dump(r))
		}
		if strings.TrimSpace(r.Reason) == "" && r.State != Active {
			t.Fatalf("state %s without a reason\n%s", r.State, dump(r))
		}
		var b bytes.Buffer
		if err := r.WriteJSON(&b); err != nil {
			t.Fatalf("JSON output: %v", err)
		}
		if r.State != Active {
			return
		}
		dir := filepath.Join(n.Root, DefaultTalosHostsDir, "docker.io")
		hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: func(string) (string, error) { return dir, nil }})
		list, err := hosts("docker.io")
		// Talos's image cache, first by Talos's design, is not the host judged.
		for err == nil && len(list) > 0 && list[0].Scheme == "http" && list[0].Host == "127.0.0.1:3172" {
			list = list[1:]
		}
		if err != nil || len(list) == 0 {
			t.Fatalf("ACTIVE, but containerd finds no host after Talos's image cache (%v)\n%s", err, dump(r))
		}
		first := list[0].Scheme + "://" + list[0].Host
		if withMirror && first != mirrorURL {
			t.Fatalf("ACTIVE, but containerd tries %s first, not --mirror %s\n%s", first, mirrorURL, dump(r))
		}
		// Without --mirror the mirror is the one nodecache's own or adopted file names (Options.Mirror).
		_, adopted := bcontainerd.AdoptedMirror(data)
		if !withMirror && (ownEndpoint(list[0], "docker.io") || !mirrorapi.Managed(data) && !adopted) {
			t.Fatalf("ACTIVE without --mirror, but containerd tries %s first and the file is not nodecache's\n%s", first, dump(r))
		}
	})
}
