package mirrorapi

import "time"

// UpstreamsPath is where serve answers the health of its upstreams (GET, JSON Upstreams; issue
// 25; same access rule as ClientsPath: loopback and the --allow networks, 403 otherwise): per
// upstream and tier, the failures by reason, the last failure with its cause, the last success,
// and the rate limit the upstream announced.
const UpstreamsPath = "/nodecache/v1/upstreams"

// Upstreams is the JSON document served at UpstreamsPath.
type Upstreams struct {
	// Now is serve's clock when the document was written (RFC 3339, nanoseconds).
	Now time.Time `json:"now"`
	// Upstreams holds every configured upstream that is not offline, sorted by name.
	Upstreams []UpstreamHealth `json:"upstreams"`
}

// UpstreamHealth is what serve saw of one upstream since it started.
type UpstreamHealth struct {
	// Name is the upstream registry as clients name it (docker.io, ghcr.io, ...).
	Name string `json:"name"`
	// RateLimit is what the upstream's latest manifest answer said of its pull rate limit
	// (Docker Hub's ratelimit-remaining header); nil when that answer carried none (unlimited
	// accounts, registries without a limit) or no manifest was asked yet.
	RateLimit *RateLimit `json:"ratelimit,omitempty"`
	// Tiers holds one entry per tier that answered or failed at least once, in the order
	// upstream, shared, peer.
	Tiers []TierHealth `json:"tiers"`
}

// TierHealth is one tier of one upstream: the registry itself ("upstream"), a shared nodecache
// ("shared": --chain, or an upstream URL that is a nodecache), or the members of --peers
// ("peer").
type TierHealth struct {
	Tier string `json:"tier"`
	// Failures counts the failures by reason (the reason label of
	// nodecache_upstream_failures_total); reasons that never happened are left out.
	Failures map[string]int64 `json:"failures"`
	// LastFailure is the latest failure; nil when there was none.
	LastFailure *UpstreamFailure `json:"last_failure,omitempty"`
	// LastSuccess is the end of the latest exchange that ended well (RFC 3339); absent when
	// there was none.
	LastSuccess time.Time `json:"last_success,omitzero"`
	// Failing is true when the latest exchange of the tier failed: its last failure came after
	// its last success (or there was no success). `nodecache status --mirror` warns of it.
	Failing bool `json:"failing"`
}

// UpstreamFailure is one failure of an upstream exchange.
type UpstreamFailure struct {
	Time time.Time `json:"time"`
	// Reason is one of the reasons of nodecache_upstream_failures_total (dns, connect, tls,
	// timeout, http_401, http_403, http_429, http_5xx, redirect_host, too_large, not_manifest,
	// digest_mismatch, short_body, bad_range, refused_target, other).
	Reason string `json:"reason"`
	// Cause is the error as nodecache saw it (an x509 verification error's text included), at
	// most 1 KiB.
	Cause string `json:"cause"`
}

// RateLimit is a pull rate limit an upstream announced: Remaining pulls in a window of
// WindowSeconds seconds (Docker Hub: "ratelimit-remaining: 76;w=21600"), as of At.
type RateLimit struct {
	Remaining     int64     `json:"remaining"`
	WindowSeconds int64     `json:"window_seconds"`
	At            time.Time `json:"at"`
}
