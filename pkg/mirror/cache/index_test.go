package cache

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// indexOf returns an OCI index body listing children (compact JSON, as a registry serves it).
func indexOf(t testing.TB, children []digest.Digest) []byte { return mirrortest.IndexJSON(t, children) }

// manyRefs is about the most child manifests a 4 MiB OCI index lists (154 bytes a descriptor).
const manyRefs = 27_000

// distinctDigests returns n different sha256 digests.
func distinctDigests(n int) []digest.Digest {
	out := make([]digest.Digest, n)
	for i := range out {
		out[i] = digest.FromString(fmt.Sprintf("ref %d", i))
	}
	return out
}

// TestManifestRefs: references come out once each, in order of first appearance, invalid digests
// left out; listed counts every descriptor (duplicates and invalid ones too), which is what
// keepManifest holds against MaxManifestRefs; the work is linear (27,000 distinct references,
// about the most a 4 MiB index holds, took about 0.9 s with the quadratic duplicate check).
func TestManifestRefs(t *testing.T) {
	t.Parallel()
	a, b, c := digest.FromString("a"), digest.FromString("b"), digest.FromString("c")
	raw := fmt.Sprintf(`{"schemaVersion":2,"config":{"digest":%q},"layers":[{"digest":%q},{"digest":%q},{"digest":"sha256:short"},{"digest":%q}]}`, a, b, a, c)
	refs, listed := ManifestRefs([]byte(raw), 0)
	if want := []digest.Digest{a, b, c}; !slices.Equal(refs, want) || listed != 5 {
		t.Errorf("ManifestRefs = %v, listed %d; want %v, listed 5", refs, listed, want)
	}
	if refs, listed := ManifestRefs([]byte("not json"), 0); refs != nil || listed != 0 {
		t.Errorf("unparsable: %v, listed %d; want nothing", refs, listed)
	}

	// The bound counts descriptors, not distinct digests: 10,001 copies of one child is over it.
	same := make([]digest.Digest, MaxManifestRefs+1)
	for i := range same {
		same[i] = a
	}
	if refs, listed := ManifestRefs(indexOf(t, same), 0); len(refs) != 1 || listed != MaxManifestRefs+1 {
		t.Errorf("%d copies of one child, no limit: %d refs, listed %d; want 1 and %d", len(same), len(refs), listed, MaxManifestRefs+1)
	}
	if refs, listed := ManifestRefs(indexOf(t, same), MaxManifestRefs); refs != nil || listed != MaxManifestRefs+1 {
		t.Errorf("%d copies of one child, limit %d: %d refs, listed %d; want none and %d", len(same), MaxManifestRefs, len(refs), listed, MaxManifestRefs+1)
	}
	if refs, listed := ManifestRefs(indexOf(t, distinctDigests(MaxManifestRefs)), MaxManifestRefs); len(refs) != MaxManifestRefs || listed != MaxManifestRefs {
		t.Errorf("%d distinct children, limit %d: %d refs, listed %d; want all of them", MaxManifestRefs, MaxManifestRefs, len(refs), listed)
	}

	many := distinctDigests(manyRefs)
	body := indexOf(t, many)
	if len(body) > 4<<20 {
		t.Fatalf("test index is %d bytes, over the 4 MiB manifest cap", len(body))
	}
	refs, listed = ManifestRefs(body, 0)
	if !slices.Equal(refs, many) || listed != len(many) {
		t.Fatalf("%d children: %d refs, listed %d; want every child once", len(many), len(refs), listed)
	}
	// Linear: within a small multiple of decoding the same body alone (best of three each, so a
	// loaded machine slows both alike). The quadratic check took 50 times the decode here.
	best := func(f func()) time.Duration {
		var b time.Duration
		for i := range 3 {
			start := time.Now()
			f()
			if d := time.Since(start); i == 0 || d < b {
				b = d
			}
		}
		return b
	}
	decode := best(func() {
		var m struct {
			Manifests []struct {
				Digest string `json:"digest"`
			} `json:"manifests"`
		}
		_ = json.Unmarshal(body, &m)
	})
	took := best(func() { ManifestRefs(body, 0) })
	t.Logf("%d distinct children: ManifestRefs %s, decoding alone %s", len(many), took, decode)
	if took > 8*decode {
		t.Errorf("ManifestRefs of %d distinct children took %s, %.0f times decoding them (%s); want linear time (< 8 times)",
			len(many), took, float64(took)/float64(decode), decode)
	}
}

// TestNextVictimLeastRecentlyUsed (issue 22): a blob no manifest references (held for the
// members of --peers) is evicted by the same rule as an image: least recently used first, a
// member's read counting as a pull. An old unreferenced blob goes before a recently pulled image,
// and one a member read recently goes after it; the data an image references never goes alone.
func TestNextVictimLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	x := NewIndex()
	layerA, layerB := digest.FromString("layer a"), digest.FromString("layer b")
	manA, manB := digest.FromString("manifest a"), digest.FromString("manifest b")
	oldBlob, readBlob := digest.FromString("held for peers, unread"), digest.FromString("held for peers, read")
	x.AddBlob("up/a", layerA, 10, t0)
	x.AddManifest("up/a", manA, 1, []digest.Digest{layerA}, t0.Add(2*time.Hour))
	x.AddBlob("up/b", layerB, 10, t0)
	x.AddManifest("up/b", manB, 1, []digest.Digest{layerB}, t0.Add(time.Hour))
	x.AddBlob("up/c", oldBlob, 10, t0)
	x.AddBlob("up/c", readBlob, 10, t0)
	x.ReadByPeer(readBlob, t0.Add(3*time.Hour))

	want := []Victim{{Manifest: oldBlob}, {Repo: "up/b", Manifest: manB}, {Repo: "up/a", Manifest: manA}, {Manifest: readBlob}}
	skip := map[Victim]bool{}
	var got []Victim
	for {
		v, ok := x.NextVictim(skip)
		if !ok {
			break
		}
		skip[v] = true
		got = append(got, v)
	}
	if !slices.Equal(got, want) {
		t.Errorf("eviction order %v, want %v", got, want)
	}
}
