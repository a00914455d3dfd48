package activation

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Traffic evidence: the mirror records, per client address, the last time each user-agent
// family pulled (GET /nodecache/v1/clients, answered to loopback and --allow networks). A
// runtime family (containerd, cri-o) seen from one of this node's addresses since the daemon
// started is positive proof that the running daemon pulls through the mirror.

// runtimeFamily is the user-agent family each runtime pulls with.
func runtimeFamily(runtime string) string {
	if runtime == RuntimeCRIO {
		return mirrorapi.FamilyCRIO
	}
	return mirrorapi.FamilyContainerd
}

// FetchClientEvidence reads the mirror's client evidence.
func FetchClientEvidence(ctx context.Context, client *http.Client, mirrorURL *url.URL) (*mirrorapi.ClientEvidence, error) {
	u := *mirrorURL
	u.Path = mirrorapi.ClientsPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("client evidence %s: %w", u.String(), err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client evidence: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("client evidence %s: HTTP %d: %s", u.String(), resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	var doc mirrorapi.ClientEvidence
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("client evidence %s: not the expected JSON: %w", u.String(), err)
	}
	return &doc, nil
}

// nodeAddrs returns this node's addresses (every interface, loopback included). With
// hostNetwork, those are the addresses the runtime's requests come from.
func nodeAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list node addresses: %w", err)
	}
	out := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	for _, a := range ifas {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// sighting is one runtime family seen from a node address.
type sighting struct {
	Address  string
	Count    int64
	LastSeen time.Time
}

// findSighting returns the latest sighting of family from any of addrs, if any.
func findSighting(doc *mirrorapi.ClientEvidence, addrs []netip.Addr, family string) (sighting, bool) {
	var best sighting
	found := false
	for _, c := range doc.Clients {
		a, err := netip.ParseAddr(c.Address)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if !slices.Contains(addrs, a) && !a.IsLoopback() {
			continue
		}
		rec := c.UserAgents[family]
		if rec == nil || rec.Count == 0 {
			continue
		}
		if !found || rec.LastSeen.After(best.LastSeen) {
			best = sighting{Address: c.Address, Count: rec.Count, LastSeen: rec.LastSeen}
			found = true
		}
	}
	return best, found
}

// traffic adds the client-evidence row for one runtime and upgrades a verdict that the
// configuration evidence could not decide.
func (e *evaluator) traffic(ctx context.Context, rep *RuntimeReport) {
	if e.opts.Mirror == nil || rep.State == NotApplicable {
		return
	}
	fam := runtimeFamily(rep.Runtime)
	doc, err := FetchClientEvidence(ctx, e.opts.HTTPClient, e.opts.Mirror)
	if err != nil {
		e.add(rep.Runtime, "traffic", Unread, "%v", err)
		return
	}
	addrs, err := e.addrs()
	if err != nil {
		e.add(rep.Runtime, "traffic", Unread, "%v", err)
		return
	}
	s, ok := findSighting(doc, addrs, fam)
	var since time.Time
	if rep.ProcessStart != nil {
		since = *rep.ProcessStart
	}
	switch {
	case !ok:
		e.add(rep.Runtime, "traffic", Info, "the mirror has seen no %s pull from this node's addresses (no pull yet is not proof of a bypass)", fam)
		return
	case !since.IsZero() && s.LastSeen.Before(since.Truncate(time.Second)):
		e.add(rep.Runtime, "traffic", Info, "the mirror last saw %s from %s at %s, before this daemon started (%s)", fam, s.Address, fmtTime(s.LastSeen), fmtTime(since))
		return
	}
	e.add(rep.Runtime, "traffic", Pass, "the mirror saw %d %s requests from %s, last at %s%s", s.Count, fam, s.Address, fmtTime(s.LastSeen), sinceText(since))
	if rep.State == Unknown || (rep.State == NotActive && rep.startTimeOnly) {
		e.warn("%s: configuration evidence said %s (%s), but the mirror saw this node's %s pull through it since it started", rep.Runtime, rep.State.Text(), rep.Reason, fam)
		rep.State = Active
		rep.Reason = fmt.Sprintf("the mirror saw %s pulls from this node (%s) since the daemon started", fam, s.Address)
		rep.Remedy = ""
	}
}

func sinceText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return ", after the daemon started (" + fmtTime(t) + ")"
}

func (e *evaluator) addrs() ([]netip.Addr, error) {
	if e.opts.NodeAddrs != nil {
		return e.opts.NodeAddrs()
	}
	return nodeAddrs()
}
