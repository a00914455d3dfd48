package mirrorapi

// PeersPath is serve's view of its cluster (--peers; GET, JSON Peers; same access rule as
// ClientsPath: loopback and the --allow networks). With ?digest=<digest> the answer names the
// member that owns it. 404 when the mirror has no peers.
const PeersPath = "/nodecache/v1/peers"

// Peers is the JSON document served at PeersPath.
type Peers struct {
	// Self is this node's instance id (the id its peer port announces); SelfListed whether the
	// member source lists this node itself.
	Self       string `json:"self"`
	SelfListed bool   `json:"self_listed"`
	// Source is the --peers value.
	Source string `json:"source"`
	// Members are the members other than this node, live ones first by id, then failed ones by
	// address.
	Members []PeerMember `json:"members"`
	// Digest and Owner, with ?digest=: the digest asked about and the instance id of the member
	// that owns it (rendezvous hashing over the live members and this node); OwnerAddr is its
	// peer-port address ("" when this node owns it).
	Digest    string `json:"digest,omitempty"`
	Owner     string `json:"owner,omitempty"`
	OwnerAddr string `json:"owner_addr,omitempty"`
}

// PeerMember is one member as this node sees it.
type PeerMember struct {
	// ID is the instance id it announced ("" for a failed address).
	ID string `json:"id,omitempty"`
	// Addr is its peer-port address (HOST:PORT).
	Addr string `json:"addr"`
	// State is PeerLive or PeerFailed; Error says why a failed one failed.
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// Member states of PeerMember.State, as nodecache_peers{state} counts them.
const (
	PeerLive   = "live"
	PeerFailed = "failed"
)
