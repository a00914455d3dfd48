package mirror_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestCanary: the reserved canary repository is answered by the mirror itself, for any tag and
// platform, through both routings, with no upstream contact.
func TestCanary(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	h := newHarnessFor(t, up)
	for _, platform := range []string{"linux/amd64", "linux/arm64", "linux/arm/v7"} {
		r := ref(t, h.host+"/upstream.test/"+mirrorapi.CanaryRepository+":run-"+strings.ReplaceAll(platform[6:], "/", "-"))
		img, err := remote.Image(r, remote.WithContext(t.Context()), remote.WithPlatform(mustPlatform(t, platform)))
		if err != nil {
			t.Fatalf("canary %s: %v", platform, err)
		}
		if err := validate.Image(img); err != nil {
			t.Fatalf("canary %s does not validate: %v", platform, err)
		}
		cf, _ := img.ConfigFile()
		if want := mustPlatform(t, platform); cf.OS != want.OS || cf.Architecture != want.Architecture || cf.Variant != want.Variant {
			t.Fatalf("canary for %s has platform %s/%s/%s", platform, cf.OS, cf.Architecture, cf.Variant)
		}
	}
	resp, _ := get(t, http.MethodHead, fmtURL(h, "/v2/"+mirrorapi.CanaryRepository+"/manifests/fresh-tag?ns=upstream.test"), manifestAccept)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Docker-Content-Digest") == "" {
		t.Fatalf("canary HEAD via ns: %d", resp.StatusCode)
	}
	if n := len(up.Requests()); n != 0 {
		t.Fatalf("the canary reached the upstream %d times", n)
	}
}
