package integration

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/inventory"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
	"github.com/nodecache/nodecache/pkg/warm"
)

// TestAirGap (issue 24, the air-gap test): warm --to writes a bundle from a real upstream
// registry (an OCI image layout, and Talos's flat tree); skopeo copy … oci:DIR:TAG copies one
// more image; the upstream is stopped. Each bundle is imported (nodecache cache import's client)
// into a fresh serve whose upstreams are offline, with the two hand-written Talos image cache
// fixtures (pkg/bundle/testdata/talos, flat and OCI-wrapped); a real containerd 2.4 then pulls
// every image through the mirror by tag and by digest with no upstream at all, each tag pull
// well within the upstream timeout.
func TestAirGap(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)
	skopeo := runtimetest.Find(t, runtimetest.Skopeo)
	mirrortest.QuietLogrus()

	up := mirrortest.NewRegistry(t)
	host := nodecachetest.UpstreamHost(t, up, upstreamName) // upstream.test:<port>
	idx := mirrortest.MultiPlatformIndex(t, 64<<10, 2)
	up.PushIndex(t, "team/app", "v1", idx)
	tool := mirrortest.Image(t, 64<<10, 1, "linux/amd64")
	up.PushImage(t, "team/tool", "v2", tool)
	copied := mirrortest.Image(t, 32<<10, 2, "linux/amd64")
	up.PushImage(t, "team/copied", "v3", copied)

	bundles := map[bundle.Format]string{bundle.FormatOCI: t.TempDir(), bundle.FormatTalosFlat: t.TempDir()}
	for format, dir := range bundles {
		cfg := warm.Config{To: dir, Format: string(format), Upstreams: []string{host + "=http://" + host}, Platform: "linux/amd64",
			Concurrency: 2, BlobTimeout: time.Minute, Retries: 2, Deadline: time.Minute}
		opts, err := cfg.Options([]string{host + "/team/app:v1", host + "/team/tool:v2"})
		if err != nil {
			t.Fatal(err)
		}
		if rep, err := warm.Run(t.Context(), opts); err != nil || rep.Bundle == nil || !rep.Bundle.Written {
			t.Fatalf("warm --to %s --format %s: %v", dir, format, err)
		}
	}
	skopeoDir := filepath.Join(t.TempDir(), "layout")
	if out, err := exec.Command(skopeo, "copy", "--src-tls-verify=false", "docker://"+host+"/team/copied:v3", "oci:"+skopeoDir+":v3").CombinedOutput(); err != nil {
		t.Fatalf("skopeo copy: %v\n%s", err, out)
	}
	up.Stop()

	fixtures := filepath.Join("..", "..", "pkg", "bundle", "testdata", "talos")
	nc := airGapServe(t, host, []struct{ dir, ref string }{
		{bundles[bundle.FormatOCI], ""},
		{filepath.Join(fixtures, "flat"), ""},
		{filepath.Join(fixtures, "oci"), ""},
		{skopeoDir, host + "/team/copied"},
	})
	// warm --to's Talos flat tree, into a serve of its own: the same images, from the other layout.
	flat := airGapServe(t, host, []struct{ dir, ref string }{{bundles[bundle.FormatTalosFlat], ""}})
	alias, _ := name.PathAlias(host)
	for _, ref := range []string{flat.Host + "/" + alias + "/team/app:v1", flat.Host + "/" + alias + "/team/tool:v2"} {
		if _, err := nodecachetest.PullValid(t.Context(), ref); err != nil {
			t.Errorf("from warm --to's talos-flat bundle: pull %s: %v", ref, err)
		}
	}

	certs := t.TempDir()
	for _, h := range []string{host, "upstream.test:5000", "docker.io"} {
		writeHostsToml(t, filepath.Join(certs, name.HostDir(h), "hosts.toml"), "", h, nc.URL)
	}
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs})
	idxDigest, _ := idx.Digest()
	toolDigest, _ := tool.Digest()
	copiedDigest, _ := copied.Digest()
	for _, ref := range []string{
		host + "/team/app:v1", host + "/team/app@" + idxDigest.String(),
		host + "/team/tool:v2", host + "/team/tool@" + toolDigest.String(),
		host + "/team/copied:v3", host + "/team/copied@" + copiedDigest.String(),
		"upstream.test:5000/team/app:v1",
		"upstream.test:5000/team/app@sha256:c181f9599c32a5f37fb675ddc7fa732d1f5d3962bc1e0940e64b091746115b93",
		"upstream.test:5000/team/tool@sha256:f2ec797664ce11219716623977cb1f3bda91c333f51803b52e1f9bc534048a36",
		"docker.io/library/busybox:1.36",
	} {
		start := time.Now()
		if err := criPull(t, c, ref); err != nil {
			t.Errorf("containerd %s: pull %s: %v", c.Version(), ref, err)
			continue
		}
		if took := time.Since(start); took > airGapTimeout/3 {
			t.Errorf("pull %s took %s: it waited for an upstream (timeout %s)", ref, took, airGapTimeout)
		}
	}
	fromContainerd := 0
	for _, l := range nc.Requests(t) {
		if l.UserAgent == c.UserAgent() {
			fromContainerd++
		}
		if l.Status >= 400 && l.Kind != "base" {
			t.Errorf("nodecache answered %s %s?%s with %d", l.Method, l.Path, l.Query, l.Status)
		}
	}
	if fromContainerd == 0 {
		t.Error("nodecache logged no request of containerd's")
	}
}

// airGapTimeout is the upstream timeout of the air-gap serves: a pull that waited for it would
// show.
const airGapTimeout = 30 * time.Second

// airGapServe starts a fresh serve (storage on disk) whose upstreams host, upstream.test:5000 and
// docker.io are offline, and imports each bundle (dir, with ref as cache import's --ref) into it.
func airGapServe(t *testing.T, host string, bundles []struct{ dir, ref string }) *nodecachetest.Nodecache {
	t.Helper()
	var ups []name.Upstream
	for _, n := range []string{host, "upstream.test:5000", "docker.io"} {
		ups = append(ups, name.Upstream{Name: n, Offline: true})
	}
	nc := nodecachetest.Start(t, nodecachetest.Options{Upstreams: ups, Root: t.TempDir(), Run: true, UpstreamTimeout: airGapTimeout})
	cl, err := inventory.New(nc.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bundles {
		if _, err := cl.Import(t.Context(), b.dir, b.ref, nil); err != nil {
			t.Fatalf("import %s: %v", b.dir, err)
		}
	}
	return nc
}
