package faults

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// kind is one kind of fault the suite injects (issue 23's list: resets and FIN cuts at random
// offsets, throttling, 5xx/429, black holes, corrupt, short and bad-206 bodies, SIGKILL mid-fill,
// a full disk, files corrupted on disk).
type kind string

const (
	kindReset     kind = "reset"
	kindFIN       kind = "fin"
	kindThrottle  kind = "throttle"
	kind5xx       kind = "5xx"
	kind429       kind = "429"
	kindBlackhole kind = "blackhole"
	kindCorrupt   kind = "corrupt"
	kindShort     kind = "short"
	kindBad206    kind = "bad206"
	kindSIGKILL   kind = "sigkill"
	kindDiskFull  kind = "diskfull"
	kindAtRest    kind = "atrest"
)

// kindSpec says how much of a kind a run injects and which answers to a request it broke are
// correct besides a 2xx with the right bytes and a cut transfer (the package documentation
// states each).
type kindSpec struct {
	kind kind
	// rounds of the kind in a run; target is the faults each round injects at least (a round
	// keeps sending waves of clients, each with new content, until it has): the kind's minimum
	// per run is rounds*target.
	rounds, target int
	// refusals are the error statuses that are a correct answer to a request for content not
	// cached before the round (content cached before it must be served: 2xx or a cut).
	refusals []int
}

// minimum is the faults of the kind a run must inject.
func (s kindSpec) minimum() int { return s.rounds * s.target }

// refused reports whether status is a correct refusal for this kind.
func (s kindSpec) refused(status int) bool { return slices.Contains(s.refusals, status) }

// specs are the kinds in the order the summary lists them. The minimums add up to more than the
// 200 faults a run must inject (issue 23).
var specs = []kindSpec{
	// The upstream connection is cut by a TCP reset, or by a FIN before Content-Length, at a
	// random offset of the answer (before the headers sometimes): nodecache resumes with Range;
	// what it cannot get is an upstream that failed (503).
	{kind: kindReset, rounds: 4, target: 8, refusals: []int{http.StatusServiceUnavailable}},
	{kind: kindFIN, rounds: 4, target: 8, refusals: []int{http.StatusServiceUnavailable}},
	// Every upstream connection throttled (toxiproxy's bandwidth and latency): slow is not
	// failing; only 429 (nodecache's own upstream concurrency bound) may refuse.
	{kind: kindThrottle, rounds: 3, target: 5, refusals: []int{http.StatusTooManyRequests}},
	// The upstream answers 500, 502, 503 or 504: 503. Its 429: 429 with a Retry-After.
	{kind: kind5xx, rounds: 3, target: 8, refusals: []int{http.StatusServiceUnavailable}},
	{kind: kind429, rounds: 3, target: 5, refusals: []int{http.StatusTooManyRequests}},
	// The upstream never answers (toxiproxy's timeout toxic on every connection) or stops in the
	// middle of a blob's body and holds the connection open: 503 (timed out), or 429 from a bound on
	// requests waiting for an upstream.
	{kind: kindBlackhole, rounds: 3, target: 5, refusals: []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}},
	// The upstream's answer is wrong: bytes flipped, a 200 shorter than the content, a 206 whose
	// bytes are not the range asked for: 502, naming what was wrong (issue 23, "one status code
	// per cause").
	{kind: kindCorrupt, rounds: 4, target: 8, refusals: []int{http.StatusBadGateway}},
	{kind: kindShort, rounds: 3, target: 5, refusals: []int{http.StatusBadGateway}},
	{kind: kindBad206, rounds: 3, target: 5, refusals: []int{http.StatusBadGateway}},
	// serve killed (SIGKILL) while a fill streams, then started again on the same root: what
	// was in flight is cut; before the kill the upstream is slow (503, 429 as for a black hole).
	{kind: kindSIGKILL, rounds: 4, target: 1, refusals: []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}},
	// The root's file system (a tmpfs) has no room for the blobs: served without being stored,
	// or 503 (which sends containerd to the next host).
	{kind: kindDiskFull, rounds: 4, target: 5, refusals: []int{http.StatusServiceUnavailable}},
	// Stored blobs and a manifest flipped, truncated or emptied: never a refusal, the right
	// bytes or a cut.
	{kind: kindAtRest, rounds: 3, target: 4},
}

func specOf(k kind) kindSpec {
	for _, s := range specs {
		if s.kind == k {
			return s
		}
	}
	panic("unknown kind " + string(k))
}

// parseKinds reads NODECACHE_FAULTS_KINDS: a comma-separated subset of the kinds; empty: all.
func parseKinds(v string) ([]kind, error) {
	if strings.TrimSpace(v) == "" {
		out := make([]kind, 0, len(specs))
		for _, s := range specs {
			out = append(out, s.kind)
		}
		return out, nil
	}
	var out []kind
	for _, f := range strings.Split(v, ",") {
		k := kind(strings.TrimSpace(f))
		if !slices.ContainsFunc(specs, func(s kindSpec) bool { return s.kind == k }) {
			var all []string
			for _, s := range specs {
				all = append(all, string(s.kind))
			}
			return nil, fmt.Errorf("NODECACHE_FAULTS_KINDS: unknown kind %q; the kinds are %s", k, strings.Join(all, ","))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}
