// Package mirrorapi is the wire contract between nodecache serve and its clients (status, the
// agent, warm, and the files gen writes): the cache header and its values, the client-evidence
// endpoint and its JSON document, the canary repository, the manifest Accept list and the marker
// line of the files nodecache owns. Standard library only: a client links this, never the server.
package mirrorapi

import (
	"bytes"
	"time"
)

// HeaderCache is the response header by which serve says how it answered a registry request
// (docs/serve.md, "Cache semantics"). Other registries and mirrors do not send it.
const HeaderCache = "X-Nodecache-Cache"

// HeaderVersion is the response header by which serve announces itself on /v2/ (its version as
// value): a nodecache whose upstream URL answers with it forwards ?ns= to it, as to a --chain
// shared cache.
const HeaderVersion = "Nodecache-Version"

// ViaProduct is the product name of the Via entry ("1.1 nodecache/<instance-id>", RFC 9110
// section 7.6.3) each nodecache adds to a request it sends to a shared nodecache; a request that
// comes back to an instance already named in it is refused with 508 Loop Detected.
const ViaProduct = "nodecache"

// HeaderErrorCode is the response header that repeats the OCI error code of an error answer
// (distribution spec, "Error Codes"): a HEAD answer has no body to read it from, and a member
// of a cluster (--peers) tells an upstream's 404 passed through (BLOB_UNKNOWN, MANIFEST_UNKNOWN)
// from its own refusal (NAME_UNKNOWN) by it.
const HeaderErrorCode = "X-Nodecache-Error-Code"

// Values of HeaderCache.
const (
	CacheHit         = "hit"         // served locally without contacting the upstream
	CacheRevalidated = "revalidated" // tag confirmed with the upstream, content served locally
	CacheMiss        = "miss"        // fetched from the upstream for this request
	CacheCoalesced   = "coalesced"   // joined a fetch another request had started
	CacheStale       = "stale"       // the upstream failed; the cached copy was served
)

// ClientsPath is where serve answers client evidence (GET, JSON ClientEvidence): which
// user-agent families pulled from which client addresses. Answered to loopback clients and the
// --allow networks only (403 otherwise).
const ClientsPath = "/nodecache/v1/clients"

// User-agent families in ClientRecord.UserAgents that status and the agent look for: the first
// product token of the runtime's User-Agent, lower case ("containerd/2.1.0" → "containerd").
const (
	FamilyContainerd = "containerd"
	FamilyCRIO       = "cri-o"
)

// ClientEvidence is the JSON document served at ClientsPath.
type ClientEvidence struct {
	// Now is serve's clock when the document was written (RFC 3339, nanoseconds): readers move
	// the times below onto their own clock by the offset from it.
	Now time.Time `json:"now"`
	// Clients holds one record per client address, sorted by address.
	Clients []ClientRecord `json:"clients"`
}

// ClientRecord is what serve saw from one client address.
type ClientRecord struct {
	// Address is the client IP address as serve saw it (no port).
	Address string `json:"address"`
	// LastSeen is the time of the latest registry request from Address (RFC 3339).
	LastSeen time.Time `json:"last_seen"`
	// UserAgents maps a user-agent family (containerd, cri-o, nodecache-warm, skopeo,
	// go-containerregistry, other, ...) to what was seen of it.
	UserAgents map[string]*AgentRecord `json:"user_agents"`
}

// AgentRecord counts registry requests of one user-agent family from one address.
type AgentRecord struct {
	// Count and LastSeen cover every registry request (pings and errors included).
	Count    int64     `json:"count"`
	LastSeen time.Time `json:"last_seen"`
	// ContentCount and LastContent cover only successful content: a GET or HEAD of a manifest
	// or blob answered 200 or 206, what a pull through the mirror cannot do without. Status and
	// the agent count only these as traffic evidence.
	ContentCount int64     `json:"content_count"`
	LastContent  time.Time `json:"last_content,omitzero"`
}

// CanaryRepository is a repository serve answers itself, under every configured upstream and
// for any tag, with a one-layer image for common platforms; nothing is fetched upstream for it.
// `nodecache status --canary` pulls a fresh tag of <upstream>/CanaryRepository through the
// node's runtime: if serve sees that pull, the runtime's mirror configuration is active.
const CanaryRepository = "nodecache-canary/probe"

// Manifest media types nodecache asks for and stores: OCI image-spec v1.1 index and manifest,
// Docker image manifest v2 schema 2 list and manifest. Schema 1 is never asked for.
const (
	MediaTypeOCIIndex       = "application/vnd.oci.image.index.v1+json"
	MediaTypeDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	MediaTypeOCIManifest    = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
)

// ManifestMediaTypes returns the manifest media types of ManifestAccept, indexes first.
func ManifestMediaTypes() []string {
	return []string{MediaTypeOCIIndex, MediaTypeDockerList, MediaTypeOCIManifest, MediaTypeDockerManifest}
}

// ManifestAccept is the Accept header value of every manifest request serve sends upstream and
// warm sends to a mirror: ManifestMediaTypes joined by ", ".
const ManifestAccept = MediaTypeOCIIndex + ", " + MediaTypeDockerList + ", " + MediaTypeOCIManifest + ", " + MediaTypeDockerManifest

// ManagedMarker is the first line of every file nodecache writes and owns (hosts.toml, CRI-O
// drop-ins). gen replaces or removes only files that start with it; status reports whether the
// file that decided carries it.
const ManagedMarker = "# managed by nodecache"

// Managed reports whether data is a file nodecache owns: its first line is exactly
// ManagedMarker ("\n"-terminated, or the whole content).
func Managed(data []byte) bool {
	return bytes.HasPrefix(data, []byte(ManagedMarker+"\n")) || bytes.Equal(data, []byte(ManagedMarker))
}
