package mirror

import (
	"context"
	"net/http"
	"sync"

	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// reqState is what the pull-through services learn about one request; the access-log
// middleware turns it into headers, the log line and metrics.
type reqState struct {
	mu         sync.Mutex
	cache      string
	retryAfter string
	upBytes    int64 // bytes this response took from an in-flight fill (served from upstream)
	localBlob  bool  // Stat found the blob in local storage
	// remoteBlob is what the upstream said of the blob (Stat asks once per request).
	remoteBlob *v1.Descriptor
	// head: the client's request is a HEAD (a blob's size is then probed, not fetched).
	head bool
	// pendingTag is a tag the upstream moved: stored locally once its manifest is.
	pendingTag *pendingTag
	// clientName is the repository name as the client sent it in the path (tags/list answers
	// with it); clientPath and ns are the client's path and ?ns= (a Link header keeps them).
	clientName, clientPath, ns string
	// badGateway turns distribution's 500 UNKNOWN into a 502: the upstream's answer, not this
	// cache, was at fault.
	badGateway bool
	// loop turns distribution's 500 UNKNOWN into a 508: the shared tier refused a loop.
	loop bool
	// tier is where the latest upstream answer for this request came from (upstream.TierShared,
	// upstream.TierUpstream); "" when no upstream was asked.
	tier string
	// w is the request's response writer as serveRegistry wraps it (it passes io.ReaderFrom on to
	// the server's connection); distribution hands its handlers a wrapper that hides ReadFrom.
	w http.ResponseWriter
}

type pendingTag struct {
	tag  string
	desc v1.Descriptor
}

type stateKey struct{}

func withState(ctx context.Context, st *reqState) context.Context {
	return context.WithValue(ctx, stateKey{}, st)
}

// stateFrom returns the request's state; a detached throwaway for contexts without one.
func stateFrom(ctx context.Context) *reqState {
	if st, ok := ctx.Value(stateKey{}).(*reqState); ok {
		return st
	}
	return &reqState{}
}

// setCache records how the request is answered. A later, stronger answer wins: miss beats
// revalidated and hit; stale and coalesced are never downgraded.
func (s *reqState) setCache(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.cache {
	case "":
		s.cache = v
	case mirrorapi.CacheHit, mirrorapi.CacheRevalidated:
		if v != mirrorapi.CacheHit {
			s.cache = v
		}
	}
}

func (s *reqState) cacheValue() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cache
}

func (s *reqState) setTier(v string) {
	s.mu.Lock()
	s.tier = v
	s.mu.Unlock()
}

func (s *reqState) setRetryAfter(v string) {
	s.mu.Lock()
	s.retryAfter = v
	s.mu.Unlock()
}
