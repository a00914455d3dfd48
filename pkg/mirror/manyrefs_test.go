package mirror_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// maxRefs is the mirror's bound on descriptors per manifest (cache.MaxManifestRefs).
const maxRefs = 10_000

// pushSparseIndex PUTs to up, as repo:tag, an OCI index (compact JSON) of n child manifests that
// up does not hold (up must accept incomplete indexes: validation.manifests.indexes.platforms
// none), and returns its digest. seed makes the children, and so the index, differ from another
// call's.
func pushSparseIndex(t *testing.T, up *mirrortest.Registry, repo, tag, seed string, n int) digest.Digest {
	t.Helper()
	children := make([]digest.Digest, n)
	for i := range children {
		children[i] = digest.FromString(fmt.Sprintf("%s child %d", seed, i))
	}
	body := mirrortest.IndexJSON(t, children)
	u := up.URL.JoinPath("/v2/", repo, "manifests", tag).String()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/vnd.oci.image.index.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT %s: %v", u, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT %s (%d bytes, %d children): %s", u, len(body), n, resp.Status)
	}
	return digest.FromBytes(body)
}

// servedAt records, per request path, when up finished answering a GET of it.
type servedAt struct {
	mu   sync.Mutex
	done map[string]time.Time
}

func (s *servedAt) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if r.Method == http.MethodGet {
			s.mu.Lock()
			s.done[r.URL.Path] = time.Now()
			s.mu.Unlock()
		}
	})
}

func (s *servedAt) at(path string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.done[path]
	return at, ok
}

// TestManyRefManifestsDoNotStallPulls: eight indexes of 27,000 child manifests each (about the
// most a 4 MiB manifest lists), pulled at once by digest through the cache from distribution's
// registry on loopback, are refused with a 400 MANIFEST_INVALID naming the count and the bound,
// all within a second of the upstream having sent the eight, and a cold pull of an unrelated
// 3-layer image started then takes under a second (it took 7.4 s while the
// eight were deduplicated quadratically, one after the other, under the store lock that every
// manifest store and blob commit takes). An index of exactly the bound (10,000 children) is
// stored and recorded within a second of the upstream's answer; one child more is refused.
// What the upstream itself takes (distribution spends about half a second on each such GET on
// two loaded cores) is not nodecache's and not timed.
//
//nolint:paralleltest // timed: runs before the package's parallel tests, not among them
func TestManyRefManifestsDoNotStallPulls(t *testing.T) {
	const huge, many = 8, 27_000
	up := mirrortest.NewRegistryWithConfig(t, func(c *configuration.Configuration) {
		c.Validation.Manifests.Indexes.Platforms = "none" // accept indexes whose children it lacks
	})
	served := &servedAt{done: map[string]time.Time{}}
	up.Wrap(served.wrap)
	up.PushImage(t, "team/small", "v1", mirrortest.Image(t, 4<<10, 3, "linux/amd64"))
	up.PushImage(t, "team/alone", "v1", mirrortest.Image(t, 4<<10, 3, "linux/amd64"))
	paths := make([]string, huge)
	for i := range huge {
		d := pushSparseIndex(t, up, "team/huge", fmt.Sprintf("h%d", i), fmt.Sprintf("huge %d", i), many)
		paths[i] = "/v2/team/huge/manifests/" + d.String()
	}
	atBound := pushSparseIndex(t, up, "team/bound", "at", "at the bound", maxRefs)
	overBound := pushSparseIndex(t, up, "team/bound", "over", "over the bound", maxRefs+1)

	h := newHarness(t, mirror.Options{Root: t.TempDir(), UpstreamTimeout: 30 * time.Second,
		Upstreams: []name.Upstream{upstreamFor(t, "upstream.test", up)}})
	h.runReady(t)

	// What a cold 3-layer pull takes on this machine now, with nothing else going on: the
	// bounds below are about the delay the eight add (at most a second), not the machine's
	// speed (two loaded cores make the pull itself take a good part of a second).
	start := time.Now()
	pullImage(t, h.host+"/upstream.test/team/alone:v1")
	alone := time.Since(start)
	t.Logf("3-layer pull alone: %s", alone)
	bound := time.Second + alone

	type answer struct {
		status int
		body   string
		at     time.Time
	}
	answers := make([]answer, huge)
	var wg sync.WaitGroup
	for i := range huge {
		wg.Go(func() {
			resp, body := get(t, http.MethodGet, fmtURL(h, strings.Replace(paths[i], "/v2/", "/v2/upstream.test/", 1)), manifestAccept)
			answers[i] = answer{resp.StatusCode, string(body), time.Now()}
		})
	}
	// Once the upstream has sent the eight bodies, the cache holds them all.
	deadline := time.Now().Add(time.Minute)
	for {
		n := 0
		for _, p := range paths {
			if _, ok := served.at(p); ok {
				n++
			}
		}
		if n == huge {
			break
		}
		if time.Now().After(deadline) {
			wg.Wait()
			t.Fatalf("upstream answered %d of %d manifest GETs in a minute; answers %+v", n, huge, answers)
		}
		time.Sleep(time.Millisecond)
	}
	start = time.Now()
	pullImage(t, h.host+"/upstream.test/team/small:v1") // manifest, config and 3 layers, all misses
	small := time.Since(start)
	wg.Wait()
	t.Logf("3-layer pull after the upstream sent the eight: %s", small)
	if small > bound {
		t.Errorf("a 3-layer pull took %s while %d indexes of %d children were being kept; want under %s (1s more than alone)", small, huge, many, bound)
	}
	for i, a := range answers {
		took := a.at.Sub(start)
		t.Logf("h%d: %d, %s after the upstream had sent the eight", i, a.status, took)
		if a.status != http.StatusBadRequest || !strings.Contains(a.body, `"code":"MANIFEST_INVALID"`) ||
			!strings.Contains(a.body, fmt.Sprintf("lists %d descriptors", many)) || !strings.Contains(a.body, fmt.Sprintf("more than %d per manifest", maxRefs)) {
			t.Errorf("h%d: %d %s; want 400 MANIFEST_INVALID naming %d descriptors and the bound %d", i, a.status, a.body, many, maxRefs)
		}
		if took > bound {
			t.Errorf("h%d: answered %s after the upstream had sent the eight; want refusals that do not wait on each other (< %s)", i, took, bound)
		}
	}

	resp, body := get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/bound/manifests/"+atBound.String()), manifestAccept)
	sent, _ := served.at("/v2/team/bound/manifests/" + atBound.String())
	took := time.Since(sent)
	t.Logf("index of %d children: %d, %s after the upstream's answer", maxRefs, resp.StatusCode, took)
	if resp.StatusCode != http.StatusOK || digest.FromBytes(body) != atBound {
		t.Fatalf("index of %d children: %d %.200s; want 200 and %s", maxRefs, resp.StatusCode, body, atBound)
	}
	if took > bound {
		t.Errorf("index of %d children took %s to store and record after the upstream's answer; want under %s", maxRefs, took, bound)
	}
	waitInventory(t, h.host, "the index of 10,000 children recorded", func(inv mirrorapi.CacheInventory) bool {
		for _, im := range inv.Images {
			if im.Repository == "team/bound" && im.Digest == atBound.String() {
				return true
			}
		}
		return false
	})
	resp, body = get(t, http.MethodGet, fmtURL(h, "/v2/upstream.test/team/bound/manifests/"+overBound.String()), manifestAccept)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), fmt.Sprintf("lists %d descriptors", maxRefs+1)) {
		t.Errorf("index of %d children: %d %s; want 400 naming %d descriptors", maxRefs+1, resp.StatusCode, body, maxRefs+1)
	}
}
