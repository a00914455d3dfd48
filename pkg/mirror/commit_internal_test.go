package mirror

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestCommitLinkedInSharedBucket (issue 22): a fill that ends after another replica of the same
// bucket (or the member it streamed from) stored and linked the blob is only recorded, not
// uploaded again: in one bucket a blob is stored once. The staging file handed to the commit
// does not exist, so an upload would fail.
//
//nolint:paralleltest // mirrortest.NewS3 puts the bucket's credentials in the environment (t.Setenv)
func TestCommitLinkedInSharedBucket(t *testing.T) {
	s3 := mirrortest.NewS3(t)
	up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 4096)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, _ := layers[0].Digest()
	size, _ := layers[0].Size()
	replica := func() *Mirror {
		m, err := New(t.Context(), Options{
			Root: t.TempDir(), Storage: StorageS3,
			S3:        S3Storage{Bucket: s3.Bucket, Endpoint: s3.Endpoint, PathStyle: true, RootDirectory: "/cache"},
			Upstreams: []name.Upstream{{Name: "upstream.test", URL: up.URL}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	a, b := replica(), replica()
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/v2/upstream.test/team/app/blobs/"+d.String(), nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("blob through replica A: %d %s", rec.Code, rec.Body)
	}
	if err := a.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}
	r, err := b.repository(t.Context(), route{up: b.upstreams["upstream.test"], repo: "team/app"}, "team/app")
	if err != nil {
		t.Fatal(err)
	}
	desc := v1.Descriptor{Digest: digest.Digest(d.String()), Size: size}
	if err := r.commitBlob(t.Context(), "/nonexistent/staging/fill-x", desc); err != nil {
		t.Fatalf("replica B's commit of a blob the bucket holds linked: %v; want it recorded, not uploaded again", err)
	}
}
