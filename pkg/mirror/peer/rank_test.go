package peer_test

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
	digest "github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror/peer"
)

func members(n int) []peer.Member {
	out := make([]peer.Member, n)
	for i := range out {
		out[i] = peer.Member{ID: fmt.Sprintf("%016x", xxhash.Sum64String("member"+strconv.Itoa(i))), Addr: fmt.Sprintf("10.0.0.%d:5001", i+1)}
	}
	return out
}

func TestRankDeterministic(t *testing.T) {
	t.Parallel()
	ms := members(5)
	d := digest.FromString("layer")
	first := peer.Rank(ms, d)
	if len(first) != len(ms) {
		t.Fatalf("Rank returned %d members; want %d", len(first), len(ms))
	}
	reversed := slices.Clone(ms)
	slices.Reverse(reversed)
	again := peer.Rank(reversed, d)
	if !slices.Equal(first, again) {
		t.Errorf("the order of the input changed the ranking:\n%v\n%v", first, again)
	}
	if !slices.Equal(ms, members(5)) {
		t.Error("Rank changed its argument")
	}
	first[0].ID = "changed"
	if peer.Rank(ms, d)[0].ID == "changed" {
		t.Error("Rank's result shares memory with an earlier result")
	}
	// The score is xxhash64(ID + "\x00" + digest), highest first.
	ranked := peer.Rank(ms, d)
	for i := 1; i < len(ranked); i++ {
		prev := xxhash.Sum64String(ranked[i-1].ID + "\x00" + string(d))
		cur := xxhash.Sum64String(ranked[i].ID + "\x00" + string(d))
		if prev < cur {
			t.Errorf("position %d scores %x, below position %d's %x", i-1, prev, i, cur)
		}
	}
	// Equal scores (the same ID at two addresses) come out in one order whatever the input's.
	x, y := peer.Member{ID: "b", Addr: "10.0.0.2:1"}, peer.Member{ID: "b", Addr: "10.0.0.1:1"}
	for range 20 {
		if got := peer.Rank([]peer.Member{x, {ID: "a"}, y}, d); !slices.Equal(got, peer.Rank([]peer.Member{y, x, {ID: "a"}}, d)) {
			t.Fatalf("tied members ranked by input order: %v", got)
		}
	}
	if got := peer.Rank(nil, d); len(got) != 0 {
		t.Errorf("Rank(nil) = %v", got)
	}
}

func TestRankSpread(t *testing.T) {
	t.Parallel()
	ms := members(10)
	wins := map[string]int{}
	for i := range 10_000 {
		wins[peer.Rank(ms, digest.FromString(strconv.Itoa(i)))[0].ID]++
	}
	for _, m := range ms {
		if n := wins[m.ID]; n < 800 || n > 1200 {
			t.Errorf("member %s owns %d of 10,000 digests; want 1,000 ± 20 %%", m.ID, n)
		}
	}
}

func TestRankMemberLeaves(t *testing.T) {
	t.Parallel()
	ms := members(10)
	gone := ms[3]
	rest := slices.Delete(slices.Clone(ms), 3, 4)
	moved := 0
	for i := range 10_000 {
		d := digest.FromString(strconv.Itoa(i))
		before := peer.Rank(ms, d)
		after := peer.Rank(rest, d)
		want := before[0]
		if want == gone {
			want = before[1] // the runner-up takes over exactly the digests gone owned
			moved++
		}
		if after[0] != want {
			t.Fatalf("digest %d: owner %s after %s left; want %s (owner before: %s)", i, after[0].ID, gone.ID, want.ID, before[0].ID)
		}
		// The rest of the order is the old order without gone.
		if !slices.Equal(after, slices.DeleteFunc(slices.Clone(before), func(m peer.Member) bool { return m == gone })) {
			t.Fatalf("digest %d: order %v; want %v without %s", i, after, before, gone.ID)
		}
	}
	if moved == 0 {
		t.Fatal("the member that left owned no digest; the test shows nothing")
	}
}
