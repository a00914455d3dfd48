package mirror_test

import (
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// s3Replica is a nodecache on the shared bucket, with its own local root.
func s3Replica(t *testing.T, s3 *mirrortest.S3, up *mirrortest.Registry) *harness {
	t.Helper()
	return newHarness(t, mirror.Options{
		Root:      t.TempDir(),
		Storage:   mirror.StorageS3,
		S3:        mirror.S3Storage{Bucket: s3.Bucket, Endpoint: s3.Endpoint, PathStyle: true, RootDirectory: "/cache"},
		Upstreams: []regname.Upstream{upstreamFor(t, "upstream.test", up)},
	})
}

func (h *harness) stop(t *testing.T) {
	t.Helper()
	h.waitIdle(t)
	h.close(t)
}

// noRedirects is a client that shows a 3xx instead of following it.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// getBlob GETs a blob through h without following redirects and checks status 200 and digest;
// it returns the cache header.
func getBlob(t *testing.T, h *harness, d string) string {
	t.Helper()
	resp, body := send(t, noRedirects, newRequest(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/blobs/"+d), nil))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("blob %s: status %d (Location %q): %s", d, resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if got := digest.FromBytes(body).String(); got != d {
		t.Fatalf("blob %s: body has digest %s", d, got)
	}
	return resp.Header.Get(mirrorapi.HeaderCache)
}

// TestS3SharedBucket: two replicas on one bucket of a real S3 server (versitygw). A blob pulled
// through A is served by B from the bucket (no upstream request, no 3xx); both restarted, the
// cache survives; an object deleted behind nodecache's back is refetched and relinked; and
// coalescing across replicas is measured: N replicas cost at most N upstream GETs of a blob.
//
//nolint:paralleltest // the subtests are steps in order over one bucket and one upstream (stopped and restarted)
func TestS3SharedBucket(t *testing.T) {
	s3 := mirrortest.NewS3(t)

	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/app", "v1", mirrortest.Image(t, 6*mirrortest.MiB, 2, "linux/amd64"))
	up.PushImage(t, "team/app", "v2", mirrortest.Image(t, 2*mirrortest.MiB, 1, "linux/amd64"))
	blobs := imageBlobs(t, up, "team/app", "v1")

	a, b := s3Replica(t, s3, up), s3Replica(t, s3, up)
	if err := pullImageErr(t.Context(), a.host+"/upstream.test/team/app:v1"); err != nil {
		t.Fatalf("pull through A: %v", err)
	}
	a.stop(t) // every fill committed to the bucket
	up.ResetRequests()
	for _, d := range blobs {
		if c := getBlob(t, b, d); c != mirrorapi.CacheHit {
			t.Errorf("B served blob %s as %q, want %q from the bucket", d, c, mirrorapi.CacheHit)
		}
	}
	if n := len(up.Requests()); n != 0 {
		t.Fatalf("B asked the upstream %d times for blobs A had stored", n)
	}

	t.Run("both restarted: the cache survives", func(t *testing.T) {
		b.stop(t)
		up.Stop()
		defer up.Start(t)
		a2, b2 := s3Replica(t, s3, up), s3Replica(t, s3, up)
		for _, h := range []*harness{a2, b2} {
			for _, d := range blobs {
				if c := getBlob(t, h, d); c != mirrorapi.CacheHit {
					t.Fatalf("after restart: blob %s %q, want %q", d, c, mirrorapi.CacheHit)
				}
			}
		}
	})

	t.Run("an object deleted behind nodecache's back is refetched", func(t *testing.T) {
		c := s3Replica(t, s3, up)
		d := blobs[1]
		dg := digest.Digest(d)
		key := "cache/docker/registry/v2/blobs/sha256/" + dg.Encoded()[:2] + "/" + dg.Encoded() + "/data"
		if err := os.Remove(s3.ObjectPath(key)); err != nil {
			t.Fatalf("delete the object behind nodecache's back: %v", err)
		}
		up.ResetRequests()
		if got := getBlob(t, c, d); got != mirrorapi.CacheMiss {
			t.Fatalf("blob whose data vanished: %q, want %q (refetched)", got, mirrorapi.CacheMiss)
		}
		if n := up.Count(http.MethodGet, "/blobs/"+d); n != 1 {
			t.Fatalf("upstream GETs of the vanished blob: %d, want 1", n)
		}
		c.waitIdle(t)
		if _, err := os.Stat(s3.ObjectPath(key)); err != nil {
			t.Fatalf("the refetched blob is not in the bucket again: %v", err)
		}
		if got := getBlob(t, c, d); got != mirrorapi.CacheHit {
			t.Fatalf("after the refetch: %q, want %q", got, mirrorapi.CacheHit)
		}

		// The same for a manifest: its revision link stays, its data goes.
		img, err := remote.Image(up.Ref(t, "team/app", "v1"), remote.WithContext(t.Context()))
		if err != nil {
			t.Fatal(err)
		}
		md, _ := img.Digest()
		mkey := "cache/docker/registry/v2/blobs/sha256/" + md.Hex[:2] + "/" + md.Hex + "/data"
		if err := os.Remove(s3.ObjectPath(mkey)); err != nil {
			t.Fatalf("delete the manifest object: %v", err)
		}
		resp, body := get(t, http.MethodGet, fmtURL(c, "/v2/upstream.test/team/app/manifests/"+md.String()), manifestAccept)
		if resp.StatusCode != http.StatusOK || digest.FromBytes(body).String() != md.String() {
			t.Fatalf("manifest whose data vanished: %d %s", resp.StatusCode, body)
		}
		if got := resp.Header.Get(mirrorapi.HeaderCache); got != mirrorapi.CacheMiss {
			t.Fatalf("manifest whose data vanished: %q, want %q", got, mirrorapi.CacheMiss)
		}
		if _, err := os.Stat(s3.ObjectPath(mkey)); err != nil {
			t.Fatalf("the refetched manifest is not in the bucket again: %v", err)
		}
	})

	t.Run("coalescing across replicas", func(t *testing.T) {
		const replicas, clients = 2, 5
		hs := []*harness{s3Replica(t, s3, up), s3Replica(t, s3, up)}
		fresh := imageBlobs(t, up, "team/app", "v2")
		layer := fresh[len(fresh)-1]
		up.ResetRequests()
		var wg sync.WaitGroup
		for _, h := range hs {
			for range clients {
				wg.Go(func() {
					req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/blobs/"+layer), nil)
					resp, err := noRedirects.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("status %d", resp.StatusCode)
					}
				})
			}
		}
		wg.Wait()
		n := up.Count(http.MethodGet, "/blobs/"+layer)
		t.Logf("%d replicas x %d concurrent clients of one cold blob: %d upstream GETs", replicas, clients, n)
		if n < 1 || n > replicas {
			t.Fatalf("%d upstream GETs, want between 1 and %d (each replica coalesces its own clients)", n, replicas)
		}
	})
}

// TestS3Options: --storage s3 settings are checked before anything starts.
func TestS3Options(t *testing.T) {
	t.Parallel()
	base := mirror.Config{Listen: ":5000", Root: t.TempDir(), Upstreams: []string{"ghcr.io=https://ghcr.io"},
		UpstreamTimeout: time.Second, FillTimeout: time.Hour}
	for _, tc := range []struct {
		name string
		mod  func(*mirror.Config)
		want string
	}{
		{"no bucket", func(c *mirror.Config) { c.Storage = "s3"; c.S3.Region = "eu-west-1" }, "--s3-bucket: required"},
		{"no region nor endpoint", func(c *mirror.Config) { c.Storage = "s3"; c.S3.Bucket = "b" }, "--s3-region: required"},
		{"bad endpoint", func(c *mirror.Config) { c.Storage = "s3"; c.S3.Bucket = "b"; c.S3.Endpoint = "minio:9000" }, "--s3-endpoint"},
		{"max-size", func(c *mirror.Config) {
			c.Storage = "s3"
			c.S3.Bucket, c.S3.Region, c.MaxSize = "b", "eu-west-1", "10GiB"
		}, "lifecycle"},
		{"s3 flag without s3", func(c *mirror.Config) { c.S3.Bucket = "b" }, "only with --storage s3"},
		{"unknown kind", func(c *mirror.Config) { c.Storage = "gcs" }, "want filesystem or s3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := base
			tc.mod(&c)
			_, err := c.Options(zerolog.Nop())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
	c := base
	c.Storage, c.S3 = "s3", mirror.S3Storage{Bucket: "b", Endpoint: "http://127.0.0.1:9000", PathStyle: true}
	if _, err := c.Options(zerolog.Nop()); err != nil {
		t.Fatalf("endpoint without region: %v", err)
	}
	for _, noCap := range []string{"0", "0B", "0GiB"} { // newuser trial 2, F8: "no cap" is no cap with s3 too
		c.MaxSize = noCap
		if _, err := c.Options(zerolog.Nop()); err != nil {
			t.Errorf("--max-size %s (no cap) with --storage s3: %v", noCap, err)
		}
	}
}
