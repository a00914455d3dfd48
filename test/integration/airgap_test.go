package integration

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/inventory"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestAirGapImportContainerd (issue 24, the import half of the air-gap test): bundles imported
// into a fresh serve whose upstreams are not there at all — the two hand-written Talos image
// cache fixtures (pkg/bundle/testdata/talos, flat and OCI-wrapped) and a layout skopeo copy …
// oci:DIR:TAG wrote (imported with --ref) — are pulled by a real containerd 2.4 through the
// mirror, by tag and by digest, with no upstream anywhere; each tag pull takes far less than the
// upstream timeout (the upstreams' addresses refuse at once).
func TestAirGapImportContainerd(t *testing.T) {
	t.Parallel()
	bin := requireContainerd(t, runtimetest.EnvContainerd24)
	skopeo := runtimetest.LookPath(t, runtimetest.EnvSkopeo, "skopeo")
	mirrortest.QuietLogrus()

	// The skopeo layout, from a registry that is then stopped.
	src := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 64<<10, 2, "linux/amd64")
	src.PushImage(t, "team/copied", "v3", img)
	copied := filepath.Join(t.TempDir(), "layout")
	if out, err := exec.Command(skopeo, "copy", "--src-tls-verify=false", "docker://"+src.Addr+"/team/copied:v3", "oci:"+copied+":v3").CombinedOutput(); err != nil {
		t.Fatalf("skopeo copy: %v\n%s", err, out)
	}
	src.Stop()
	copiedDigest, _ := img.Digest()

	var ups []name.Upstream
	for _, n := range []string{"upstream.test:5000", "docker.io"} {
		u, err := name.ParseUpstream(n + "=http://" + nodecachetest.FreeAddr(t)) // nothing listens there
		if err != nil {
			t.Fatal(err)
		}
		ups = append(ups, u)
	}
	const timeout = 30 * time.Second
	nc := nodecachetest.Start(t, nodecachetest.Options{Upstreams: ups, Root: t.TempDir(), Run: true, UpstreamTimeout: timeout})
	for i := 0; !nc.Mirror.Inventory().Ready; i++ { // an import is answered 503 until the index is loaded
		if i == 400 {
			t.Fatal("the cache index was never loaded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cl, err := inventory.New(nc.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	fixtures := filepath.Join("..", "..", "pkg", "bundle", "testdata", "talos")
	for _, b := range []struct{ dir, ref string }{
		{filepath.Join(fixtures, "flat"), ""},
		{filepath.Join(fixtures, "oci"), ""},
		{copied, "upstream.test:5000/team/copied"},
	} {
		if _, err := cl.Import(t.Context(), b.dir, b.ref, nil); err != nil {
			t.Fatalf("import %s: %v", b.dir, err)
		}
	}

	certs := t.TempDir()
	for _, host := range []string{"upstream.test:5000", "docker.io"} {
		writeHostsToml(t, filepath.Join(certs, name.HostDir(host), "hosts.toml"), "", host, nc.URL)
	}
	c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs})
	for _, ref := range []string{
		"upstream.test:5000/team/app:v1",
		"upstream.test:5000/team/app@sha256:c181f9599c32a5f37fb675ddc7fa732d1f5d3962bc1e0940e64b091746115b93",
		"upstream.test:5000/team/tool@sha256:f2ec797664ce11219716623977cb1f3bda91c333f51803b52e1f9bc534048a36",
		"docker.io/library/busybox:1.36",
		"upstream.test:5000/team/copied:v3",
		"upstream.test:5000/team/copied@" + copiedDigest.String(),
	} {
		start := time.Now()
		if err := criPull(t, c, ref); err != nil {
			t.Errorf("containerd %s: pull %s: %v", c.Version(), ref, err)
			continue
		}
		if took := time.Since(start); took > timeout/3 {
			t.Errorf("pull %s took %s: it waited for an upstream (timeout %s)", ref, took, timeout)
		}
	}
	if ok, err := c.HasImage(t.Context(), "docker.io/library/busybox:1.36"); err != nil || !ok {
		t.Errorf("after the pulls, ImageStatus busybox:1.36 = %v, %v; want present", ok, err)
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
	t.Logf("containerd %s pulled through nodecache in %d requests", c.Version(), fromContainerd)
}
