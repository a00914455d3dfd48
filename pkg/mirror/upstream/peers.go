package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/peer"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// TierPeer is another node cache of the cluster (--peers): where a blob or a manifest by digest
// came from when its owner (peer.Rank) or the next-ranked member served it.
const TierPeer = "peer"

// Peers are the other node caches of the cluster (--peers, issue 22): a blob or a manifest by
// digest is asked of its owner first, the member rendezvous hashing ranks highest for the digest
// (peer.Rank), which serves it from its cache or fills it once for every node that asks.
type Peers struct {
	// Members returns the live members other than this node (peer.Membership.Members).
	Members func() []peer.Member
	// Keys sign every request to a member (--peer-key-file).
	Keys *peer.Keys
	// Health skips members that fail (peer.Health); nil: a new one.
	Health *peer.Health
	// DialTimeout bounds a connection to a member (--peer-dial-timeout). Default 1 s.
	DialTimeout time.Duration
	// Logger receives members' failures (each falls back to the next member or the upstream).
	Logger zerolog.Logger
}

// DefaultPeerDialTimeout is Peers.DialTimeout's default.
const DefaultPeerDialTimeout = time.Second

// peerTier asks the members of Peers, for every upstream.
type peerTier struct {
	Peers
	transport *http.Transport
	// probeTimeout bounds a cache-only probe, headers included: the member answers it from its
	// cache or not at all.
	probeTimeout time.Duration
	now          func() time.Time
}

// newPeerTier builds the tier of p (nil when p is nil). A member's answer may legitimately wait
// for its own cache-only probe and its upstream's headers, so the headers of a peer's answer
// are waited for PeerHeaderTimeout: longer than the owner waits for its upstream, or nine nodes
// give up on the tenth and fetch directly.
func newPeerTier(p *Peers, timeout time.Duration, chained bool, now func() time.Time) *peerTier {
	if p == nil {
		return nil
	}
	t := &peerTier{Peers: *p, now: now}
	if t.DialTimeout <= 0 {
		t.DialTimeout = DefaultPeerDialTimeout
	}
	if t.Health == nil {
		t.Health = peer.NewHealth(now)
	}
	t.probeTimeout = t.DialTimeout + 2*time.Second
	d := &net.Dialer{Timeout: t.DialTimeout, KeepAlive: 30 * time.Second}
	t.transport = &http.Transport{
		DialContext:           d.DialContext,
		ResponseHeaderTimeout: PeerHeaderTimeout(timeout, t.DialTimeout, chained),
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   16,
		DisableCompression:    true,
	}
	return t
}

// PeerHeaderTimeout is how long a node waits for a member's answer headers: this node's dial,
// the member's cache-only probe (dial and answer) and its upstream's headers (timeout; with
// chained, the shared tier's share too, as the members share this node's settings). Longer than
// the owner waits for its upstream, so the members do not give up on a slow upstream's owner
// and fetch it themselves; 14 s at the defaults (10 s, 1 s), so that a hung member and the
// upstream after it fit in containerd's 30 s wait for response headers.
func PeerHeaderTimeout(timeout, dial time.Duration, chained bool) time.Duration {
	t := dial + (dial + 2*time.Second) + timeout
	if chained {
		t += SharedTierTimeout(timeout)
	}
	return t
}

type peerRequestKey struct{}

// peerRequest marks a request a member sent to this node's peer port.
type peerRequest struct {
	sender    string
	cacheOnly bool
}

// WithPeerRequest returns a context for serving a request member sender sent to the peer port:
// its upstream requests ask no member but one cache-only probe (a peer request never goes on to
// a third node otherwise), and with cacheOnly the caller answers from its cache only.
func WithPeerRequest(ctx context.Context, sender string, cacheOnly bool) context.Context {
	return context.WithValue(ctx, peerRequestKey{}, peerRequest{sender: sender, cacheOnly: cacheOnly})
}

// PeerRequest reports whether ctx serves a member's request, which member sent it and whether it
// asks for the cache only.
func PeerRequest(ctx context.Context) (sender string, cacheOnly, ok bool) {
	p, ok := ctx.Value(peerRequestKey{}).(peerRequest)
	return p.sender, p.cacheOnly, ok
}

type peerMemoryKey struct{}

// peerMemory is what one fill remembers of the members that served it: a resume after a broken
// stream goes to another member or the upstream, never the same member again.
type peerMemory struct {
	mu   sync.Mutex
	used map[string]bool
}

func withPeerMemory(ctx context.Context) context.Context {
	return context.WithValue(ctx, peerMemoryKey{}, &peerMemory{used: map[string]bool{}})
}

func peerMemoryFrom(ctx context.Context) *peerMemory {
	pm, _ := ctx.Value(peerMemoryKey{}).(*peerMemory)
	return pm
}

func (pm *peerMemory) skip(id string) bool {
	if pm == nil {
		return false
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	return pm.used[id]
}

func (pm *peerMemory) served(id string) {
	if pm == nil {
		return
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	pm.used[id] = true
}

// members are the members that served this fill or fetch.
func (pm *peerMemory) members() []string {
	if pm == nil {
		return nil
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	out := make([]string, 0, len(pm.used))
	for id := range pm.used {
		out = append(out, id)
	}
	return out
}

// distrustPeers skips, for peer.DistrustFor, every member that served part of the fill or fetch
// of ctx: bytes that did not match their digest came from one of them (or from the upstream,
// which is asked anyway). The fill fails and nothing is stored, as with a bad upstream.
func (f *Fetcher) distrustPeers(ctx context.Context) {
	if f.peers == nil {
		return
	}
	for _, id := range peerMemoryFrom(ctx).members() {
		f.peers.Health.Distrust(id)
		f.peers.Logger.Warn().Str("peer", id).Str("for", peer.DistrustFor.String()).Msg("peer served bytes that do not match their digest; skipping it")
	}
}

// peerDigest reports whether a request of kind for ref goes to the peers: blobs, and manifests
// by digest (a tag is always resolved by this node from its upstream).
func peerDigest(kind, ref string) (digest.Digest, bool) {
	if kind != "blobs" && kind != "manifests" {
		return "", false
	}
	d, err := digest.Parse(ref)
	return d, err == nil
}

// doPeers sends the request of client.do to the members for digest d, best-ranked first (see
// Peers): the members that outrank this node get the request itself, then the best usable member
// after this node one cache-only probe; a request from a member gets only the probe. It
// reports done with the answer to pass on (a member's success, or the upstream's own 404, 403
// or 429 the owner passed through); not done when every member failed or did not have it: the
// caller then asks the upstream.
func (c *client) doPeers(ctx context.Context, op, method, repo, kind string, d digest.Digest, hdr http.Header, want []int) (resp *http.Response, err error, done bool) {
	members := c.peers.Members()
	if len(members) == 0 {
		return nil, nil, false
	}
	ranked := peer.Rank(append(members, peer.Member{ID: c.instanceID}), d)
	sender, _, fromPeer := PeerRequest(ctx)
	pm := peerMemoryFrom(ctx)
	below := fromPeer // past this node's rank (or serving a member): probes only
	for _, m := range ranked {
		switch {
		case m.ID == c.instanceID:
			below = true
			continue
		case m.ID == sender || pm.skip(m.ID) || !c.peers.Health.Usable(m.ID):
			continue
		}
		resp, err, done := c.askPeer(ctx, op, method, repo, kind, d, hdr, want, m, below)
		if done {
			if err == nil {
				pm.served(m.ID)
			}
			return resp, err, true
		}
		if below {
			break // one probe, never further
		}
	}
	return nil, nil, false
}

// Peer protocol headers.
const (
	// HeaderPeerMode, set to PeerModeCacheOnly, asks a member to answer from its cache only.
	HeaderPeerMode    = "X-Nodecache-Peer-Mode"
	PeerModeCacheOnly = "cache-only"
)

// askPeer sends one request to member m (a cache-only probe with probe) and classifies the
// answer: done with the response for a wanted status; done with an *Error for the upstream's
// own 404 (BLOB_UNKNOWN, MANIFEST_UNKNOWN), 403 or 429 the member passed through; not done for a
// member's failure (no answer, timeout, 5xx, 401 for a bad key, 508, any other 404), counted
// against it, and for a probe's 404 (the member does not have it).
func (c *client) askPeer(ctx context.Context, op, method, repo, kind string, d digest.Digest, hdr http.Header, want []int, m peer.Member, probe bool) (*http.Response, error, bool) {
	op += " (peer " + m.Addr + ")"
	if !probe {
		return c.sendPeer(ctx, op, method, repo, kind, d, hdr, want, m, false)
	}
	pctx, cancel := context.WithTimeout(ctx, c.peers.probeTimeout)
	resp, err, done := c.sendPeer(pctx, op, method, repo, kind, d, hdr, want, m, true)
	if done && err == nil {
		resp.Body = cancelOnClose{ReadCloser: resp.Body, cancel: cancel} // the body outlives this call
	} else {
		cancel()
	}
	return resp, err, done
}

// cancelOnClose ends a request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func (c *client) sendPeer(ctx context.Context, op, method, repo, kind string, d digest.Digest, hdr http.Header, want []int, m peer.Member, probe bool) (*http.Response, error, bool) {
	u := url.URL{Scheme: "http", Host: m.Addr, Path: "/v2/" + repo + "/" + kind + "/" + d.String(),
		RawQuery: url.Values{"ns": {c.up.Name}}.Encode()}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, nil, false
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", c.userAgent)
	req.Header.Set("Via", viaHeader(ctx, c.instanceID))
	if probe {
		req.Header.Set(HeaderPeerMode, PeerModeCacheOnly)
	}
	c.peers.Keys.Sign(req, c.instanceID, c.peers.now())
	resp, err := (&http.Client{Transport: c.peers.transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}).Do(req)
	if err != nil {
		if ctx.Err() == nil || probe {
			if isTimeout(err) {
				c.peers.Health.Hung(m.ID) // the whole budget spent: not again for a while
			} else {
				c.peers.Health.Done(m.ID, true) // no connection
			}
			c.peers.Logger.Warn().Str("peer", m.ID).Str("addr", m.Addr).Str("op", op).Err(err).Msg("peer did not answer; asking the next member or the upstream")
			c.noteFailure(TierPeer, &Error{Upstream: c.up.Name, Op: op, Err: err})
		}
		return nil, nil, false
	}
	for _, w := range want {
		if resp.StatusCode == w {
			c.peers.Health.Done(m.ID, false)
			reportTier(ctx, TierPeer)
			return resp, nil, true
		}
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	code := resp.Header.Get(mirrorapi.HeaderErrorCode) // a HEAD answer has no body
	if code == "" {
		code = errorCode(body)
	}
	switch {
	case probe && resp.StatusCode == http.StatusNotFound:
		c.peers.Health.Done(m.ID, false) // not in its cache: an answer, not a failure
		return nil, nil, false
	case resp.StatusCode == http.StatusNotFound && (code == "BLOB_UNKNOWN" || code == "MANIFEST_UNKNOWN"),
		resp.StatusCode == http.StatusForbidden, resp.StatusCode == http.StatusTooManyRequests:
		// The upstream's own answer, passed through the owner: the client's.
		c.peers.Health.Done(m.ID, false)
		reportTier(ctx, TierPeer)
		return nil, &Error{Upstream: c.up.Name, Op: op, Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}, true
	}
	c.peers.Health.Done(m.ID, true)
	c.noteFailure(TierPeer, &Error{Upstream: c.up.Name, Op: op, Status: resp.StatusCode,
		Err: fmt.Errorf("peer %s answered HTTP %d %s", m.ID, resp.StatusCode, code)})
	c.peers.Logger.Warn().Str("peer", m.ID).Str("addr", m.Addr).Str("op", op).Int("status", resp.StatusCode).Str("code", code).
		Msg("peer failed; asking the next member or the upstream")
	return nil, nil, false
}

// isTimeout reports whether err is a timeout: the member accepted the connection (or did not
// within the dial timeout) and did not answer within its budget.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// errorCode is the first OCI error code of an error body ("" when it has none).
func errorCode(body []byte) string {
	var e struct {
		Errors []struct {
			Code string `json:"code"`
		} `json:"errors"`
	}
	if json.NewDecoder(bytes.NewReader(body)).Decode(&e) != nil || len(e.Errors) == 0 {
		return ""
	}
	return strings.ToUpper(e.Errors[0].Code)
}
