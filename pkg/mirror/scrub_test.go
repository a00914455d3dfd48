package mirror_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestScrubberEvictsDamagedBlob (issue 23, at rest): with a short --scrub-interval, the
// background scrubber finds a cached layer whose byte was flipped on disk before any client asks
// for it, evicts it and counts nodecache_cache_corrupt_total{found_by="scrub"}; the next GET is
// a miss with the right bytes.
func TestScrubberEvictsDamagedBlob(t *testing.T) {
	t.Parallel()
	a := newAtRest(t, 256<<10, mirror.Options{ScrubInterval: 200 * time.Millisecond})
	damages[0].apply(t, a.layerPath())
	poll(t, "the scrubber to count the damaged layer",
		func() float64 { return metricValue(t, a.h, `nodecache_cache_corrupt_total{found_by="scrub"}`) },
		func(n float64) bool { return n == 1 },
		func(float64) string { return "log:\n" + string(a.h.logs.Bytes()) })
	if _, err := os.Stat(a.layerPath()); !os.IsNotExist(err) {
		t.Errorf("the damaged layer's data after the scrub: %v; want it gone", err)
	}
	if got := judgedGet(t, a.layerURL(), nil); got.status != http.StatusOK || got.cut || got.cache != mirrorapi.CacheMiss || !bytes.Equal(got.body, a.data) {
		t.Fatalf("GET after the scrub: %d %s (cut %v); want the right bytes as a miss", got.status, got.cache, got.cut)
	}
	if n := metricValue(t, a.h, `nodecache_cache_corrupt_total{found_by="serve"}`); n != 0 {
		t.Errorf(`nodecache_cache_corrupt_total{found_by="serve"} = %v, want 0 (the scrubber found it)`, n)
	}
}

// TestCacheVerifyEndpoint: GET mirrorapi.CacheVerifyPath is 404 before any pass; a POST with a
// rate that does not parse is 400; a POST starts a pass (202), which GET follows to its end: the layer
// whose byte was flipped is corrupt and evicted (found_by verify), the rest is clean; the next
// pull of the layer is a miss with the right bytes. Other methods are 405.
func TestCacheVerifyEndpoint(t *testing.T) {
	t.Parallel()
	a := newAtRest(t, 256<<10, mirror.Options{})
	url := fmtURL(a.h, mirrorapi.CacheVerifyPath)
	if resp, body := get(t, http.MethodGet, url, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET before any pass: %d %s; want 404", resp.StatusCode, body)
	}
	if resp, body := get(t, http.MethodPost, url+"?rate=fast", nil); resp.StatusCode != http.StatusBadRequest || !bytes.Contains(body, []byte(`--rate \"fast\": unknown unit \"fast\"`)) {
		t.Errorf("POST with a bad rate: %d %s; want 400 naming the rate", resp.StatusCode, body)
	}
	if resp, _ := get(t, http.MethodPut, url, nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d; want 405", resp.StatusCode)
	}
	damages[0].apply(t, a.layerPath())
	resp, body := get(t, http.MethodPost, url, nil)
	var p mirrorapi.VerifyPass
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(body, &p) != nil || p.ID != 1 || p.RateBytes != 50<<20 {
		t.Fatalf("POST: %d %s; want 202 with pass 1 at the scrub rate (50 MiB/s)", resp.StatusCode, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.State == mirrorapi.VerifyRunning {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for the pass: %+v", p)
		}
		time.Sleep(20 * time.Millisecond)
		_, body := get(t, http.MethodGet, url, nil)
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("GET: %v: %s", err, body)
		}
	}
	if p.State != mirrorapi.VerifyDone || p.Blobs != 3 || p.Checked != 3 || p.Corrupt != 1 || p.Evicted != 1 ||
		len(p.CorruptBlobs) != 1 || p.CorruptBlobs[0] != a.layer.String() {
		t.Fatalf("pass = %+v; want 3 blobs (manifest, config, layer) checked, the layer corrupt and evicted", p)
	}
	if n := metricValue(t, a.h, `nodecache_cache_corrupt_total{found_by="verify"}`); n != 1 {
		t.Errorf(`nodecache_cache_corrupt_total{found_by="verify"} = %v, want 1`, n)
	}
	if got := judgedGet(t, a.layerURL(), nil); got.status != http.StatusOK || got.cache != mirrorapi.CacheMiss || !bytes.Equal(got.body, a.data) {
		t.Fatalf("GET after the pass: %d %s; want the right bytes as a miss", got.status, got.cache)
	}
}

// TestScrubOptions: --scrub-interval and --scrub-rate as Config.Options reads them (a rate of 0
// is Options' default, 50 MiB/s, as the flag's): a week by default on filesystem storage; off
// with --storage s3 unless the interval is given; 0 turns it off; a negative interval and rates
// that are not binary sizes are refused, naming the flag.
func TestScrubOptions(t *testing.T) {
	t.Parallel()
	base := mirror.Config{Listen: ":5000", Root: t.TempDir(), Upstreams: []string{"ghcr.io=https://ghcr.io"},
		UpstreamTimeout: time.Second, FillTimeout: time.Hour, ScrubInterval: 7 * 24 * time.Hour}
	s3 := func(c *mirror.Config) {
		c.Storage, c.S3 = "s3", mirror.S3Storage{Bucket: "b", Endpoint: "http://127.0.0.1:9000", PathStyle: true}
	}
	for _, tc := range []struct {
		name     string
		mod      func(*mirror.Config)
		interval time.Duration
		rate     int64
	}{
		{"defaults", func(*mirror.Config) {}, 7 * 24 * time.Hour, 0},
		{"off", func(c *mirror.Config) { c.ScrubInterval = 0 }, mirror.ScrubOff, 0},
		{"s3: off by default", s3, mirror.ScrubOff, 0},
		{"s3: asked for", func(c *mirror.Config) { s3(c); c.ScrubIntervalSet, c.ScrubInterval = true, 24*time.Hour }, 24 * time.Hour, 0},
		{"rate", func(c *mirror.Config) { c.ScrubRate = "200MiB/s" }, 7 * 24 * time.Hour, 200 << 20},
		{"rate in bytes", func(c *mirror.Config) { c.ScrubRate = "1048576" }, 7 * 24 * time.Hour, 1 << 20},
	} {
		c := base
		tc.mod(&c)
		o, err := c.Options(zerolog.Nop())
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		m, err := mirror.New(t.Context(), o)
		if err != nil {
			t.Fatalf("%s: mirror.New: %v", tc.name, err)
		}
		_ = m.Close()
		if o.ScrubInterval != tc.interval || o.ScrubRate != tc.rate {
			t.Errorf("%s: scrub every %s at %d bytes/s; want every %s at %d", tc.name, o.ScrubInterval, o.ScrubRate, tc.interval, tc.rate)
		}
	}
	for _, tc := range []struct {
		mod  func(*mirror.Config)
		want string
	}{
		{func(c *mirror.Config) { c.ScrubInterval = -time.Hour }, "--scrub-interval -1h0m0s: want a positive duration"},
		{func(c *mirror.Config) { c.ScrubRate = "50MB" }, `--scrub-rate "50MB": decimal and short units are not accepted; did you mean 50MiB?`},
		{func(c *mirror.Config) { c.ScrubRate = "0" }, `--scrub-rate "0": must be more than 0`},
		{func(c *mirror.Config) { c.ScrubRate = "10%" }, `--scrub-rate "10%": a share is not accepted`},
	} {
		c := base
		tc.mod(&c)
		if _, err := c.Options(zerolog.Nop()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err %v, want one saying %q", err, tc.want)
		}
	}
}
