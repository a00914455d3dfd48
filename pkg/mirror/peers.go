package mirror

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodecache/nodecache/pkg/mirror/peer"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// PeerOptions make the node caches of a cluster one shared tier (--peers, docs/peers.md): each
// blob and manifest by digest has an owner among the members (peer.Rank), which fills it from
// the upstream once for every node that asks; the others fetch it from the owner.
type PeerOptions struct {
	// Source lists the members' peer-port addresses (--peers: dns:, file: or a list).
	Source peer.Source
	// Keys sign this node's requests to members and check theirs (--peer-key-file).
	Keys *peer.Keys
	// Refresh is how often Source is read again (--peers-refresh). Default DefaultPeersRefresh.
	Refresh time.Duration
	// DialTimeout bounds a connection to a member (--peer-dial-timeout). Default
	// upstream.DefaultPeerDialTimeout.
	DialTimeout time.Duration
}

// DefaultPeersRefresh is PeerOptions.Refresh's default.
const DefaultPeersRefresh = 10 * time.Second

// RefusedPeerKey is the reason of nodecache_refused_total for a request to the peer port
// without a valid proof (401).
const RefusedPeerKey = "peer_key"

// peering is a Mirror's membership of its cluster.
type peering struct {
	opts       PeerOptions
	membership *peer.Membership
	health     *peer.Health
}

// newPeering builds the membership of opts for instance self (nil when opts is nil) and the
// upstream side's peer tier; it starts nothing (run).
func newPeering(opts *PeerOptions, self string, o Options) (*peering, *upstream.Peers) {
	if opts == nil {
		return nil, nil
	}
	p := &peering{opts: *opts, health: peer.NewHealth(o.Clock)}
	if p.opts.Refresh <= 0 {
		p.opts.Refresh = DefaultPeersRefresh
	}
	if p.opts.DialTimeout <= 0 {
		p.opts.DialTimeout = upstream.DefaultPeerDialTimeout
	}
	p.membership = peer.NewMembership(peer.MembershipOptions{
		Source: p.opts.Source, Self: self, Keys: p.opts.Keys, Refresh: p.opts.Refresh,
		DialTimeout: p.opts.DialTimeout, Logger: o.Logger, Clock: o.Clock,
	})
	return p, &upstream.Peers{Members: p.membership.Members, Keys: p.opts.Keys, Health: p.health, DialTimeout: p.opts.DialTimeout, Logger: o.Logger}
}

// register adds nodecache_peers{state="live|failed"} to reg.
func (p *peering) register(reg prometheus.Registerer) error {
	if p == nil {
		return nil
	}
	for _, state := range []string{"live", "failed"} {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "nodecache_peers",
			Help:        "Members of the cluster (--peers) other than this node: live (answered with their instance id) or failed (listed, but not answering or refusing this node's key).",
			ConstLabels: prometheus.Labels{"state": state},
		}, func() float64 {
			live, failed := p.membership.Count()
			if state == "live" {
				return float64(live)
			}
			return float64(failed)
		})
		if err := reg.Register(g); err != nil {
			return err
		}
	}
	return nil
}

// source is the --peers value ("" without peers).
func (p *peering) source() string {
	if p == nil {
		return ""
	}
	return p.opts.Source.String()
}

// run keeps the membership until ctx ends (nothing without peers).
func (p *peering) run(ctx context.Context) {
	if p != nil {
		p.membership.Run(ctx)
	}
}

// PeerHandler answers this node's peer port (ServeOptions.PeerListen): the instance id
// (peer.IDPath) and GET and HEAD of blobs and manifests by digest of configured upstreams, for
// requests that carry a valid proof of the cluster key (peer.Keys.Verify; otherwise 401 and
// nothing is fetched). A member's request is served as a client's would be (from the cache, or
// filled once from the upstream for every node that asks), except that it is not client
// evidence, --pull-allow does not apply (the key is the gate), it asks no other member but one
// cache-only probe, and with the cache-only mode (upstream.HeaderPeerMode) it is answered from
// the cache only. Nil when the mirror has no peers.
func (m *Mirror) PeerHandler() http.Handler {
	if m.peering == nil {
		return nil
	}
	id := peer.IDHandler(m.fetch.InstanceID(), m.peering.opts.Keys, m.opts.Clock)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sender, err := m.peering.opts.Keys.Verify(r, m.opts.Clock())
		if err != nil {
			// Id requests too: once a member holds another key, they are all it sends.
			m.metrics.refused.WithLabelValues(RefusedPeerKey).Inc()
			m.log.Warn().Err(err).Str("client", r.RemoteAddr).Str("path", r.URL.Path).Msg("peer request refused")
		}
		if r.URL.Path == peer.IDPath {
			id.ServeHTTP(w, r) // answers 401 itself when the proof fails
			return
		}
		if err != nil {
			(&apiError{Status: http.StatusUnauthorized, Code: "UNAUTHORIZED", Message: err.Error()}).write(w)
			return
		}
		_, kind, ref, _, ok := apiPath(r.URL.Path)
		if !ok || (kind != kindBlob && kind != kindManifest) || !digestRe.MatchString(ref) {
			errNotFound("UNSUPPORTED", "the peer port serves blobs and manifests by digest only: "+r.URL.Path).write(w)
			return
		}
		cacheOnly := r.Header.Get(upstream.HeaderPeerMode) == upstream.PeerModeCacheOnly
		m.serveRegistry(w, r.WithContext(upstream.WithPeerRequest(r.Context(), sender, cacheOnly)))
	})
}

// servePeers answers mirrorapi.PeersPath (GET; loopback and --allow networks): the members as
// this node sees them, and with ?digest= the owner of that digest.
func (m *Mirror) servePeers(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case !m.clients.allowed(r.RemoteAddr):
		m.metrics.refused.WithLabelValues(RefusedAllow).Inc()
		writeJSONError(w, http.StatusForbidden, "the peer list is served to loopback and --allow networks only")
		return
	case r.Method != http.MethodGet:
		w.Header().Set("Allow", http.MethodGet)
		writeJSONError(w, http.StatusMethodNotAllowed, "only GET is served here")
		return
	case m.peering == nil:
		writeJSONError(w, http.StatusNotFound, "this node has no peers (--peers is not set)")
		return
	}
	ms := m.peering.membership
	doc := mirrorapi.Peers{Self: m.fetch.InstanceID(), SelfListed: ms.Self(), Source: m.peering.opts.Source.String(), Members: []mirrorapi.PeerMember{}}
	live := ms.Members()
	for _, p := range live {
		doc.Members = append(doc.Members, mirrorapi.PeerMember{ID: p.ID, Addr: p.Addr, State: mirrorapi.PeerLive})
	}
	failures := ms.Failures()
	addrs := make([]string, 0, len(failures))
	for a := range failures {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	for _, a := range addrs {
		doc.Members = append(doc.Members, mirrorapi.PeerMember{Addr: a, State: mirrorapi.PeerFailed, Error: failures[a].Error()})
	}
	if q := r.URL.Query().Get("digest"); q != "" {
		d, err := digest.Parse(q)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("digest %q: %v (want algorithm:hex, e.g. sha256:…)", q, err))
			return
		}
		owner := peer.Rank(append(live, peer.Member{ID: doc.Self}), d)[0]
		doc.Digest, doc.Owner, doc.OwnerAddr = d.String(), owner.ID, owner.Addr
	}
	_ = json.NewEncoder(w).Encode(doc)
}

// cacheOnly reports whether ctx serves a member's cache-only probe: answered from the cache only.
func cacheOnly(ctx context.Context) bool {
	_, only, _ := upstream.PeerRequest(ctx)
	return only
}

// peerSender is the instance id of the member whose request r is ("" for a client's).
func peerSender(r *http.Request) string {
	sender, _, _ := upstream.PeerRequest(r.Context())
	return sender
}

// fromPeer reports whether r is a member's request to the peer port.
func fromPeer(r *http.Request) bool {
	_, _, ok := upstream.PeerRequest(r.Context())
	return ok
}
