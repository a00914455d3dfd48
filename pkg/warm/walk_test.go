package warm_test

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/warm"
)

const layerBytes = 64 << 10

// run warms refs through m for platform and returns the report and the progress lines.
func run(t *testing.T, m *testMirror, platform string, mod func(*warm.Options), refs ...string) (*warm.Report, string, error) {
	t.Helper()
	p, err := warm.ParsePlatform(platform)
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	opts := warm.Options{
		Mirror: m.URL, Routing: m.Routing, Platform: p,
		Wait: 5 * time.Second, Deadline: time.Minute,
		Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Progress: &progress,
	}
	for _, r := range refs {
		ref, err := warm.ParseReference(r)
		if err != nil {
			t.Fatal(err)
		}
		opts.Images = append(opts.Images, ref)
	}
	if mod != nil {
		mod(&opts)
	}
	rep, err := warm.Run(t.Context(), opts)
	if rep != nil {
		var text bytes.Buffer
		_ = rep.WriteText(&text)
		t.Logf("mirror %s report:\n%s\nprogress:\n%s", m.Name, text.String(), progress.String())
	}
	return rep, progress.String(), err
}

// mustWarm fails the test unless every image is warm.
func mustWarm(t *testing.T, rep *warm.Report, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !rep.Warm {
		t.Fatalf("not warm: %+v", rep.Images)
	}
}

// checkRequests verifies every request warm sent: the warm User-Agent and the routing.
func checkRequests(t *testing.T, m *testMirror, repo string) {
	t.Helper()
	reqs := m.Requests()
	if len(reqs) == 0 {
		t.Fatal("the mirror saw no request")
	}
	for _, q := range reqs {
		if q.UserAgent != buildinfo.UserAgent("warm") {
			t.Errorf("%s %s: User-Agent %q, want %q", q.Method, q.Path, q.UserAgent, buildinfo.UserAgent("warm"))
		}
		if q.Method != "GET" {
			t.Errorf("%s %s: warm sends only GET", q.Method, q.Path)
		}
		if q.Path == "/v2/" {
			continue
		}
		if strings.Contains(q.Path, "/manifests/") {
			for _, mt := range []types.MediaType{types.OCIImageIndex, types.DockerManifestList, types.OCIManifestSchema1, types.DockerManifestSchema2} {
				if !strings.Contains(q.Accept, string(mt)) {
					t.Errorf("%s: Accept %q lacks %s", q.Path, q.Accept, mt)
				}
			}
		}
		switch m.Routing {
		case warm.RoutingNS:
			if !strings.HasPrefix(q.Path, "/v2/"+repo+"/") || q.RawQuery != "ns="+upstreamName {
				t.Errorf("ns routing: got %s?%s, want /v2/%s/...?ns=%s", q.Path, q.RawQuery, repo, upstreamName)
			}
		case warm.RoutingPath:
			if !strings.HasPrefix(q.Path, "/v2/"+upstreamName+"/"+repo+"/") || q.RawQuery != "" {
				t.Errorf("path routing: got %s?%s, want /v2/%s/%s/...", q.Path, q.RawQuery, upstreamName, repo)
			}
		}
	}
}

// TestWalkAmd64 warms a multi-platform index (amd64, arm64, two attestation manifests) for
// linux/amd64 through each mirror: every amd64 blob reaches the upstream, nothing of arm64 or
// of the attestations does; then, with the upstream stopped, a full amd64 pull through the
// mirror succeeds.
func TestWalkAmd64(t *testing.T) {
	t.Parallel()
	eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
		idx := mirrortest.MultiPlatformIndex(t, layerBytes, 3)
		up.PushIndex(t, "warm/app", "v1", idx)
		m := start()

		rep, progress, err := run(t, m, "linux/amd64", nil, upstreamName+"/warm/app:v1")
		mustWarm(t, rep, err)
		checkRequests(t, m, "warm/app")

		kids := childrenOf(t, idx)
		amd := kids["linux/amd64"]
		amdDigest, _ := amd.Digest()
		idxDigest, _ := idx.Digest()
		im := rep.Images[0]
		if im.Platform != "linux/amd64" || im.Manifest != amdDigest.String() || im.Digest != idxDigest.String() {
			t.Errorf("walked platform %q manifest %s of %s; want linux/amd64 %s of %s", im.Platform, im.Manifest, im.Digest, amdDigest, idxDigest)
		}
		want := digestsOf(t, amd)
		if im.BlobsFetched != len(want) || im.BlobsFailed != 0 || rep.BlobsFetched != len(want) {
			t.Errorf("fetched %d blobs (run %d), failed %d; want %d, 0", im.BlobsFetched, rep.BlobsFetched, im.BlobsFailed, len(want))
		}
		if im.Manifests != 2 || im.Skipped != 3 {
			t.Errorf("manifests %d skipped %d; want 2 (index + amd64) and 3 (arm64 + 2 attestations)", im.Manifests, im.Skipped)
		}
		for _, d := range want {
			if up.Count("GET", d) == 0 {
				t.Errorf("upstream never served amd64 blob %s", d)
			}
			if !strings.Contains(progress, d[:19]) {
				t.Errorf("progress has no line for %s", d)
			}
		}
		for plat, img := range kids {
			if plat == "linux/amd64" {
				continue
			}
			d, _ := img.Digest()
			wantNotFetched(t, up, plat+" blob or manifest", append(digestsOf(t, img), d.String()))
		}
		if m.Name != "stock" && im.Cache["miss"] == 0 {
			t.Errorf("nodecache answered no X-Nodecache-Cache: miss: %v", im.Cache)
		}
		if m.Name == "stock" && len(im.Cache) != 0 {
			t.Errorf("stock proxy has no X-Nodecache-Cache, report says %v", im.Cache)
		}

		// The cache now holds the amd64 image: pull it in full with the upstream gone.
		if err := m.Idle(t.Context()); err != nil {
			t.Fatal(err)
		}
		up.Stop()
		ref, err := name.ParseReference(m.PullPrefix+"warm/app:v1", name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		// registry:2 commits a blob after its client has every byte; allow the commit a
		// few seconds before calling the pull failed.
		var pullErr error
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			if pullErr = pullAll(t, ref, amdDigest); pullErr == nil || time.Now().After(end) {
				break
			}
		}
		if pullErr != nil {
			t.Fatalf("pull %s with the upstream stopped: %v", ref, pullErr)
		}
	})
}

// pullAll pulls ref's linux/amd64 image in full (manifest, config, every layer verified by
// ggcr) and checks it is want.
func pullAll(t *testing.T, ref name.Reference, want v1.Hash) error {
	img, err := remote.Image(ref, remote.WithContext(t.Context()),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
	if err != nil {
		return err
	}
	if d, _ := img.Digest(); d != want {
		return fmt.Errorf("pulled %s, want %s", d, want)
	}
	if _, err := img.RawConfigFile(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
		_, err = io.Copy(io.Discard, rc) // ggcr verifies the digest at EOF
		_ = rc.Close()
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
	}
	return nil
}

// dockerImage builds a Docker v2 schema 2 image (Docker media types throughout) for platform.
func dockerImage(t *testing.T, platform string) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.DockerManifestSchema2)
	img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	for range 2 {
		l, err := random.Layer(layerBytes, types.DockerLayer)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := v1.ParsePlatform(platform)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestDockerManifestList walks a Docker manifest list (amd64, arm64, arm/v7, arm/v6) for
// linux/arm/v7 and for linux/arm64.
func TestDockerManifestList(t *testing.T) {
	t.Parallel()
	eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
		plats := []string{"linux/amd64", "linux/arm/v6", "linux/arm64", "linux/arm/v7"}
		idx := mutate.IndexMediaType(empty.Index, types.DockerManifestList)
		imgs := map[string]v1.Image{}
		for _, p := range plats {
			imgs[p] = dockerImage(t, p)
			pl, _ := v1.ParsePlatform(p)
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: imgs[p], Descriptor: v1.Descriptor{Platform: pl}})
		}
		up.PushIndex(t, "warm/list", "v2", idx)
		m := start()

		for _, want := range []string{"linux/arm/v7", "linux/arm64"} {
			rep, _, err := run(t, m, want, nil, upstreamName+"/warm/list:v2")
			mustWarm(t, rep, err)
			d, _ := imgs[want].Digest()
			if got := rep.Images[0]; got.Platform != want || got.Manifest != d.String() {
				t.Errorf("--platform %s walked %s %s, want %s", want, got.Platform, got.Manifest, d)
			}
		}
		for _, other := range []string{"linux/amd64", "linux/arm/v6"} {
			wantNotFetched(t, up, other+" blob", digestsOf(t, imgs[other]))
		}
		checkRequests(t, m, "warm/list")
	})
}

// TestIndexArm64FirstPretty pushes an index whose bytes are pretty-printed (so only the raw
// bytes hash to its digest) and list arm64 before amd64; warm must verify the raw bytes and
// still take amd64.
func TestIndexArm64FirstPretty(t *testing.T) {
	t.Parallel()
	eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
		arm := mirrortest.Image(t, layerBytes, 2, "linux/arm64")
		amd := mirrortest.Image(t, layerBytes, 2, "linux/amd64")
		var entries []v1.Descriptor
		for _, x := range []struct {
			img  v1.Image
			plat string
		}{{arm, "linux/arm64"}, {amd, "linux/amd64"}} {
			d, _ := x.img.Digest()
			up.PushImage(t, "warm/pretty", d.String(), x.img)
			raw, _ := x.img.RawManifest()
			p, _ := v1.ParsePlatform(x.plat)
			entries = append(entries, v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: d, Size: int64(len(raw)), Platform: p})
		}
		body := prettyJSON(t, v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: entries})
		putManifest(t, up, "warm/pretty", "v1", types.OCIImageIndex, body)
		sum := sha256.Sum256(body)
		m := start()

		rep, _, err := run(t, m, "linux/amd64", nil, upstreamName+"/warm/pretty:v1")
		mustWarm(t, rep, err)
		amdDigest, _ := amd.Digest()
		if got := rep.Images[0]; got.Digest != "sha256:"+hex.EncodeToString(sum[:]) || got.Manifest != amdDigest.String() || got.Platform != "linux/amd64" {
			t.Errorf("walked %+v; want index sha256:%x and amd64 %s", got, sum, amdDigest)
		}
		armDigest, _ := arm.Digest()
		wantNotFetched(t, up, "arm64", append(digestsOf(t, arm), armDigest.String()))
	})
}

// TestTagAndDigest: for name:tag@digest the digest wins; the tag's content is not fetched.
func TestTagAndDigest(t *testing.T) {
	t.Parallel()
	eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
		tagged := mirrortest.Image(t, layerBytes, 2, "linux/amd64")
		pinned := mirrortest.Image(t, layerBytes, 2, "linux/amd64")
		up.PushImage(t, "warm/pin", "v1", tagged)
		up.PushImage(t, "warm/pin", "old", pinned)
		pd, _ := pinned.Digest()
		m := start()

		rep, _, err := run(t, m, "linux/amd64", nil, upstreamName+"/warm/pin:v1@"+pd.String())
		mustWarm(t, rep, err)
		if got := rep.Images[0]; got.Digest != pd.String() || got.Manifest != pd.String() || got.Platform != "" {
			t.Errorf("walked %+v; want the pinned single manifest %s", got, pd)
		}
		if !strings.HasSuffix(rep.Images[0].Reference, ":v1@"+pd.String()) {
			t.Errorf("reference %q does not keep tag and digest", rep.Images[0].Reference)
		}
		wantNotFetched(t, up, "the tag's blob", digestsOf(t, tagged))
		if n := m.Count("", "/manifests/v1"); n != 0 {
			t.Errorf("warm asked for the tag %d times; the digest wins", n)
		}
		for _, x := range digestsOf(t, pinned) {
			if up.Count("GET", x) == 0 {
				t.Errorf("pinned blob %s never fetched", x)
			}
		}
	})
}

// TestNestedIndex: an index whose only entry is another index (no platform) holding the images.
func TestNestedIndex(t *testing.T) {
	t.Parallel()
	eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
		inner := mirrortest.MultiPlatformIndex(t, layerBytes, 1)
		outer := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{Add: inner})
		up.PushIndex(t, "warm/nested", "v1", outer)
		m := start()

		rep, _, err := run(t, m, "linux/arm64", nil, upstreamName+"/warm/nested:v1")
		mustWarm(t, rep, err)
		kids := childrenOf(t, inner)
		d, _ := kids["linux/arm64"].Digest()
		if got := rep.Images[0]; got.Manifest != d.String() || got.Manifests != 3 {
			t.Errorf("walked %+v; want arm64 %s after 3 manifests (outer, inner, image)", got, d)
		}
		wantNotFetched(t, up, "amd64 blob", digestsOf(t, kids["linux/amd64"]))
	})
}

// TestForeignLayers: a Docker image with a foreign layer (urls, non-distributable) is warm; the
// foreign layer is reported as external and never requested.
func TestForeignLayers(t *testing.T) {
	t.Parallel()
	eachMirror(t, func(t *testing.T, up *mirrortest.Registry, start func() *testMirror) {
		base := dockerImage(t, "linux/amd64")
		d, _ := base.Digest()
		up.PushImage(t, "warm/foreign", d.String(), base) // uploads config and layers
		mf, _ := base.Manifest()
		mf = mf.DeepCopy()
		foreign := v1.Descriptor{
			MediaType: types.DockerForeignLayer, Size: 123456,
			Digest: v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)},
			URLs:   []string{"https://foreign.test/layers/windows-base.tar.gz"},
		}
		mf.Layers = append([]v1.Descriptor{foreign}, mf.Layers...)
		body := prettyJSON(t, mf)
		putManifest(t, up, "warm/foreign", "v1", types.DockerManifestSchema2, body)
		m := start()

		rep, progress, err := run(t, m, "linux/amd64", nil, upstreamName+"/warm/foreign:v1")
		mustWarm(t, rep, err)
		im := rep.Images[0]
		if im.BlobsExternal != 1 || len(im.External) != 1 || im.External[0].Digest != foreign.Digest.String() ||
			im.External[0].URLs[0] != foreign.URLs[0] || im.BlobsFetched != 3 {
			t.Errorf("report %+v; want 3 fetched and the foreign layer external", im)
		}
		if n := up.Count("", foreign.Digest.Hex) + m.Count("", foreign.Digest.Hex); n != 0 {
			t.Errorf("the foreign layer was requested %d times", n)
		}
		if !strings.Contains(progress, "external") || !strings.Contains(progress, foreign.URLs[0]) {
			t.Errorf("progress does not report the external layer:\n%s", progress)
		}
	}, func(c *configuration.Configuration) {
		c.Validation.Manifests.URLs.Allow = []string{`^https://foreign\.test/`}
	})
}

// TestTalosJoinSet warms the Talos worker join set through a mirror whose upstreams hold
// images under the join set's exact names (ghcr.io and registry.k8s.io both served by one
// in-process registry).
func TestTalosJoinSet(t *testing.T) {
	t.Parallel()
	set, err := warm.TalosJoinImages("")
	if err != nil {
		t.Fatal(err)
	}
	up := mirrortest.NewRegistry(t)
	var refs []string
	for _, s := range set.Images {
		r, err := warm.ParseReference(s)
		if err != nil {
			t.Fatal(err)
		}
		up.PushImage(t, r.Repository, r.Tag, mirrortest.Image(t, 4<<10, 1, "linux/amd64"))
		refs = append(refs, s)
	}
	// The stock proxy ignores ?ns= and serves its one upstream, which holds every repository.
	m := newStockProxy(t, up)
	rep, _, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.Talos = &set }, refs...)
	mustWarm(t, rep, err)
	if len(rep.Images) != 4 || rep.Talos == nil || rep.Talos.TalosVersion != set.TalosVersion {
		t.Fatalf("report %+v", rep)
	}
	seenNS := map[string]bool{}
	for _, q := range m.Requests() {
		if q.Path != "/v2/" {
			seenNS[q.RawQuery] = true
		}
	}
	if !seenNS["ns=ghcr.io"] || !seenNS["ns=registry.k8s.io"] {
		t.Errorf("requests named upstreams %v; want ns=ghcr.io and ns=registry.k8s.io", seenNS)
	}
}

// TestSchema1Refused: a schema 1 manifest fails that image with a clear message. No registry
// that runs here serves schema 1 any more (distribution v3 refuses it), so the mirror is a
// handler that answers the one manifest as an old registry did.
func TestSchema1Refused(t *testing.T) {
	t.Parallel()
	m := newStaticMirror(t, map[string]staticDoc{
		"/v2/old/app/manifests/v1": {types.DockerManifestSchema1Signed, []byte(schema1Doc)},
	})
	rep, _, err := run(t, m, "linux/amd64", nil, upstreamName+"/old/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Warm || !strings.Contains(rep.Images[0].Error, "schema 1") || !errors.Is(warm.ErrSchema1, warm.ErrSchema1) {
		t.Fatalf("report %+v; want not warm with a schema 1 message", rep.Images[0])
	}
	if n := m.Count("", "/blobs/"); n != 0 {
		t.Errorf("%d blob requests for a schema 1 image", n)
	}
}

// TestSchema1ThroughNodecacheFailsAtOnce: through nodecache, an upstream's schema 1 manifest is
// a 400 MANIFEST_INVALID (permanent), so warm reports the image failed after one request for
// it, without retrying, and says schema 1.
func TestSchema1ThroughNodecacheFailsAtOnce(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.Wrap(func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.Contains(r.URL.Path, "/manifests/") {
				w.WriteHeader(http.StatusOK) // the /v2/ ping
				return
			}
			w.Header().Set("Content-Type", string(types.DockerManifestSchema1Signed))
			if r.Method == http.MethodGet {
				_, _ = w.Write([]byte(schema1Doc))
			}
		})
	})
	m := newNodecache(t, up, warm.RoutingNS)
	rep, _, err := run(t, m, "linux/amd64", func(o *warm.Options) { o.Retries = 5 }, upstreamName+"/old/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Warm || !strings.Contains(rep.Images[0].Error, "schema 1") {
		t.Fatalf("report %+v; want not warm with a schema 1 message", rep.Images[0])
	}
	if n := m.Count("", "/manifests/"); n != 1 {
		t.Errorf("warm sent %d manifest requests to the mirror; a 400 must not be retried", n)
	}
}

const schema1Doc = `{
   "schemaVersion": 1,
   "name": "old/app",
   "tag": "v1",
   "architecture": "amd64",
   "fsLayers": [{"blobSum": "sha256:a3ed95caeb02ffe68cdd9fd84406680ae93d633cb16422d00e8a7c22955b46d4"}],
   "history": [{"v1Compatibility": "{}"}]
}`

// TestNoMatchingPlatform: an index without the platform warms nothing, says what it offers, and
// fetches no blob at all.
func TestNoMatchingPlatform(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushIndex(t, "warm/app", "v1", mirrortest.MultiPlatformIndex(t, layerBytes, 1))
	m := newNodecache(t, up, warm.RoutingNS)
	rep, _, err := run(t, m, "linux/riscv64", nil, upstreamName+"/warm/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	im := rep.Images[0]
	if rep.Warm || im.Warm || !strings.Contains(im.Error, "no manifest for linux/riscv64") ||
		!strings.Contains(im.Error, "linux/amd64, linux/arm64") {
		t.Fatalf("report %+v; want not warm, naming the platforms offered", im)
	}
	if n := m.Count("", "/blobs/"); n != 0 {
		t.Errorf("%d blob requests for an image without the platform", n)
	}
}

// TestSingleManifestPlatform: a tag that names a single manifest (no index) is checked against
// --platform through its config before any layer is fetched, by the --platform-match rule
// (transfer: exact; only: containerd's platforms.Only fallbacks); a mismatch fetches the config
// and nothing else. A config that names no platform is warmed with a note.
func TestSingleManifestPlatform(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	m := newNodecache(t, up, warm.RoutingNS)
	for _, tc := range []struct {
		name, image, want string
		match             warm.PlatformMatch // "" = the default, transfer
		warm              bool
		says              string // in the error (not warm) or the note (warm)
	}{
		{"amd64 image for arm64", "linux/amd64", "linux/arm64", "", false, "image is linux/amd64, not linux/arm64 by the transfer rule"},
		{"arm64 image for amd64", "linux/arm64", "linux/amd64", "", false, "image is linux/arm64, not linux/amd64"},
		{"arm v7 image for arm v6", "linux/arm/v7", "linux/arm/v6", warm.PlatformMatchOnly, false, "image is linux/arm/v7, not linux/arm/v6 by containerd's platforms.Only"},
		{"amd64 image for 386 (only)", "linux/amd64", "linux/386", warm.PlatformMatchOnly, false, "image is linux/amd64, not linux/386"},
		{"windows image for linux", "windows/amd64", "linux/amd64", "", false, "image is windows/amd64, not linux/amd64"},
		{"arm64/v8 image for arm64", "linux/arm64/v8", "linux/arm64", "", true, ""},
		{"arm v6 image for arm v7 (transfer)", "linux/arm/v6", "linux/arm/v7", warm.PlatformMatchTransfer, false, "image is linux/arm/v6, not linux/arm/v7 by the transfer rule"},
		{"arm v6 image for arm v7 (only as containerd 1.7 runs it)", "linux/arm/v6", "linux/arm/v7", warm.PlatformMatchOnly, true, ""},
		{"386 image for amd64 (transfer)", "linux/386", "linux/amd64", "", false, "image is linux/386, not linux/amd64"},
		{"386 image for amd64 (only)", "linux/386", "linux/amd64", warm.PlatformMatchOnly, true, ""},
		{"same platform", "linux/amd64", "linux/amd64", "", true, ""},
		{"config without platform", "", "linux/arm64", "", true, "names no platform"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			repo := "warm/single-" + strings.NewReplacer("/", "-", " ", "-", "(", "", ")", "").Replace(tc.name)
			img := mirrortest.Image(t, layerBytes, 2, tc.image)
			up.PushImage(t, repo, "v1", img)
			mf, _ := img.Manifest()

			rep, _, err := run(t, m, tc.want, func(o *warm.Options) { o.PlatformMatch = tc.match }, upstreamName+"/"+repo+":v1")
			if err != nil {
				t.Fatal(err)
			}
			if want := cmp.Or(tc.match, warm.PlatformMatchTransfer); rep.PlatformMatch != want {
				t.Fatalf("report names rule %q, want %q", rep.PlatformMatch, want)
			}
			im := rep.Images[0]
			if im.Warm != tc.warm || rep.Warm != tc.warm {
				t.Fatalf("warm %v, want %v: %+v", im.Warm, tc.warm, im)
			}
			layerRequests := 0
			for _, l := range mf.Layers {
				layerRequests += m.Count("", l.Digest.String())
			}
			if tc.warm {
				if im.BlobsFetched != 3 || layerRequests < 2 || !strings.Contains(im.Note, tc.says) {
					t.Errorf("report %+v with %d layer requests; want config and 2 layers, note %q", im, layerRequests, tc.says)
				}
				if tc.says == "" && im.Note != "" {
					t.Errorf("unexpected note %q", im.Note)
				}
				return
			}
			if !strings.Contains(im.Error, tc.says) || im.BlobsFetched != 1 || im.Bytes != mf.Config.Size {
				t.Errorf("report %+v; want the config only and an error naming %q", im, tc.says)
			}
			if layerRequests != 0 {
				t.Errorf("%d layer requests for an image of another platform", layerRequests)
			}
			if m.Count("GET", mf.Config.Digest.String()) != 1 {
				t.Errorf("config %s requested %d times, want once", mf.Config.Digest, m.Count("GET", mf.Config.Digest.String()))
			}
		})
	}
}
