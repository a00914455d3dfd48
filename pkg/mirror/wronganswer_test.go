package mirror_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TestWrongUpstreamAnswerIs502 (issue 23, one status code per cause): a manifest asked by digest
// whose upstream bytes do not match it, and a manifest over 4 MiB, are the upstream's wrong
// answers: 502 with an OCI error body naming what was wrong (before: 503 UNAVAILABLE, which says
// the upstream is unreachable or failing and which warm retries five times).
func TestWrongUpstreamAnswerIs502(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		body       func(real []byte) []byte
	}{
		{"bytes that do not match the digest", "does not match", func(real []byte) []byte {
			return []byte(strings.Replace(string(real), `"schemaVersion":2`, `"schemaVersion": 2`, 1))
		}},
		{"a manifest over 4 MiB", "larger than", func(real []byte) []byte {
			return []byte(strings.Repeat(" ", 4<<20+1) + string(real))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up, img := mirrortest.NewRegistryWithImage(t, "team/app", "v1", 1024)
			real, err := img.RawManifest()
			if err != nil {
				t.Fatal(err)
			}
			d, _ := img.Digest()
			up.Intercept(http.MethodGet, "/manifests/", func(_ http.Handler, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
				_, _ = w.Write(tc.body(real))
			})
			h := newHarnessFor(t, up)
			resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/app/manifests/"+d.String()), manifestAccept)
			var e struct {
				Errors []struct{ Code, Message string } `json:"errors"`
			}
			_ = json.Unmarshal(body, &e)
			if resp.StatusCode != http.StatusBadGateway || len(e.Errors) != 1 || !strings.Contains(e.Errors[0].Message, tc.want) ||
				resp.Header.Get(mirrorapi.HeaderErrorCode) == "" {
				t.Errorf("%d %s (error code header %q); want 502 naming %q", resp.StatusCode, body, resp.Header.Get(mirrorapi.HeaderErrorCode), tc.want)
			}
		})
	}
}
