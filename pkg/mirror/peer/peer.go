// Package peer is what node caches that share blobs with each other need to know about each
// other: who the members are (Membership, from a Source: --peers), which member owns a digest
// (Rank), how a request between them is authenticated (Keys: an HMAC proof over the request),
// and which members to leave alone for a while (Health).
//
// It is a leaf of pkg/mirror: it imports nothing from pkg/mirror or its other subpackages, so
// that the serve path can use it from any of them.
package peer

import (
	"cmp"
	"slices"

	"github.com/cespare/xxhash/v2"
	digest "github.com/opencontainers/go-digest"
)

// Member is a node cache as seen through its peer port.
type Member struct {
	ID   string // the instance id its peer port announces
	Addr string // host:port of its peer port (IPv6 bracketed)
}

// Rank orders members for the blob or manifest digest d by rendezvous (highest random weight)
// hashing (Thaler and Ravishankar, "Using name-based mappings to increase hit rates", 1998): a
// member's score is the xxhash64 of its ID + "\x00" + d; highest first, ties broken by ID
// (lowest first, then Addr). A member joining or leaving moves only the digests it wins or
// loses, and every node with the same members ranks alike. members is not changed; the result is
// a new slice.
func Rank(members []Member, d digest.Digest) []Member {
	type scored struct {
		m     Member
		score uint64
	}
	s := make([]scored, len(members))
	h := xxhash.New()
	for i, m := range members {
		h.Reset()
		_, _ = h.WriteString(m.ID)
		_, _ = h.WriteString("\x00")
		_, _ = h.WriteString(string(d))
		s[i] = scored{m: m, score: h.Sum64()}
	}
	slices.SortFunc(s, func(a, b scored) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		if c := cmp.Compare(a.m.ID, b.m.ID); c != 0 {
			return c
		}
		return cmp.Compare(a.m.Addr, b.m.Addr) // the same ID twice: still one order
	})
	out := make([]Member, len(s))
	for i := range s {
		out[i] = s[i].m
	}
	return out
}
