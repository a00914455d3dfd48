package mirror_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// stockProxy is distribution's own pull-through cache (registry:2 in proxy mode) in front of up.
func stockProxy(b *testing.B, up *mirrortest.Registry) string {
	b.Helper()
	mirrortest.QuietLogrus()
	cfg := &configuration.Configuration{}
	cfg.Storage = configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": b.TempDir()}}
	cfg.Proxy.RemoteURL = up.URL.String()
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.Log.AccessLog.Disabled = true
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	srv := httptest.NewServer(handlers.NewApp(ctx, cfg))
	b.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func nodecacheProxy(b *testing.B, up *mirrortest.Registry) (string, *mirror.Mirror) {
	b.Helper()
	u := upstreamFor(b, "upstream.test", up)
	m, err := mirror.New(b.Context(), mirror.Options{Root: b.TempDir(), Upstreams: []name.Upstream{u}, DefaultUpstream: "upstream.test"})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(m)
	b.Cleanup(func() { srv.Close(); _ = m.Close() })
	return srv.Listener.Addr().String(), m
}

func fetchAll(b *testing.B, url string) int64 {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return n
}

// benchBlob starts an upstream holding team/app:v1, a one-layer image of size bytes, and impl's
// proxy ("stock" or "nodecache") in front of it; it returns the upstream and the proxy's URL of
// the layer blob.
func benchBlob(b *testing.B, impl string, size int64) (*mirrortest.Registry, string) {
	b.Helper()
	up, img := mirrortest.NewRegistryWithImage(b, "team/app", "v1", size)
	d := mirrortest.LayerDigests(b, img)[0]
	addr := ""
	if impl == "stock" {
		addr = stockProxy(b, up)
	} else {
		addr, _ = nodecacheProxy(b, up)
	}
	return up, "http://" + addr + "/v2/team/app/blobs/" + d.String()
}

// BenchmarkProxy runs distribution's stock proxy and nodecache side by side on the same upstream
// and prints nodecache/stock ratios: warm blob GETs (time per op), and 8 clients asking for one
// cold 8 MiB blob at once (time, and bytes fetched from the upstream).
func BenchmarkProxy(b *testing.B) {
	const size = 8 * mirrortest.MiB
	type result struct {
		warm, cold time.Duration
		upBytes    float64
	}
	results := map[string]*result{}
	for _, impl := range []string{"stock", "nodecache"} {
		res := &result{}
		results[impl] = res
		b.Run(impl+"/warm-blob", func(b *testing.B) {
			_, url := benchBlob(b, impl, size)
			fetchAll(b, url)
			time.Sleep(500 * time.Millisecond) // both store in the background
			b.SetBytes(size)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				fetchAll(b, url)
			}
			res.warm = time.Since(start) / time.Duration(b.N)
		})
		b.Run(impl+"/cold-blob-8-clients", func(b *testing.B) {
			var total time.Duration
			var upBytes int64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				up, url := benchBlob(b, impl, size)
				up.ResetRequests()
				var served int64
				var mu sync.Mutex
				b.StartTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for c := 0; c < 8; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						n := fetchAll(b, url)
						mu.Lock()
						served += n
						mu.Unlock()
					}()
				}
				wg.Wait()
				total += time.Since(start)
				upBytes += int64(up.Count(http.MethodGet, "/blobs/")) * size
			}
			res.cold = total / time.Duration(b.N)
			res.upBytes = float64(upBytes) / float64(b.N)
			b.ReportMetric(res.upBytes, "upstream-bytes/op")
		})
	}
	s, n := results["stock"], results["nodecache"]
	if s.warm > 0 && n.warm > 0 && s.cold > 0 && n.cold > 0 {
		fmt.Printf("stock: warm %s, cold %s; nodecache: warm %s, cold %s\n", s.warm, s.cold, n.warm, n.cold)
		fmt.Printf("ratio nodecache/stock: warm blob time %.2f, cold 8-client time %.2f, cold upstream bytes %.2f\n",
			float64(n.warm)/float64(s.warm), float64(n.cold)/float64(s.cold), n.upBytes/s.upBytes)
	}
}

// BenchmarkFirstServe measures what hashing a blob's first serve after a start costs (issue 23,
// at rest): "after-restart" times the first GET of a cached 64 MiB layer by a nodecache started
// anew on the root that holds it (streamed through SHA-256, its last byte held back until the
// digest matched), "warm" a GET of the same layer once it was hashed (sendfile). Both read the
// file from the page cache: the difference is the hash. Run with -benchtime=5x -count=5 for five
// medians' worth.
func BenchmarkFirstServe(b *testing.B) {
	const size = 64 * mirrortest.MiB
	up, img := mirrortest.NewRegistryWithImage(b, "team/app", "v1", size)
	layer := mirrortest.LayerDigests(b, img)[0]
	root := b.TempDir()
	start := func(b *testing.B) (*mirror.Mirror, string, func()) {
		b.Helper()
		// Run is not started: the index stays empty, so every blob is unverified, as after a
		// restart (with the index loaded the first serve is hashed the same way).
		m, err := mirror.New(context.Background(), mirror.Options{Root: root,
			Upstreams: []name.Upstream{upstreamFor(b, "upstream.test", up)}, DefaultUpstream: "upstream.test"})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(m)
		return m, srv.URL + "/v2/team/app/blobs/" + layer.String(), func() { srv.Close(); _ = m.Close() }
	}
	m, url, stop := start(b)
	fetchAll(b, url) // the fill stores it
	if err := m.WaitIdle(b.Context()); err != nil {
		b.Fatal(err)
	}
	stop()
	b.Run("after-restart", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			b.StopTimer()
			_, url, stop := start(b)
			b.StartTimer()
			fetchAll(b, url)
			b.StopTimer()
			stop()
			b.StartTimer()
		}
	})
	b.Run("warm", func(b *testing.B) {
		_, url, stop := start(b)
		defer stop()
		fetchAll(b, url) // hashed once
		b.SetBytes(size)
		for b.Loop() {
			fetchAll(b, url)
		}
	})
}
