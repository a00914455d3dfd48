package warm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bundle"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/refusal"
	"github.com/nodecache/nodecache/pkg/warm"
)

// upstreamSet is one real registry (distribution on loopback) holding, under its own name
// (127.0.0.1:PORT), a multi-platform index library/multi:v1 (linux/amd64, linux/arm64 and
// their attestation manifests) and a single linux/amd64 image tools/single:v2, and, as the
// docker.io upstream too, library/alpine:3.20 (another single image).
type upstreamSet struct {
	reg           *mirrortest.Registry
	name          string // 127.0.0.1:PORT
	idx           v1.ImageIndex
	single, hub   v1.Image
	ups           []string // --upstream values: NAME=http://127.0.0.1:PORT and docker.io=...
	multi, solo   string   // references of the index and of the single image
	alpine        string   // "alpine:3.20": docker.io by normalisation
	alpineRefName string   // its full reference, docker.io/library/alpine:3.20
}

func newUpstreamSet(t *testing.T) *upstreamSet {
	t.Helper()
	mirrortest.QuietLogrus()
	reg := mirrortest.NewRegistry(t)
	u := &upstreamSet{reg: reg, name: reg.Addr,
		idx:    mirrortest.MultiPlatformIndex(t, layerBytes, 2),
		single: mirrortest.Image(t, layerBytes, 2, "linux/amd64"),
		hub:    mirrortest.Image(t, layerBytes, 1, "linux/amd64"),
	}
	reg.PushIndex(t, "library/multi", "v1", u.idx)
	reg.PushImage(t, "tools/single", "v2", u.single)
	reg.PushImage(t, "library/alpine", "3.20", u.hub)
	u.ups = []string{reg.Addr + "=http://" + reg.Addr, "docker.io=http://" + reg.Addr}
	u.multi, u.solo, u.alpine = reg.Addr+"/library/multi:v1", reg.Addr+"/tools/single:v2", "alpine:3.20"
	u.alpineRefName = "docker.io/library/alpine:3.20"
	return u
}

func (u *upstreamSet) refs() []string { return []string{u.multi, u.solo, u.alpine} }

// toRun writes refs into dir (warm --to) from ups, as the command line gives it (warm.Config),
// with short backoffs; mod, when set, changes the options.
func toRun(t *testing.T, ctx context.Context, dir string, format bundle.Format, platform string, ups []string, mod func(*warm.Options), refs ...string) (*warm.Report, error) {
	t.Helper()
	cfg := warm.Config{To: dir, Format: string(format), Upstreams: ups, Platform: platform,
		Concurrency: 4, BlobTimeout: time.Minute, Retries: 2, Deadline: time.Minute}
	opts, err := cfg.Options(refs)
	if err != nil {
		return nil, err
	}
	var progress bytes.Buffer
	opts.Backoff, opts.MaxBackoff, opts.Progress = 10*time.Millisecond, 50*time.Millisecond, &progress
	if mod != nil {
		mod(&opts)
	}
	rep, err := warm.Run(ctx, opts)
	if rep != nil {
		var text bytes.Buffer
		_ = rep.WriteText(&text)
		t.Logf("warm --to %s (%s, %s) report:\n%s\nprogress:\n%s", dir, format, platform, text.String(), progress.String())
	}
	return rep, err
}

// mustWrite fails the test unless the bundle was written with every image.
func mustWrite(t *testing.T, rep *warm.Report, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("warm --to: %v", err)
	}
	if !rep.Warm || rep.Bundle == nil || !rep.Bundle.Written || rep.Error != "" {
		t.Fatalf("bundle not written: %+v %+v", rep.Bundle, rep.Images)
	}
}

// digestOf returns the sha256 digest of b.
func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// layoutEntries reads dir as an OCI image layout with go-containerregistry and returns its
// index.json entries by org.opencontainers.image.ref.name.
func layoutEntries(t *testing.T, dir string) (layout.Path, map[string]v1.Descriptor) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("read %s as an OCI image layout: %v", dir, err)
	}
	ii, err := p.ImageIndex()
	if err != nil {
		t.Fatalf("index.json: %v", err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		t.Fatalf("index.json: %v", err)
	}
	out := map[string]v1.Descriptor{}
	for _, d := range im.Manifests {
		out[d.Annotations["org.opencontainers.image.ref.name"]] = d
	}
	return p, out
}

// validStoredImage reads the image the layout in dir lists under ref and reports, naming what,
// what validate.Image finds wrong with it.
func validStoredImage(t *testing.T, dir, ref, what string) {
	t.Helper()
	p, entries := layoutEntries(t, dir)
	img, err := p.Image(entries[ref].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

func mustDigest(t *testing.T, x interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	d, err := x.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// skopeo runs skopeo (NODECACHE_SKOPEO; skipped with the reason where it is missing, failed in
// CI) with a throw-away HOME and returns its output.
func skopeo(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin := runtimetest.Find(t, runtimetest.Skopeo)
	cmd := exec.CommandContext(t.Context(), bin, append([]string{"--insecure-policy"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	return cmd.CombinedOutput()
}

// checkSkopeoDir checks what skopeo copy ... dir:OUT wrote: manifest.json is the manifest
// wantManifest names, and every blob file hashes to its name.
func checkSkopeoDir(t *testing.T, out string, wantManifest v1.Hash) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "manifest.json"))
	if err != nil {
		t.Fatalf("skopeo dir: %v", err)
	}
	if got := digestOf(b); got != wantManifest.String() {
		t.Errorf("skopeo copied manifest %s, want %s", got, wantManifest)
	}
	entries, _ := os.ReadDir(out)
	blobs := 0
	for _, e := range entries {
		if len(e.Name()) != 64 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(out, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if digestOf(b) != "sha256:"+e.Name() {
			t.Errorf("skopeo copied blob %s whose bytes hash to %s", e.Name(), digestOf(b))
		}
		blobs++
	}
	if blobs < 2 {
		t.Errorf("skopeo copied %d blobs, want config and layers", blobs)
	}
}

// TestToOCILayout (issue 24, bundles out): warm --to DIR writes an OCI image layout that
// go-containerregistry's layout package and skopeo read: one index.json entry per image under
// its full reference (the upstream's name with its port, repository, tag; Docker Hub as
// docker.io), each entry the index or manifest the upstream serves (same digest), and for one
// platform only that platform's manifest and blobs, every blob hashing to its name.
func TestToOCILayout(t *testing.T) {
	t.Parallel()
	u := newUpstreamSet(t)
	dir := filepath.Join(t.TempDir(), "bundle") // created by warm
	rep, err := toRun(t, t.Context(), dir, bundle.FormatOCI, "linux/amd64", u.ups, nil, u.refs()...)
	mustWrite(t, rep, err)
	if rep.Bundle.Format != bundle.FormatOCI || rep.Bundle.Existing {
		t.Errorf("report bundle %+v", rep.Bundle)
	}

	p, entries := layoutEntries(t, dir)
	if len(entries) != 3 {
		t.Fatalf("index.json lists %d images %v, want 3", len(entries), entries)
	}
	ii0, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im0, err := ii0.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{u.multi, u.solo, u.alpineRefName} {
		if got := im0.Manifests[i].Annotations["org.opencontainers.image.ref.name"]; got != want {
			t.Errorf("index.json entry %d is %s, want %s (the order given)", i, got, want)
		}
	}
	amd64, amd64Img := mirrortest.IndexChild(t, u.idx, 0)
	arm64, arm64Img := mirrortest.IndexChild(t, u.idx, 1)

	// The index, as the upstream serves it; its linux/amd64 image whole, linux/arm64 absent.
	e, ok := entries[u.multi]
	if !ok || e.Digest != mustDigest(t, u.idx) || !e.MediaType.IsIndex() {
		t.Fatalf("index.json entry %q = %+v, want the index %s", u.multi, e, mustDigest(t, u.idx))
	}
	if e.Annotations["io.containerd.image.name"] != u.multi {
		t.Errorf("io.containerd.image.name %q, want %q", e.Annotations["io.containerd.image.name"], u.multi)
	}
	ii, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := ii.ImageIndex(e.Digest)
	if err != nil {
		t.Fatalf("layout index %s: %v", e.Digest, err)
	}
	img, err := idx.Image(amd64)
	if err != nil {
		t.Fatalf("layout image %s: %v", amd64, err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("linux/amd64 image in the layout: %v", err)
	}
	for _, d := range append(mirrortest.BlobDigests(t, arm64Img), arm64.String()) {
		if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("linux/arm64 blob %s in a linux/amd64 bundle (%v)", d, err)
		}
	}
	for _, d := range mirrortest.BlobDigests(t, amd64Img) {
		if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))); err != nil {
			t.Errorf("linux/amd64 blob %s: %v", d, err)
		}
	}

	// The single images, by their full references.
	for name, want := range map[string]v1.Image{u.solo: u.single, u.alpineRefName: u.hub} {
		e, ok := entries[name]
		if !ok || e.Digest != mustDigest(t, want) {
			t.Fatalf("index.json entry %q = %+v, want %s", name, e, mustDigest(t, want))
		}
		img, err := p.Image(e.Digest)
		if err != nil {
			t.Fatalf("layout image %s: %v", name, err)
		}
		if err := validate.Image(img); err != nil {
			t.Errorf("%s in the layout: %v", name, err)
		}
	}
	checkBlobNames(t, filepath.Join(dir, "blobs", "sha256"), "")

	// skopeo reads it by the full reference, port included.
	out, err := skopeo(t, "inspect", "--raw", "oci:"+dir+":"+u.multi)
	if err != nil {
		t.Fatalf("skopeo inspect: %v\n%s", err, out)
	}
	if digestOf(out) != mustDigest(t, u.idx).String() {
		t.Errorf("skopeo inspect --raw gave %s, want the index %s", digestOf(out), mustDigest(t, u.idx))
	}
	for name, want := range map[string]v1.Hash{u.multi: amd64, u.solo: mustDigest(t, u.single), u.alpineRefName: mustDigest(t, u.hub)} {
		dst := t.TempDir()
		if out, err := skopeo(t, "copy", "--override-os", "linux", "--override-arch", "amd64", "oci:"+dir+":"+name, "dir:"+dst); err != nil {
			t.Fatalf("skopeo copy oci:%s:%s: %v\n%s", dir, name, err, out)
		}
		checkSkopeoDir(t, dst, want)
	}
}

// checkBlobNames checks that every file in dir hashes to its name (prefix "" for blobs/sha256/,
// "sha256-" for Talos's blob/), and returns how many there are.
func checkBlobNames(t *testing.T, dir, prefix string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got := digestOf(b); "sha256:"+strings.TrimPrefix(e.Name(), prefix) != got {
			t.Errorf("%s/%s holds bytes hashing to %s", dir, e.Name(), got)
		}
	}
	return len(entries)
}

// TestToAllPlatforms: --platform all keeps every manifest of the index — both platforms and
// their attestation manifests — with their blobs, so the whole index validates and skopeo copies
// every instance (--multi-arch all); the same index written for one platform does not.
func TestToAllPlatforms(t *testing.T) {
	t.Parallel()
	u := newUpstreamSet(t)
	dir := t.TempDir()
	rep, err := toRun(t, t.Context(), dir, bundle.FormatOCI, "all", u.ups, nil, u.multi)
	mustWrite(t, rep, err)
	if rep.Platform != "all" || rep.Images[0].Platform != "all" || rep.Images[0].Manifests != 5 {
		t.Errorf("report platform %q, image %+v: want all, 5 manifests (index, 2 images, 2 attestations)", rep.Platform, rep.Images[0])
	}
	p, entries := layoutEntries(t, dir)
	ii, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := ii.ImageIndex(entries[u.multi].Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Every entry (validate.Index would also demand platform fields in the attestations'
	// configs, which BuildKit does not write): each image whole, its blobs hashing to their
	// digests.
	children, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range children.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatalf("--platform all: entry %s (%v): %v", d.Digest, d.Platform, err)
		}
		if err := validate.Image(img); err != nil {
			t.Errorf("--platform all: entry %s (%v): %v", d.Digest, d.Platform, err)
		}
	}
	allOut := t.TempDir()
	if out, err := skopeo(t, "copy", "--multi-arch", "all", "oci:"+dir+":"+u.multi, "dir:"+allOut); err != nil {
		t.Fatalf("skopeo copy --multi-arch all: %v\n%s", err, out)
	}

	one := t.TempDir()
	rep, err = toRun(t, t.Context(), one, bundle.FormatOCI, "linux/arm64", u.ups, nil, u.multi)
	mustWrite(t, rep, err)
	if out, err := skopeo(t, "copy", "--multi-arch", "all", "oci:"+one+":"+u.multi, "dir:"+t.TempDir()); err == nil {
		t.Errorf("skopeo copied every platform from a linux/arm64 bundle:\n%s", out)
	}
	if all, single := checkBlobNames(t, filepath.Join(dir, "blobs", "sha256"), ""), checkBlobNames(t, filepath.Join(one, "blobs", "sha256"), ""); all <= single {
		t.Errorf("--platform all stored %d blobs, one platform %d", all, single)
	}
}

// TestToTalosFlat: --format talos-flat writes the tree of siderolabs/talos
// pkg/imager/cache/cache.go: configs and layers as blob/sha256-<hex> (only the platform's), every
// manifest walked as manifests/<registry>/<repository>/digest/sha256-<hex>, each tag as
// .../reference/<tag> holding the bytes of what it names; the port written _port_, Docker Hub as
// docker.io. With --platform all every manifest of the index is there.
func TestToTalosFlat(t *testing.T) {
	t.Parallel()
	u := newUpstreamSet(t)
	dir := t.TempDir()
	rep, err := toRun(t, t.Context(), dir, bundle.FormatTalosFlat, "linux/amd64", u.ups, nil, u.multi, u.alpine)
	mustWrite(t, rep, err)

	host, port, _ := strings.Cut(u.name, ":")
	regDir := filepath.Join(dir, "manifests", host+"_"+port+"_")
	raw := func(x interface{ RawManifest() ([]byte, error) }) []byte {
		b, err := x.RawManifest()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	amd64, amd64Img := mirrortest.IndexChild(t, u.idx, 0)
	arm64, arm64Img := mirrortest.IndexChild(t, u.idx, 1)
	want := map[string][]byte{
		filepath.Join(regDir, "library/multi/reference/v1"):                                              raw(u.idx),
		filepath.Join(regDir, "library/multi/digest/sha256-"+mustDigest(t, u.idx).Hex):                   raw(u.idx),
		filepath.Join(regDir, "library/multi/digest/sha256-"+amd64.Hex):                                  raw(amd64Img),
		filepath.Join(dir, "manifests/docker.io/library/alpine/reference/3.20"):                          raw(u.hub),
		filepath.Join(dir, "manifests/docker.io/library/alpine/digest/sha256-"+mustDigest(t, u.hub).Hex): raw(u.hub),
	}
	for p, b := range want {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if !bytes.Equal(got, b) {
			t.Errorf("%s: not the upstream's manifest bytes", p)
		}
	}
	if _, err := os.Stat(filepath.Join(regDir, "library/multi/digest/sha256-"+arm64.Hex)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("linux/arm64 manifest in a linux/amd64 tree (%v)", err)
	}
	for _, d := range append(mirrortest.BlobDigests(t, amd64Img), mirrortest.BlobDigests(t, u.hub)...) {
		if _, err := os.Stat(filepath.Join(dir, "blob", strings.Replace(d, ":", "-", 1))); err != nil {
			t.Errorf("blob %s: %v", d, err)
		}
	}
	for _, d := range mirrortest.BlobDigests(t, arm64Img) {
		if _, err := os.Stat(filepath.Join(dir, "blob", strings.Replace(d, ":", "-", 1))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("linux/arm64 blob %s in a linux/amd64 tree (%v)", d, err)
		}
	}
	checkBlobNames(t, filepath.Join(dir, "blob"), "sha256-")
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("tree top holds %v, want only blob/ and manifests/", entries)
	}

	all := t.TempDir()
	rep, err = toRun(t, t.Context(), all, bundle.FormatTalosFlat, "all", u.ups, nil, u.multi)
	mustWrite(t, rep, err)
	im, err := u.idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if _, err := os.Stat(filepath.Join(all, "manifests", host+"_"+port+"_", "library/multi/digest/sha256-"+d.Digest.Hex)); err != nil {
			t.Errorf("--platform all: manifest %s (%s): %v", d.Digest, d.Platform, err)
		}
	}
}

// failOn makes u's registry answer GETs of blob d with status (every attempt), or, with
// status 0, hang until the request ends; it returns a channel closed at the first such request.
func failOn(u *upstreamSet, d string, status int) <-chan struct{} {
	hit := make(chan struct{})
	var once sync.Once
	u.reg.Intercept(http.MethodGet, "/blobs/"+d, func(_ http.Handler, w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(hit) })
		if status == 0 {
			<-r.Context().Done()
			return
		}
		http.Error(w, "injected", status)
	})
	return hit
}

// flipLastByte makes u's registry serve blob d with its last byte flipped (same length).
func flipLastByte(u *upstreamSet, d string) {
	u.reg.Intercept(http.MethodGet, "/blobs/"+d, func(next http.Handler, w http.ResponseWriter, r *http.Request) {
		rec := capture(next, r)
		if n := len(rec.body); n > 0 {
			rec.body[n-1] ^= 0xff
		}
		rec.replay(w, len(rec.body))
	})
}

// captured records a response (distribution answers a blob GET with a redirect-free 200).
type captured struct {
	header http.Header
	status int
	body   []byte
}

// capture records next's whole answer to r.
func capture(next http.Handler, r *http.Request) *captured {
	rec := &captured{header: http.Header{}}
	next.ServeHTTP(rec, r)
	return rec
}

// replay writes the recorded header and status to w, then the first n bytes of the body.
func (c *captured) replay(w http.ResponseWriter, n int) {
	for k, v := range c.header {
		w.Header()[k] = v
	}
	w.WriteHeader(c.status)
	_, _ = w.Write(c.body[:n])
}

func (c *captured) Header() http.Header { return c.header }
func (c *captured) WriteHeader(s int)   { c.status = s }
func (c *captured) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body = append(c.body, b...)
	return len(b), nil
}

// visible reports whether dir looks like a complete bundle of format f to a reader: index.json
// (OCI) or manifests/ (Talos).
func visible(dir string, f bundle.Format) bool {
	p := filepath.Join(dir, "index.json")
	if f == bundle.FormatTalosFlat {
		p = filepath.Join(dir, "manifests")
	}
	_, err := os.Stat(p)
	return err == nil
}

// TestToFailureLeavesNoBundle: a blob the upstream keeps failing (500), serves damaged (one
// byte flipped) or never finishes while the run is stopped leaves no bundle that looks
// complete — no index.json, no manifests/ — and no damaged blob; skopeo and go-containerregistry
// refuse the directory. The next run, with the upstream well again, writes the bundle and takes
// the blobs already stored (verified) without fetching them again.
func TestToFailureLeavesNoBundle(t *testing.T) {
	t.Parallel()
	for _, f := range bundle.Formats() {
		for _, fault := range []string{"500", "flipped byte", "stopped"} {
			t.Run(string(f)+"/"+fault, func(t *testing.T) {
				t.Parallel()
				u := newUpstreamSet(t)
				layer := mirrortest.LayerDigests(t, u.single)[1].String()
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				switch fault {
				case "500":
					failOn(u, layer, http.StatusInternalServerError)
				case "flipped byte":
					flipLastByte(u, layer)
				case "stopped":
					hit := failOn(u, layer, 0)
					go func() {
						<-hit
						cancel()
					}()
				}
				dir := t.TempDir()
				rep, err := toRun(t, ctx, dir, f, "linux/amd64", u.ups, nil, u.refs()...)
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				if rep.Bundle.Written || rep.Warm {
					t.Fatalf("bundle written although blob %s failed: %+v", layer, rep.Bundle)
				}
				if visible(dir, f) {
					t.Fatalf("a failed run left a bundle that looks complete in %s", dir)
				}
				if fault == "stopped" && !strings.HasPrefix(rep.Error, "stopped") {
					t.Errorf("report error %q, want stopped", rep.Error)
				}
				for _, p := range []string{filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(layer, "sha256:")), filepath.Join(dir, "blob", strings.Replace(layer, ":", "-", 1))} {
					if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("the failed blob is stored at %s (%v)", p, err)
					}
				}
				if _, err := os.Stat(filepath.Join(dir, bundle.WorkDirName)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("work directory left: %v", err)
				}
				if f == bundle.FormatOCI {
					if _, err := layout.ImageIndexFromPath(dir); err == nil {
						t.Error("go-containerregistry reads the unfinished layout")
					}
					if out, err := skopeo(t, "inspect", "--raw", "oci:"+dir+":"+u.solo); err == nil {
						t.Errorf("skopeo reads the unfinished layout:\n%s", out)
					}
				}

				u.reg.Wrap(nil)
				u.reg.ResetRequests()
				rep, err = toRun(t, t.Context(), dir, f, "linux/amd64", u.ups, nil, u.refs()...)
				mustWrite(t, rep, err)
				if fault != "stopped" && rep.BlobsPresent == 0 {
					t.Errorf("the second run found no blob of the first stored (blobs_present 0)")
				}
				if got := u.reg.Count(http.MethodGet, "/blobs/"); rep.BlobsPresent > 0 && got > rep.BlobsFetched {
					// A single image's config, present, is read from the bundle for its platform.
					t.Errorf("second run sent %d blob GETs for %d blobs fetched: stored blobs fetched again", got, rep.BlobsFetched)
				}
			})
		}
	}
}

// TestToRefused: --to refuses, before contacting anything (exit 2: refusal.ErrRefused), a
// directory that is neither empty nor a bundle, an image whose registry is not an --upstream,
// --mirror with --to, and --platform all without --to.
func TestToRefused(t *testing.T) {
	t.Parallel()
	u := newUpstreamSet(t)
	u.reg.ResetRequests() // the pushes
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "thesis.tex"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"foreign directory", func() error {
			_, err := toRun(t, t.Context(), foreign, bundle.FormatOCI, "linux/amd64", u.ups, nil, u.solo)
			return err
		}, "is not empty and is not an OCI image layout (no oci-layout file; it holds thesis.tex)"},
		{"registry not an upstream", func() error {
			_, err := toRun(t, t.Context(), t.TempDir(), bundle.FormatOCI, "linux/amd64", u.ups[:1], nil, u.solo, "ghcr.io/siderolabs/kubelet:v1.36.2")
			return err
		}, "image ghcr.io/siderolabs/kubelet:v1.36.2: its registry ghcr.io is not an --upstream (configured: " + u.name + ")"},
		{"offline upstream", func() error {
			_, err := toRun(t, t.Context(), t.TempDir(), bundle.FormatOCI, "linux/amd64", []string{u.name + "=offline"}, nil, u.solo)
			return err
		}, "image " + u.solo + ": its upstream is --upstream " + u.name + "=offline, which is never asked"},
		{"--mirror and --to", func() error {
			_, err := warm.Config{To: t.TempDir(), Mirror: "http://127.0.0.1:5000", Concurrency: 1, BlobTimeout: time.Second}.Options([]string{u.solo})
			return err
		}, "warm fills a mirror or writes a bundle, not both"},
		{"--pin and --to", func() error {
			_, err := warm.Config{To: t.TempDir(), Pin: true, Concurrency: 1, BlobTimeout: time.Second}.Options([]string{u.solo})
			return err
		}, "a bundle has none; the images of a bundle are pinned when it is imported"},
		{"--platform all without --to", func() error {
			_, err := warm.Config{Mirror: "http://127.0.0.1:5000", Platform: "all", Concurrency: 1, BlobTimeout: time.Second}.Options([]string{u.solo})
			return err
		}, `--platform "all" refused: all applies only with --to`},
		{"bad --format", func() error {
			_, err := toRun(t, t.Context(), t.TempDir(), "tar", "linux/amd64", u.ups, nil, u.solo)
			return err
		}, `--format "tar" refused`},
	} {
		err := tc.run()
		if !errors.Is(err, refusal.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal containing %q", tc.name, err, tc.want)
		}
	}
	if n := len(u.reg.Requests()); n != 0 {
		t.Errorf("the upstream saw %d requests from refused runs", n)
	}
	if b, _ := os.ReadDir(foreign); len(b) != 1 {
		t.Errorf("the refused directory changed: %v", b)
	}
}

// TestToPlainHTTPUpstreamOnly: an http:// upstream is asked over http only — go-containerregistry
// would try https first (transport.Ping) — and every request carries the warm User-Agent.
func TestToPlainHTTPUpstreamOnly(t *testing.T) {
	t.Parallel()
	u := newUpstreamSet(t)
	u.reg.ResetRequests() // the pushes
	var mu sync.Mutex
	var tls int
	rep, err := toRun(t, t.Context(), t.TempDir(), bundle.FormatOCI, "linux/amd64", u.ups, func(o *warm.Options) {
		base := http.DefaultTransport.(*http.Transport).Clone()
		o.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Scheme == "https" {
				mu.Lock()
				tls++
				mu.Unlock()
			}
			return base.RoundTrip(r)
		})
	}, u.solo)
	mustWrite(t, rep, err)
	if tls != 0 {
		t.Errorf("%d https requests to an http:// upstream", tls)
	}
	for _, r := range u.reg.Requests() {
		if !strings.HasPrefix(r.UserAgent, "nodecache-warm/") {
			t.Errorf("%s %s with User-Agent %q", r.Method, r.Path, r.UserAgent)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestToBearerUpstream: an upstream shaped like Docker Hub — anonymous bearer tokens from a
// separate realm, blob GETs redirected to a CDN host — is written from as serve pulls from it:
// a token with pull scope for the repository, sent to the registry and never to the CDN.
func TestToBearerUpstream(t *testing.T) {
	t.Parallel()
	mirrortest.QuietLogrus()
	inner := mirrortest.NewHandler(t)
	push := httptest.NewServer(inner)
	t.Cleanup(push.Close)
	img := mirrortest.Image(t, layerBytes, 2, "linux/amd64")
	(&mirrortest.Registry{Addr: push.Listener.Addr().String()}).PushImage(t, "library/alpine", "3.20", img)

	const token = "anonymous-token"
	var (
		mu     sync.Mutex
		scopes []string
		leaks  []string
		cdnGot int
	)
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		scopes = append(scopes, r.URL.Query().Get("scope"))
		mu.Unlock()
		_, _ = io.WriteString(w, `{"token":"`+token+`"}`)
	}))
	t.Cleanup(auth.Close)
	cdn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		cdnGot++
		if a := r.Header.Get("Authorization"); a != "" {
			leaks = append(leaks, a)
		}
		mu.Unlock()
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/cdn")
		inner.ServeHTTP(w, r2)
	}))
	t.Cleanup(cdn.Close)
	portOf := func(s *httptest.Server) string { return s.URL[strings.LastIndex(s.URL, ":")+1:] }
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://auth.hub.test:`+portOf(auth)+`/token",service="registry.hub.test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
			return
		}
		if strings.Contains(r.URL.Path, "/blobs/") {
			http.Redirect(w, r, "http://cdn.test:"+portOf(cdn)+"/cdn"+r.URL.Path+"?sig=x", http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(reg.Close)

	// Every *.test name is this machine (what /etc/hosts says in CI), without the resolver.
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(host, ".test") {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
		return dialer.DialContext(ctx, network, addr)
	}
	dir := t.TempDir()
	rep, err := toRun(t, t.Context(), dir, bundle.FormatOCI, "linux/amd64", []string{"docker.io=http://registry.hub.test:" + portOf(reg)},
		func(o *warm.Options) { o.Transport = tr }, "alpine:3.20")
	mustWrite(t, rep, err)
	mu.Lock()
	defer mu.Unlock()
	if len(scopes) == 0 || !slices.Contains(scopes, "repository:library/alpine:pull") {
		t.Errorf("token requests with scopes %q, want repository:library/alpine:pull", scopes)
	}
	if cdnGot < 3 || len(leaks) != 0 {
		t.Errorf("the CDN served %d blobs and saw credentials %q: want config and layers, none", cdnGot, leaks)
	}
	validStoredImage(t, dir, "docker.io/library/alpine:3.20", "image from the bearer upstream")
}

// TestToResumedBlob: a blob stream the upstream breaks half-way is resumed (Range, 206) or,
// from an upstream that ignores Range, fetched again from the start (200) — and the file in the
// bundle holds the blob exactly once, its bytes hashing to its digest.
func TestToResumedBlob(t *testing.T) {
	t.Parallel()
	for _, ignoreRange := range []bool{false, true} {
		t.Run(map[bool]string{false: "range", true: "no range"}[ignoreRange], func(t *testing.T) {
			t.Parallel()
			u := newUpstreamSet(t)
			layer := mirrortest.LayerDigests(t, u.single)[0].String()
			var (
				mu     sync.Mutex
				broken bool
				ranges []string
			)
			u.reg.Intercept(http.MethodGet, "/blobs/"+layer, func(next http.Handler, w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				first := !broken
				broken = true
				ranges = append(ranges, r.Header.Get("Range"))
				mu.Unlock()
				if ignoreRange {
					r.Header.Del("Range")
				}
				if !first {
					next.ServeHTTP(w, r)
					return
				}
				rec := capture(next, r)
				rec.replay(w, len(rec.body)/2)
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler) // the connection drops mid-body
			})
			dir := t.TempDir()
			rep, err := toRun(t, t.Context(), dir, bundle.FormatOCI, "linux/amd64", u.ups, nil, u.solo)
			mustWrite(t, rep, err)
			mu.Lock()
			defer mu.Unlock()
			if len(ranges) != 2 || !strings.HasPrefix(ranges[1], "bytes=") {
				t.Errorf("blob requests with Range %q, want a second one resuming", ranges)
			}
			validStoredImage(t, dir, u.solo, "image with a resumed blob")
		})
	}
}

// TestToTagNamedTwice: one tag asked as two manifests (alpine:3.20 and alpine:3.20@<another
// image's digest>) cannot be listed under one name: that image is not stored and the bundle is
// not written.
func TestToTagNamedTwice(t *testing.T) {
	t.Parallel()
	u := newUpstreamSet(t)
	other := mirrortest.Image(t, layerBytes, 1, "linux/amd64")
	u.reg.PushImage(t, "library/alpine", "old", other)
	dir := t.TempDir()
	rep, err := toRun(t, t.Context(), dir, bundle.FormatOCI, "linux/amd64", u.ups, nil, u.alpine, "alpine:3.20@"+mustDigest(t, other).String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Bundle.Written || rep.Images[0].Warm == rep.Images[1].Warm || !strings.Contains(rep.Images[0].Error+rep.Images[1].Error, "named twice") {
		t.Fatalf("bundle %+v images %+v: want one image refused as named twice, nothing written", rep.Bundle, rep.Images)
	}
	if visible(dir, bundle.FormatOCI) {
		t.Error("index.json written")
	}
}
