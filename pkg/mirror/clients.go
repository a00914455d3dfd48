package mirror

import (
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// maxClients bounds the addresses remembered; the least recently seen is dropped first.
const maxClients = 4096

// IsContent reports whether a request counts as successful content in
// mirrorapi.AgentRecord: GET or HEAD of a manifest or blob (kind "manifest" or "blob") answered
// 200 or 206.
func IsContent(method, kind string, status int) bool {
	return (method == http.MethodGet || method == http.MethodHead) &&
		(kind == kindManifest || kind == kindBlob) &&
		(status == http.StatusOK || status == http.StatusPartialContent)
}

type clientLog struct {
	allow []netip.Prefix
	mu    sync.Mutex
	m     map[string]*mirrorapi.ClientRecord
}

func newClientLog(allow []netip.Prefix) *clientLog {
	return &clientLog{allow: allow, m: map[string]*mirrorapi.ClientRecord{}}
}

// UserAgentFamily names the client program from its User-Agent: the first product token,
// lower case, when it is a known registry client; "other" otherwise.
func UserAgentFamily(ua string) string {
	tok := strings.ToLower(strings.TrimSpace(ua))
	if i := strings.IndexAny(tok, "/ "); i >= 0 {
		tok = tok[:i]
	}
	switch {
	case tok == mirrorapi.FamilyContainerd, tok == mirrorapi.FamilyCRIO, tok == "skopeo", tok == "go-containerregistry",
		tok == "docker", tok == "podman", tok == "crane", tok == "buildkit":
		return tok
	case strings.HasPrefix(tok, "nodecache"):
		return tok
	}
	return "other"
}

func (c *clientLog) record(remoteAddr, ua string, content bool, now time.Time) {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	fam := UserAgentFamily(ua)
	c.mu.Lock()
	defer c.mu.Unlock()
	rec := c.m[host]
	if rec == nil {
		if len(c.m) >= maxClients {
			c.evictOldest()
		}
		rec = &mirrorapi.ClientRecord{Address: host, UserAgents: map[string]*mirrorapi.AgentRecord{}}
		c.m[host] = rec
	}
	rec.LastSeen = now
	a := rec.UserAgents[fam]
	if a == nil {
		a = &mirrorapi.AgentRecord{}
		rec.UserAgents[fam] = a
	}
	a.Count++
	a.LastSeen = now
	if content {
		a.ContentCount++
		a.LastContent = now
	}
}

func (c *clientLog) evictOldest() {
	var oldest string
	for k, v := range c.m {
		if oldest == "" || v.LastSeen.Before(c.m[oldest].LastSeen) {
			oldest = k
		}
	}
	delete(c.m, oldest)
}

func (c *clientLog) allowed(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	if ip.IsLoopback() {
		return true
	}
	for _, p := range c.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func (c *clientLog) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !c.allowed(r.RemoteAddr) {
		http.Error(w, "client evidence is served to loopback and --allow networks only", http.StatusForbidden)
		return
	}
	c.mu.Lock()
	doc := mirrorapi.ClientEvidence{Now: time.Now(), Clients: make([]mirrorapi.ClientRecord, 0, len(c.m))}
	for _, rec := range c.m {
		cp := mirrorapi.ClientRecord{Address: rec.Address, LastSeen: rec.LastSeen, UserAgents: map[string]*mirrorapi.AgentRecord{}}
		for k, v := range rec.UserAgents {
			a := *v
			cp.UserAgents[k] = &a
		}
		doc.Clients = append(doc.Clients, cp)
	}
	c.mu.Unlock()
	sort.Slice(doc.Clients, func(i, j int) bool { return doc.Clients[i].Address < doc.Clients[j].Address })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(doc)
}
