package warm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func plat(s string) *v1.Platform {
	p, err := v1.ParsePlatform(s)
	if err != nil {
		panic(err)
	}
	return p
}

// TestPlatformMatcher: (index, platform, rule) -> chosen child, by containerd's
// platforms.Ordered (transfer) and platforms.Only (only). "" means nothing is taken.
func TestPlatformMatcher(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		want     string
		offered  []string
		transfer string
		only     string
	}{
		{"amd64 exact", "linux/amd64", []string{"linux/arm64", "linux/amd64"}, "linux/amd64", "linux/amd64"},
		{"amd64 on a 386-only index", "linux/amd64", []string{"linux/386", "linux/arm64"}, "", "linux/386"},
		{"amd64 prefers itself to 386", "linux/amd64", []string{"linux/386", "linux/amd64"}, "linux/amd64", "linux/amd64"},
		{"amd64 does not take a v3-only image", "linux/amd64", []string{"linux/amd64/v3"}, "", ""},
		{"amd64/v3 prefers v3 over v2", "linux/amd64/v3", []string{"linux/amd64/v2", "linux/amd64/v3"}, "linux/amd64/v3", "linux/amd64/v3"},
		{"amd64/v3 on a v2 image", "linux/amd64/v3", []string{"linux/amd64/v2"}, "", "linux/amd64/v2"},
		{"arm64 takes variant none", "linux/arm64", []string{"linux/amd64", "linux/arm64"}, "linux/arm64", "linux/arm64"},
		{"arm64 takes variant v8", "linux/arm64", []string{"linux/amd64", "linux/arm64/v8"}, "linux/arm64/v8", "linux/arm64/v8"},
		{"arm64/v8 takes variant none", "linux/arm64/v8", []string{"linux/arm64"}, "linux/arm64", "linux/arm64"},
		{"arm64 on an arm/v7-only index", "linux/arm64", []string{"linux/arm/v7", "linux/amd64"}, "", "linux/arm/v7"},
		{"arm64 prefers arm/v7 to arm/v6", "linux/arm64", []string{"linux/arm/v6", "linux/arm/v7"}, "", "linux/arm/v7"},
		{"arm64 does not take v9", "linux/arm64", []string{"linux/arm64/v9"}, "", ""},
		{"arm v7 before v6", "linux/arm/v7", []string{"linux/arm/v6", "linux/arm/v7"}, "linux/arm/v7", "linux/arm/v7"},
		{"arm v7 on a v6-only index", "linux/arm/v7", []string{"linux/arm/v6", "linux/arm64"}, "", "linux/arm/v6"},
		{"arm v6 does not take v7", "linux/arm/v6", []string{"linux/arm/v7"}, "", ""},
		{"other OS refused", "linux/amd64", []string{"windows/amd64"}, "", ""},
		{"unknown/unknown never", "linux/amd64", []string{"unknown/unknown"}, "", ""},
		{"unknown/unknown never, even for 386", "linux/386", []string{"unknown/unknown", "linux/amd64"}, "", ""},
	} {
		for _, rule := range []PlatformMatch{PlatformMatchTransfer, PlatformMatchOnly} {
			t.Run(tc.name+"/"+string(rule), func(t *testing.T) {
				t.Parallel()
				want, err := ParsePlatform(tc.want)
				if err != nil {
					t.Fatal(err)
				}
				pick := tc.transfer
				if rule == PlatformMatchOnly {
					pick = tc.only
				}
				ps := make([]*v1.Platform, len(tc.offered))
				for i, s := range tc.offered {
					ps[i] = plat(s)
				}
				ps = append(ps, nil) // an entry without platform never matches
				got := newPlatformMatcher(want, rule).best(ps)
				// containerd's own choice (images.Manifest over the same index) must agree.
				cmp := platforms.Ordered(want)
				if rule == PlatformMatchOnly {
					cmp = platforms.Only(want)
				}
				if oracle := containerdChoice(t, tc.offered, cmp); oracle != got {
					t.Fatalf("warm picks entry %d, containerd's images.Manifest picks %d", got, oracle)
				}
				switch {
				case pick == "" && got >= 0:
					t.Fatalf("picked %s, want none", formatV1Platform(ps[got]))
				case pick != "" && got < 0:
					t.Fatalf("picked none, want %s", pick)
				case pick != "" && formatV1Platform(ps[got]) != pick:
					t.Fatalf("picked %s, want %s", formatV1Platform(ps[got]), pick)
				}
			})
		}
	}
}

// memProvider is a content.Provider over blobs in memory.
type memProvider map[digest.Digest][]byte

func (p memProvider) ReaderAt(_ context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	b, ok := p[desc.Digest]
	if !ok {
		return nil, fmt.Errorf("%s: %w", desc.Digest, errdefs.ErrNotFound)
	}
	return memReaderAt{bytes.NewReader(b)}, nil
}

type memReaderAt struct{ *bytes.Reader }

func (memReaderAt) Close() error { return nil }

// containerdChoice builds an OCI index with one manifest per offered platform and returns the
// position of the one containerd's images.Manifest picks with cmp (-1: none).
func containerdChoice(t *testing.T, offered []string, cmp platforms.MatchComparer) int {
	t.Helper()
	blobs := memProvider{}
	put := func(mediaType string, v any) ocispec.Descriptor {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		d := digest.FromBytes(b)
		blobs[d] = b
		return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
	}
	idx := ocispec.Index{Versioned: specsVersioned, MediaType: ocispec.MediaTypeImageIndex}
	configs := map[digest.Digest]int{}
	for i, s := range offered {
		p, err := platforms.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		cfg := put(ocispec.MediaTypeImageConfig, map[string]any{"os": p.OS, "architecture": p.Architecture, "variant": p.Variant, "n": i})
		configs[cfg.Digest] = i
		m := put(ocispec.MediaTypeImageManifest, ocispec.Manifest{Versioned: specsVersioned, MediaType: ocispec.MediaTypeImageManifest, Config: cfg, Layers: []ocispec.Descriptor{}})
		m.Platform = &p
		idx.Manifests = append(idx.Manifests, m)
	}
	top := put(ocispec.MediaTypeImageIndex, idx)
	got, err := images.Manifest(t.Context(), blobs, top, cmp)
	if errors.Is(err, errdefs.ErrNotFound) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return configs[got.Config.Digest]
}

var specsVersioned = specs.Versioned{SchemaVersion: 2}

func TestParsePlatformMatch(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]PlatformMatch{"": PlatformMatchTransfer, "transfer": PlatformMatchTransfer, "only": PlatformMatchOnly} {
		if got, err := ParsePlatformMatch(in); err != nil || got != want {
			t.Errorf("ParsePlatformMatch(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := ParsePlatformMatch("exact")
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "--platform-match") || !strings.Contains(err.Error(), "want transfer") {
		t.Fatalf("ParsePlatformMatch(exact) = %v", err)
	}
}

func TestParsePlatform(t *testing.T) {
	t.Parallel()
	def, err := ParsePlatform("")
	if err != nil || FormatPlatform(def) != platforms.Format(platforms.Normalize(platforms.DefaultSpec())) {
		t.Fatalf("default platform = %v, %v; want this machine's", def, err)
	}
	if p, err := ParsePlatform("linux/aarch64"); err != nil || FormatPlatform(p) != "linux/arm64" {
		t.Fatalf("linux/aarch64 -> %v, %v; want linux/arm64", p, err)
	}
	for _, bad := range []string{"amd64", "linux/amd64\n", "linux/*", "linux/amd64;id", "linux/amd64/v2/x", "linux/"} {
		if _, err := ParsePlatform(bad); err == nil {
			t.Errorf("ParsePlatform(%q) accepted", bad)
		}
	}
}

func TestContentRangeStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"bytes 100-199/200", 100, true},
		{"bytes 0-9/*", 0, true},
		{"bytes */200", 0, false},
		{"items 1-2/3", 0, false},
		{"", 0, false},
		{"bytes -5-9/10", 0, false},
	} {
		got, ok := contentRangeStart(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("contentRangeStart(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"3", 3 * time.Second},
		{"0", 0},
		{"", 0},
		{"-1", 0},
		{"soon", 0},
		{now.Add(7 * time.Second).Format(http.TimeFormat), 7 * time.Second},
		{now.Add(-7 * time.Second).Format(http.TimeFormat), 0},
	} {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// schema1Manifest is a Docker schema 1 manifest as old registries serve it (signature omitted).
const schema1Manifest = `{
   "schemaVersion": 1,
   "name": "library/hello",
   "tag": "latest",
   "architecture": "amd64",
   "fsLayers": [{"blobSum": "sha256:a3ed95caeb02ffe68cdd9fd84406680ae93d633cb16422d00e8a7c22955b46d4"}],
   "history": [{"v1Compatibility": "{}"}]
}`

func TestManifestMediaType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, ct string
		want           types.MediaType
	}{
		{"field wins", `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}`, "application/json", types.OCIImageIndex},
		{"content type", `{"schemaVersion":2,"manifests":[]}`, string(types.DockerManifestList), types.DockerManifestList},
		{"sniff index", `{"schemaVersion":2,"manifests":[]}`, "application/json", types.OCIImageIndex},
		{"sniff manifest", `{"schemaVersion":2,"config":{},"layers":[]}`, "", types.OCIManifestSchema1},
		{"schema1 by shape", schema1Manifest, "application/json", types.DockerManifestSchema1},
		{"schema1 signed content type", schema1Manifest, string(types.DockerManifestSchema1Signed) + "; charset=utf-8", types.DockerManifestSchema1Signed},
	} {
		got := manifestMediaType([]byte(tc.body), tc.ct)
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		if tc.name[:7] == "schema1" && !got.IsSchema1() {
			t.Errorf("%s: %q is not recognised as schema 1", tc.name, got)
		}
	}
}

// TestBarProgress: the bar shows bytes done of planned, rate, ETA and blob count; failures are
// printed on their own line above it; the final draw ends the line.
func TestBarProgress(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	bar := newBarProgress(&buf)
	bar.start = time.Now().Add(-2 * time.Second)
	bar.planned(4 << 20)
	bar.transferred(1 << 20)
	bar.draw()
	bar.blob(blobEvent{Image: "docker.io/library/nginx:latest", Digest: "sha256:" + strings.Repeat("ab", 32), Size: 10, Attempts: 3, Err: errors.New("503")})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	bar.run(ctx, time.Hour)
	out := buf.String()
	for _, want := range []string{
		"[#######-----------------------] 1.0 MiB / 4.0 MiB",
		"ETA ", "blobs 1 (1 failed)",
		"FAILED   docker.io/library/nginx:latest sha256:abababababab 10 B after 3 attempts",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q:\n%q", want, out)
		}
	}
	if !strings.HasSuffix(out, "\n") || !strings.Contains(out, "\r\033[K") {
		t.Errorf("bar output does not redraw in place and end its line: %q", out)
	}
	if rate := strings.Contains(out, "512.0 KiB/s") || strings.Contains(out, "511."); !rate {
		t.Errorf("rate after 1 MiB in 2 s missing: %q", out)
	}
}

// TestReportTextDurations: the text report's durations read like 350ms or 2m30s, never
// microseconds with decimals (newuser F10: "0 B in 315.129µs").
func TestReportTextDurations(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		seconds float64
		want    string
	}{
		{0.000315129, "0 B in <1ms"},
		{0.35012, "0 B in 350ms"},
		{150.4, "0 B in 2m30s"},
		{300, "0 B in 5m"},
	} {
		rep := &Report{Images: []ImageReport{{Reference: "quay.io/foo/bar:1", Seconds: tc.seconds}}, Seconds: tc.seconds}
		var b bytes.Buffer
		if err := rep.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		if got := b.String(); strings.Count(got, tc.want) != 2 || strings.Contains(got, "µs") {
			t.Errorf("seconds %v: want %q on the image and the summary line, got:\n%s", tc.seconds, tc.want, got)
		}
	}
}
