package mirrorapi_test

import (
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// The Accept list names exactly the manifest and index types go-containerregistry knows as
// such, schema 1 excluded, each once.
func TestManifestAccept(t *testing.T) {
	t.Parallel()
	list := strings.Split(mirrorapi.ManifestAccept, ", ")
	if strings.Join(list, ", ") != strings.Join(mirrorapi.ManifestMediaTypes(), ", ") {
		t.Fatalf("ManifestAccept %q differs from ManifestMediaTypes %q", mirrorapi.ManifestAccept, mirrorapi.ManifestMediaTypes())
	}
	seen := map[string]bool{}
	for _, mt := range list {
		m := types.MediaType(mt)
		if seen[mt] || !(m.IsIndex() || m.IsImage()) || m.IsSchema1() {
			t.Errorf("Accept entry %q: duplicate, schema 1, or not a manifest type", mt)
		}
		seen[mt] = true
	}
	for _, m := range []types.MediaType{types.OCIImageIndex, types.DockerManifestList, types.OCIManifestSchema1, types.DockerManifestSchema2} {
		if !seen[string(m)] {
			t.Errorf("Accept list lacks %s", m)
		}
	}
}
