package mirror_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	regname "github.com/nodecache/nodecache/pkg/name"
)

// EnvOCIConformance names the OCI distribution-spec conformance binary that .ci/build-tools.sh
// builds (github.com/opencontainers/distribution-spec/conformance, pinned there).
const EnvOCIConformance = "NODECACHE_OCI_CONFORMANCE"

// conformanceExceptions are the conformance tests allowed to fail, each with its reason; every
// other pull and discovery test must pass. None is left.
var conformanceExceptions = map[string]string{}

// conformanceLeaf is one test of the suite's "Test results" tree (its stdout report).
type conformanceLeaf struct{ name, status, detail string }

// conformanceLeaves reads the leaves of the "Test results" tree the suite prints: lines
// "<indent><name>: <status>", a leaf being a line the next one is not indented deeper than;
// lines starting " - " under a leaf are its errors. (The suite's own results.yaml and junit.xml
// are not used: in read-only mode this version panics writing results.yaml, before junit.xml.)
func conformanceLeaves(out string) []conformanceLeaf {
	_, tree, _ := strings.Cut(out, "Test results\n")
	tree, _, _ = strings.Cut(tree, "\nConfiguration:")
	type line struct {
		indent       int
		name, status string
	}
	var lines []line
	var leaves []conformanceLeaf
	details := map[int]string{}
	for _, l := range strings.Split(tree, "\n") {
		trimmed := strings.TrimLeft(l, " ")
		indent := len(l) - len(trimmed)
		i := strings.LastIndex(trimmed, ": ")
		if strings.HasPrefix(trimmed, "OCI Conformance Test") && i > 0 {
			lines = append(lines, line{indent, trimmed[:i], trimmed[i+2:]})
			continue
		}
		if len(lines) > 0 {
			details[len(lines)-1] += trimmed + "\n"
		}
	}
	for i, l := range lines {
		if i+1 < len(lines) && lines[i+1].indent > l.indent {
			continue
		}
		leaves = append(leaves, conformanceLeaf{l.name, l.status, details[i]})
	}
	return leaves
}

// TestOCIConformance runs the OCI distribution-spec conformance suite in its read-only mode
// (OCI_API_PUSH=false, every delete API off) against nodecache three ways — ?ns= (through a
// front that appends it, as containerd sends it), the /v2/<upstream>/ path prefix, and the
// default upstream — over content seeded into a real distribution registry upstream, whose
// referrers nodecache reads through the referrers tag schema (distribution 3.1.2 has no
// referrers API); and a fourth way, by path prefix, over the same content seeded into
// go-containerregistry's registry with the referrers API. Every pull and discovery test passes,
// the referrers tests included (OCI_RO_DATA_REFERRERS: the image a cosign-shaped signature
// refers to).
func TestOCIConformance(t *testing.T) {
	t.Parallel()
	bin := runtimetest.Binary(t, EnvOCIConformance)

	up := mirrortest.NewRegistry(t)
	const repo = "conformance/repo1"
	img := mirrortest.Image(t, 32<<10, 2, "linux/amd64")
	up.PushImage(t, repo, "v1", img)
	idx := mirrortest.MultiPlatformIndex(t, 1024, 1)
	up.PushIndex(t, repo, "multi", idx)
	manifests := []string{digestOf(t, img), digestOf(t, idx)}
	im, _ := idx.IndexManifest()
	for _, d := range im.Manifests {
		manifests = append(manifests, d.Digest.String())
	}
	blobs := mirrortest.BlobDigests(t, img)
	subject, err := partialDescriptor(img)
	if err != nil {
		t.Fatal(err)
	}
	sig := artifact(t, cosignSigType, "application/vnd.dev.cosign.simplesigning.v1+json", `{"critical":{}}`, subject)
	manifests = append(manifests, digestOf(t, sig))
	pushRef(t, up.Addr, repo, "", sig) // and the referrers tag schema's index
	withAPI := newReferrersUpstream(t, 1)
	pushRef(t, withAPI.host, repo, "v1", img)
	if err := remote.WriteIndex(ref(t, withAPI.host+"/"+repo+":multi"), idx); err != nil {
		t.Fatal(err)
	}
	pushRef(t, withAPI.host, repo, "", sig)

	h := newHarness(t, mirror.Options{
		Upstreams:       []regname.Upstream{upstreamFor(t, "upstream.test", up), withAPI.upstream(t, "refs.test")},
		DefaultUpstream: "upstream.test",
	})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		q.Set("ns", "upstream.test")
		r.URL.RawQuery = q.Encode()
		h.m.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	for _, way := range []struct{ name, registry, repo string }{
		{"ns", front.Listener.Addr().String(), repo},
		{"path prefix", h.host, "upstream.test/" + repo},
		{"default upstream", h.host, repo},
		{"referrers API upstream", h.host, "refs.test/" + repo},
	} {
		dir := t.TempDir()
		cmd := exec.CommandContext(t.Context(), bin)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(),
			"OCI_RESULTS_DIR="+dir,
			"OCI_VERSION=1.1", "OCI_LOG=warn", "OCI_TLS=disabled",
			"OCI_REGISTRY="+way.registry, "OCI_REPO1="+way.repo, "OCI_REPO2="+way.repo,
			"OCI_API_PULL=true", "OCI_API_PUSH=false", "OCI_API_TAGS_LIST=true", "OCI_API_REFERRER=true",
			"OCI_API_BLOBS_DELETE=false", "OCI_API_MANIFESTS_DELETE=false", "OCI_API_TAGS_DELETE=false",
			"OCI_API_BLOBS_MOUNT_ANONYMOUS=false", "OCI_DATA_SHA512=false",
			"OCI_RO_DATA_TAGS=v1 multi",
			"OCI_RO_DATA_MANIFESTS="+strings.Join(manifests, " "),
			"OCI_RO_DATA_BLOBS="+strings.Join(blobs, " "),
			"OCI_RO_DATA_REFERRERS="+subject.Digest.String(),
		)
		start := time.Now()
		out, _ := cmd.Output() // judged by the report
		passed, skipped, referrers := 0, 0, 0
		for _, leaf := range conformanceLeaves(string(out)) {
			switch leaf.status {
			case "Pass":
				passed++
				if strings.Contains(strings.ToLower(leaf.name), "referrers") {
					referrers++
				}
			case "Disabled", "Skip":
				skipped++
			default:
				if reason, ok := exception(leaf.name); ok {
					t.Logf("%s: %s is %s, as expected: %s", way.name, leaf.name, leaf.status, reason)
					continue
				}
				t.Errorf("%s: conformance test %q: %s\n%s", way.name, leaf.name, leaf.status, leaf.detail)
			}
		}
		t.Logf("%s: %d conformance tests passed, %d skipped (push and delete are off), in %s", way.name, passed, skipped, time.Since(start).Round(time.Millisecond))
		if referrers < 2 {
			t.Errorf("%s: %d referrers conformance tests passed, want the empty one and the read-only subject's:\n%s", way.name, referrers, out)
		}
		if passed < 25 {
			t.Errorf("%s: only %d conformance tests passed; the read-only pull and discovery tests did not run:\n%s", way.name, passed, out)
		}
	}
}

func exception(test string) (string, bool) {
	for k, reason := range conformanceExceptions {
		if strings.Contains(strings.ToLower(test), k) {
			return reason, true
		}
	}
	return "", false
}
