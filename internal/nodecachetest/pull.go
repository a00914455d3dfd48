package nodecachetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// PullValid pulls ref ("<host:port>/<repository>:<tag>" or "…@<digest>", plain http) the way a
// node does, taking the linux/amd64 image of an index, and reads every blob, checking each
// against its digest and the config and layers against the manifest (go-containerregistry's
// validate.Image). It returns the image, or the first failure wrapped with ref.
func PullValid(ctx context.Context, ref string) (v1.Image, error) {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	if err := validate.Image(img); err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	return img, nil
}

// Pull pulls each ref ("<upstream>/<repository>:<tag>", as a path on the mirror) through n with
// PullValid, failing t at the first failure, then waits until n has stored what the pulls
// fetched (mirror.WaitIdle).
func (n *Nodecache) Pull(t *testing.T, refs ...string) {
	t.Helper()
	for _, ref := range refs {
		if _, err := PullValid(t.Context(), n.Host+"/"+ref); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Mirror.WaitIdle(t.Context()); err != nil {
		t.Fatalf("wait until %s is stored: %v", refs, err)
	}
}
