package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	ncname "github.com/nodecache/nodecache/pkg/name"
)

// offlineServe starts a serve (its background work running, storage on disk) whose upstreams
// are the registry names given, every one offline (NAME=offline): whatever it serves, it serves
// from its cache.
func offlineServe(t *testing.T, names ...string) *nodecachetest.Nodecache {
	t.Helper()
	mirrortest.QuietLogrus()
	var ups []ncname.Upstream
	for _, n := range names {
		u, err := ncname.ParseUpstream(n + "=" + ncname.Offline)
		if err != nil {
			t.Fatal(err)
		}
		ups = append(ups, u)
	}
	nc := nodecachetest.Start(t, nodecachetest.Options{Upstreams: ups, Root: t.TempDir(), Run: true})
	return nc
}

// cacheLs is the serve's inventory as cache ls --output json prints it.
func cacheLs(t *testing.T, nc *nodecachetest.Nodecache) mirrorapi.CacheInventory {
	t.Helper()
	var inv mirrorapi.CacheInventory
	runAppJSON(t, &inv, "cache", "ls", "--listen-url", nc.URL, "--output", "json")
	return inv
}

// layoutOf writes an OCI image layout (go-containerregistry's layout package) of what up holds
// at each repo:tag of pairs, with the ref.name of the pair's second half ("" for none).
func layoutOf(t *testing.T, up *mirrortest.Registry, pairs ...[2]string) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range pairs {
		repo, tag, _ := strings.Cut(pr[0], ":")
		var opts []layout.Option
		if pr[1] != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": pr[1]}))
		}
		desc, err := remote.Get(up.Ref(t, repo, tag))
		if err != nil {
			t.Fatal(err)
		}
		if desc.MediaType.IsIndex() {
			idx, _ := desc.ImageIndex()
			err = p.AppendIndex(idx, opts...)
		} else {
			img, _ := desc.Image()
			err = p.AppendImage(img, opts...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestCacheImportOCILayout (issue 24, Bundles in): an OCI image layout written with
// go-containerregistry's layout package, each image named by its full reference, is imported
// into a serve whose upstream is offline (and stopped); the images are then pulled from it by tag
// and by digest, every blob checked, and cache ls lists them. Importing it again sends no blob.
func TestCacheImportOCILayout(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	idx := mirrortest.MultiPlatformIndex(t, 4096, 2)
	up.PushIndex(t, "team/app", "v1", idx)
	tool := mirrortest.Image(t, 8192, 1, "linux/amd64")
	up.PushImage(t, "team/tool", "v2", tool)
	dir := layoutOf(t, up, [2]string{"team/app:v1", "upstream.test/team/app:v1"}, [2]string{"team/tool:v2", "upstream.test/team/tool:v2"})
	up.Stop()

	nc := offlineServe(t, "upstream.test")
	code, out, errOut := runApp(t, "cache", "import", "--listen-url", nc.URL, dir)
	idxDigest, _ := idx.Digest()
	toolDigest, _ := tool.Digest()
	if code != 0 || !strings.Contains(out, "imported upstream.test/team/app:v1@"+idxDigest.String()) ||
		!strings.Contains(out, "imported upstream.test/team/tool:v2@"+toolDigest.String()) || !strings.Contains(errOut, "import: sending") {
		t.Fatalf("cache import: exit %d\n%s%s", code, out, errOut)
	}
	for _, ref := range []string{
		nc.Host + "/upstream.test/team/app:v1",
		nc.Host + "/upstream.test/team/app@" + idxDigest.String(),
		nc.Host + "/upstream.test/team/tool:v2",
		nc.Host + "/upstream.test/team/tool@" + toolDigest.String(),
	} {
		if _, err := nodecachetest.PullValid(t.Context(), ref); err != nil {
			t.Errorf("pull %s with the upstream gone: %v", ref, err)
		}
	}
	if inv := cacheLs(t, nc); len(inv.Images) != 2 {
		t.Errorf("cache ls after the import: %+v, want the 2 images", inv.Images)
	} else {
		for _, im := range inv.Images {
			if !im.Pinned {
				t.Errorf("cache ls after the import: %s@%s not pinned, want every imported image pinned", im.Repository, im.Digest)
			}
		}
		if inv.PinnedBytes == 0 {
			t.Errorf("cache ls after the import: pinned bytes 0, want the imported images' bytes")
		}
	}
	var again mirrorapi.ImportResult
	runAppJSON(t, &again, "cache", "import", "--listen-url", nc.URL, "--output", "json", dir)
	if again.BlobsStored != 0 || again.BlobsPresent == 0 || len(again.Images) != 2 {
		t.Errorf("import again = %+v, want no blob sent, every one already stored", again)
	}
}

// TestCacheImportPinLimit: imported images are pinned, and pins may hold at most 80% of
// --max-size. A bundle whose new bytes would take the pins over it is refused before anything is
// sent or stored (exit 1 naming the cap): storing it first would have the cache evict what it
// had just stored before the pins were taken (found by a new user's try: a 286 MiB image in a
// 287 MiB cap came back "not cached" with its blob left unreferenced). A bundle that fits is
// imported and pinned.
func TestCacheImportPinLimit(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	big := mirrortest.Image(t, 168<<10, 1, "linux/amd64")
	up.PushImage(t, "team/big", "v1", big)
	small := mirrortest.Image(t, 4<<10, 1, "linux/amd64")
	up.PushImage(t, "team/small", "v1", small)
	both := layoutOf(t, up, [2]string{"team/big:v1", "upstream.test/team/big:v1"}, [2]string{"team/small:v1", "upstream.test/team/small:v1"})
	smallOnly := layoutOf(t, up, [2]string{"team/small:v1", "upstream.test/team/small:v1"})
	up.Stop()

	mirrortest.QuietLogrus()
	u, err := ncname.ParseUpstream("upstream.test=" + ncname.Offline)
	if err != nil {
		t.Fatal(err)
	}
	const capBytes = 200 << 10 // 80% of it is below big, far above small
	nc := nodecachetest.Start(t, nodecachetest.Options{Upstreams: []ncname.Upstream{u}, Root: t.TempDir(), Run: true, MaxSize: capBytes})
	code, out, errOut := runApp(t, "cache", "import", "--listen-url", nc.URL, both)
	if code != 1 || !strings.Contains(errOut, "pins may hold at most 80% of --max-size") || !strings.Contains(errOut, "nothing was imported") {
		t.Errorf("cache import over the pinned share of the cap: exit %d\n%s%s\nwant exit 1 naming the cap, nothing imported", code, out, errOut)
	}
	if inv := cacheLs(t, nc); len(inv.Images) != 0 || inv.Blobs != 0 {
		t.Errorf("cache ls after the refused import: %d images, %d blobs, want nothing stored", len(inv.Images), inv.Blobs)
	}
	if code, out, errOut = runApp(t, "cache", "import", "--listen-url", nc.URL, smallOnly); code != 0 {
		t.Fatalf("cache import of a bundle that fits: exit %d\n%s%s", code, out, errOut)
	}
	smallDigest, _ := small.Digest()
	pinned := map[string]bool{}
	for _, im := range cacheLs(t, nc).Images {
		pinned[im.Repository] = im.Pinned
	}
	if !pinned["team/small"] {
		t.Errorf("cache ls after the import: team/small@%s not pinned (pins %v)", smallDigest, pinned)
	}
}

// TestCacheImportSkopeo: a layout skopeo writes with copy docker://… oci:DIR:TAG records the tag
// alone; cache import refuses it without --ref, naming --ref (exit 2, nothing stored), and
// imports it with --ref REGISTRY/REPOSITORY; the image is then pulled by tag and digest with
// the upstream stopped.
func TestCacheImportSkopeo(t *testing.T) {
	t.Parallel()
	skopeo := runtimetest.Find(t, runtimetest.Skopeo)
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 4096, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	dir := filepath.Join(t.TempDir(), "layout")
	if out, err := exec.Command(skopeo, "copy", "--src-tls-verify=false", "docker://"+up.Addr+"/team/app:v1", "oci:"+dir+":v1").CombinedOutput(); err != nil {
		t.Fatalf("skopeo copy: %v\n%s", err, out)
	}
	up.Stop()
	nc := offlineServe(t, "upstream.test")
	code, out, errOut := runApp(t, "cache", "import", "--listen-url", nc.URL, dir)
	if code != exitUsage || !strings.Contains(errOut, `is named by the tag "v1" alone (as skopeo copy … oci:DIR:TAG writes it): give its registry and repository with --ref REGISTRY/REPOSITORY`) {
		t.Fatalf("cache import without --ref: exit %d, want 2 naming --ref:\n%s%s", code, out, errOut)
	}
	if inv := cacheLs(t, nc); len(inv.Images) != 0 {
		t.Fatalf("cache ls after the refusal: %+v, want nothing", inv.Images)
	}
	code, out, errOut = runApp(t, "cache", "import", "--listen-url", nc.URL, "--ref", "upstream.test/team/app", dir)
	d, _ := img.Digest()
	if code != 0 || !strings.Contains(out, "imported upstream.test/team/app:v1@"+d.String()) {
		t.Fatalf("cache import --ref: exit %d\n%s%s", code, out, errOut)
	}
	for _, ref := range []string{nc.Host + "/upstream.test/team/app:v1", nc.Host + "/upstream.test/team/app@" + d.String()} {
		if _, err := nodecachetest.PullValid(t.Context(), ref); err != nil {
			t.Errorf("pull %s: %v", ref, err)
		}
	}
}

// TestCacheImportTalos: both Talos image cache fixtures (testdata written by hand from
// talosctl's cache.go rules, pkg/bundle/testdata/talos) are detected and imported into a serve
// whose upstreams upstream.test:5000 and docker.io are not there: the index (amd64 only) and the
// Docker image are pulled by tag, the image cached by digest alone by digest.
func TestCacheImportTalos(t *testing.T) {
	t.Parallel()
	for _, form := range []string{"flat", "oci"} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			nc := offlineServe(t, "upstream.test:5000", "docker.io")
			code, out, errOut := runApp(t, "cache", "import", "--listen-url", nc.URL, filepath.Join("..", "..", "pkg", "bundle", "testdata", "talos", form))
			if code != 0 || strings.Count(out, "imported ") != 3 {
				t.Fatalf("cache import: exit %d\n%s%s", code, out, errOut)
			}
			for _, ref := range []string{
				nc.Host + "/upstream.test_5000/team/app:v1",
				nc.Host + "/upstream.test_5000/team/tool@sha256:f2ec797664ce11219716623977cb1f3bda91c333f51803b52e1f9bc534048a36",
				nc.Host + "/docker.io/library/busybox:1.36",
			} {
				if _, err := nodecachetest.PullValid(t.Context(), ref); err != nil {
					t.Errorf("pull %s: %v", ref, err)
				}
			}
		})
	}
}

// TestCacheImportDamaged (issue 24): a bundle with one blob byte flipped, and one with a blob
// missing, is refused (exit 1) naming the blob, before anything is sent: cache ls stays empty
// and the images are not served. A bundle of a registry serve has no upstream for is refused
// (exit 2) naming the registry and --upstream.
func TestCacheImportDamaged(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 4096, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	ld := mirrortest.LayerDigests(t, img)[1]
	layer := filepath.Join("blobs", "sha256", ld.Hex)
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
		says   string
	}{
		{"flipped", func(dir string) error { return flipByte(filepath.Join(dir, layer)) }, "blob " + ld.String() + " does not match its digest"},
		{"missing", func(dir string) error { return os.Remove(filepath.Join(dir, layer)) }, "blob " + ld.String() + " (layer 2 of manifest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := layoutOf(t, up, [2]string{"team/app:v1", "upstream.test/team/app:v1"})
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			nc := offlineServe(t, "upstream.test")
			code, out, errOut := runApp(t, "cache", "import", "--listen-url", nc.URL, dir)
			if code != exitNegative || !strings.Contains(errOut, tc.says) || strings.Contains(errOut, "import: sending") {
				t.Fatalf("cache import: exit %d, want 1 saying %q before sending:\n%s%s", code, tc.says, out, errOut)
			}
			if inv := cacheLs(t, nc); len(inv.Images) != 0 || inv.Blobs != 0 {
				t.Errorf("cache ls after the refusal: %d images, %d blobs; want nothing", len(inv.Images), inv.Blobs)
			}
			if _, err := nodecachetest.PullValid(t.Context(), nc.Host+"/upstream.test/team/app:v1"); err == nil {
				t.Error("the image is served after a refused import")
			}
		})
	}
	t.Run("no upstream", func(t *testing.T) {
		t.Parallel()
		dir := layoutOf(t, up, [2]string{"team/app:v1", "quay.io/team/app:v1"})
		nc := offlineServe(t, "upstream.test")
		code, out, errOut := runApp(t, "cache", "import", "--listen-url", nc.URL, dir)
		want := "quay.io is not an upstream of this serve (configured: upstream.test): add it with serve --upstream quay.io[=URL]"
		if code != exitUsage || !strings.Contains(errOut, want) {
			t.Fatalf("cache import: exit %d, want 2 saying %q:\n%s%s", code, want, out, errOut)
		}
	})
}

func flipByte(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	b[len(b)/2] ^= 0xff
	return os.WriteFile(p, b, 0o644)
}

// TestCacheImportServerChecks: serve checks every blob itself before it stores anything: a tar
// stream whose blob does not match its digest (sent past the client's check) is answered 422
// naming the blob, and nothing is stored; a stream that leaves out a blob serve does not hold
// likewise.
func TestCacheImportServerChecks(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 4096, 2, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	dir := layoutOf(t, up, [2]string{"team/app:v1", "upstream.test/team/app:v1"})
	nc := offlineServe(t, "upstream.test")
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	for _, tc := range []struct {
		name string
		blob func(hex string, b []byte) []byte // nil: left out
		says string
	}{
		{"flipped", func(hex string, b []byte) []byte {
			if hex == ld.Hex {
				b[0] ^= 0xff
			}
			return b
		}, "blob " + ld.String() + " does not match its digest"},
		{"left out", func(hex string, b []byte) []byte {
			if hex == ld.Hex {
				return nil
			}
			return b
		}, "blob " + ld.String() + " is neither in the import nor stored in the cache"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status, body := postImport(t, nc.URL, dir, tc.blob)
			if status != http.StatusUnprocessableEntity || !strings.Contains(string(body), tc.says) {
				t.Fatalf("import: %d %s, want 422 saying %q", status, body, tc.says)
			}
			if inv := cacheLs(t, nc); len(inv.Images) != 0 || inv.Blobs != 0 {
				t.Errorf("cache ls after the refusal: %d images, %d blobs; want nothing", len(inv.Images), inv.Blobs)
			}
		})
	}
}

// postImport sends the layout in dir to serve's import endpoint as a tar stream built here (the
// plan from index.json's one image, then every file under blobs/ that is not a manifest, each
// through blob), and returns serve's answer: status and body.
func postImport(t *testing.T, base, dir string, blob func(hex string, b []byte) []byte) (int, []byte) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	ii, _ := p.ImageIndex()
	im, _ := ii.IndexManifest()
	img, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := img.RawManifest()
	m, _ := img.Manifest()
	plan := mirrorapi.ImportPlan{
		Images:    []mirrorapi.ImportImage{{Upstream: "upstream.test", Repository: "team/app", Tag: "v1", Digest: im.Manifests[0].Digest.String()}},
		Manifests: []mirrorapi.ImportManifest{{Digest: im.Manifests[0].Digest.String(), MediaType: string(m.MediaType), Raw: raw}},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, l := range append([]v1.Descriptor{m.Config}, m.Layers...) {
		plan.Blobs = append(plan.Blobs, mirrorapi.ImportBlob{Digest: l.Digest.String(), Size: l.Size})
	}
	pj, _ := json.Marshal(plan)
	_ = tw.WriteHeader(&tar.Header{Name: mirrorapi.ImportPlanEntry, Size: int64(len(pj)), Mode: 0o644})
	_, _ = tw.Write(pj)
	for _, l := range plan.Blobs {
		hex := strings.TrimPrefix(l.Digest, "sha256:")
		b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", hex))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if b = blob(hex, b); b == nil {
			continue
		}
		_ = tw.WriteHeader(&tar.Header{Name: mirrorapi.ImportBlobEntry(l.Digest), Size: int64(len(b)), Mode: 0o644})
		_, _ = tw.Write(b)
	}
	_ = tw.Close()
	resp, err := http.Post(base+mirrorapi.CacheImportPath, "application/x-tar", &buf)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}
