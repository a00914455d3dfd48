package mirror

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Reasons of nodecache_refused_total.
const (
	// RefusedPullAllow: a registry request from an address outside Options.PullAllow.
	RefusedPullAllow = "pull_allow"
	// RefusedAllow: a client-evidence request from an address outside loopback and
	// Options.ClientEvidenceAllow.
	RefusedAllow = "allow"
	// RefusedLoop: a registry request that went round a loop of chained nodecaches (508).
	RefusedLoop = "loop"
)

// pullGate decides who may send registry requests (Options.PullAllow): everyone when no
// network is listed; otherwise 127.0.0.1, ::1 (the node's own runtime) and the listed networks.
type pullGate struct {
	allow []netip.Prefix
}

// open reports that every address may pull (no --pull-allow).
func (g pullGate) open() bool { return len(g.allow) == 0 }

// allowed reports whether the client at remoteAddr ("ip:port" as net/http gives it) may pull.
// An address that does not parse is refused when the gate is closed.
func (g pullGate) allowed(remoteAddr string) bool {
	if g.open() {
		return true
	}
	ip, ok := remoteIP(remoteAddr)
	if !ok {
		return false
	}
	if ip == netip.IPv4Unspecified() || ip == netip.IPv6Unspecified() {
		return false
	}
	if ip == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || ip == netip.IPv6Loopback() {
		return true
	}
	for _, p := range g.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// remoteIP returns the address of remoteAddr without port and zone, IPv4-mapped IPv6 unmapped.
func remoteIP(remoteAddr string) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap().WithZone(""), true
}

// refusePull answers a registry request from outside --pull-allow: 403 DENIED with a message
// that names the client's address and the remedy, and Connection: close, so a refused client
// does not keep a connection (and a descriptor) open.
func refusePull(w http.ResponseWriter, remoteAddr string) {
	ip, _ := remoteIP(remoteAddr)
	w.Header().Set("Connection", "close")
	(&apiError{Status: http.StatusForbidden, Code: "DENIED",
		Message: "this cache serves registry requests to 127.0.0.1, ::1 and its --pull-allow networks only; " +
			ip.String() + " is not among them"}).write(w)
}

// loopbackListener reports whether addr (a listener's "host:port") accepts loopback
// connections only. An unspecified host (":5000", "0.0.0.0:5000", "[::]:5000") is not loopback.
func loopbackListener(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// logAccess writes the one start-up line about who may pull through a listener on addr: nothing
// on a loopback listener or with --pull-allow; otherwise a line saying every client that reaches
// addr may pull, a warning when upstream credentials are configured (whatever they can read is
// then readable by all of those clients).
func (m *Mirror) logAccess(addr string) {
	if !m.pull.open() || loopbackListener(addr) {
		return
	}
	if names := m.credentialed(); len(names) > 0 {
		m.log.Warn().Str("addr", addr).Strs("credentialed_upstreams", names).
			Msg("every client that reaches this address may pull through the cache, and so read whatever the --upstream-auth credentials can read; restrict it with --pull-allow CIDR")
		return
	}
	m.log.Info().Str("addr", addr).
		Msg("every client that reaches this address may pull through the cache (no --pull-allow)")
}

// credentialed returns the names of the upstreams nodecache has credentials for.
func (m *Mirror) credentialed() []string {
	var out []string
	for _, u := range m.opts.Upstreams {
		if m.opts.UpstreamCredentials[u.Name] != nil {
			out = append(out, u.Name)
		}
	}
	return out
}
