package activation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Traffic evidence: the mirror records, per client address and user-agent family, when it last
// answered successful content — a GET or HEAD of a manifest or blob with 200 or 206
// (GET /nodecache/v1/clients, answered to loopback and --allow networks). Pings, errors and
// other paths are not counted: a runtime that only asks /v2/ or is refused pulls nothing through
// the mirror. The runtime's family (containerd, cri-o) seen from one of this node's addresses
// since the daemon started is positive proof that the running daemon pulls through the mirror.
//
// The mirror's times are on the mirror's clock. They are moved onto this node's clock by the
// offset read in the same exchange — the document's "now" (nanoseconds), else the response's
// Date header (whole seconds) — taking the bound that counts a pull as late as it can have been
// seen, so a pull from before the daemon started is never counted.

// runtimeFamily is the user-agent family each runtime pulls with.
func runtimeFamily(runtime string) string {
	if runtime == RuntimeCRIO {
		return mirrorapi.FamilyCRIO
	}
	return mirrorapi.FamilyContainerd
}

// ErrMirrorUnreachable marks a mirror that did not answer at all (no HTTP response).
var ErrMirrorUnreachable = errors.New("mirror unreachable")

// ClientEvidence is the mirror's client evidence with what is needed to read its times on this
// node's clock.
type ClientEvidence struct {
	*mirrorapi.ClientEvidence
	// Skew bounds this node's clock minus the mirror's: a mirror time t happened, on this
	// node's clock, within [t+Skew.Min, t+Skew.Max].
	Skew struct{ Min, Max time.Duration }
	// From is the address that answered (with several mirror replicas behind one name, the
	// evidence is that one replica's).
	From string
}

// Local returns the earliest time on this node's clock that the mirror time t can have been.
func (c *ClientEvidence) Local(t time.Time) time.Time { return t.Add(c.Skew.Min) }

// FetchClientEvidence reads the mirror's client evidence. An error wrapping ErrMirrorUnreachable
// means no HTTP answer came at all.
func FetchClientEvidence(ctx context.Context, client *http.Client, mirrorURL *url.URL) (*ClientEvidence, error) {
	u := *mirrorURL
	u.Path = mirrorapi.ClientsPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("client evidence %s: %w", u.String(), err)
	}
	var from string
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { from = i.Conn.RemoteAddr().String() },
	}))
	sent := time.Now()
	resp, err := client.Do(req)
	received := time.Now()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMirrorUnreachable, u.Redacted(), err)
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
	ev := &ClientEvidence{ClientEvidence: &doc, From: from}
	// The mirror wrote its clock (now, or Date truncated to the second: true time in
	// [date, date+1s)) at a local time between sent and received.
	switch date, derr := http.ParseTime(resp.Header.Get("Date")); {
	case !doc.Now.IsZero():
		ev.Skew.Min, ev.Skew.Max = sent.Sub(doc.Now), received.Sub(doc.Now)
	case derr == nil:
		ev.Skew.Min, ev.Skew.Max = sent.Sub(date.Add(time.Second)), received.Sub(date)
	default:
		return nil, fmt.Errorf("client evidence %s: neither \"now\" nor a Date header: the mirror's clock is unknown", u.String())
	}
	return ev, nil
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

// sighting is one runtime family's successful content seen from a node address.
type sighting struct {
	Address string
	Count   int64
	// Last is the last successful content on the mirror's clock; Local the earliest it can
	// have been on this node's clock.
	Last, Local time.Time
}

// findSighting returns the latest successful content of family from any of addrs, if any.
func findSighting(ev *ClientEvidence, addrs []netip.Addr, family string) (sighting, bool) {
	var best sighting
	found := false
	for _, c := range ev.Clients {
		a, err := netip.ParseAddr(c.Address)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if !slices.Contains(addrs, a) && !a.IsLoopback() {
			continue
		}
		rec := c.UserAgents[family]
		if rec == nil || rec.ContentCount == 0 || rec.LastContent.IsZero() {
			continue
		}
		if !found || rec.LastContent.After(best.Last) {
			best = sighting{Address: c.Address, Count: rec.ContentCount, Last: rec.LastContent, Local: ev.Local(rec.LastContent)}
			found = true
		}
	}
	return best, found
}

// traffic reads the mirror once for every runtime: an unreachable mirror makes every examined
// runtime NOT ACTIVE (its pulls cannot go through it); successful content of a runtime's family
// since its daemon started upgrades a verdict that only the start-time rule held back.
func (e *evaluator) traffic(ctx context.Context, rts []RuntimeReport) {
	if e.opts.Mirror == nil {
		for i := range rts {
			if rts[i].State == Active {
				rts[i].Reason += " (mirror reachability not checked: pass --mirror to check it and what it served)"
			}
		}
		return
	}
	var (
		ev  *ClientEvidence
		err error
	)
	for i := range rts {
		rep := &rts[i]
		if rep.State == NotApplicable {
			continue
		}
		if ev == nil && err == nil {
			ev, err = FetchClientEvidence(ctx, e.opts.HTTPClient, e.opts.Mirror)
		}
		switch {
		case errors.Is(err, ErrMirrorUnreachable):
			e.add(rep.Runtime, "mirror", Fail, "%v", err)
			rep.State = NotActive
			rep.Reason = fmt.Sprintf("the mirror %s does not answer, so no pull goes through it (%v)", e.opts.Mirror.Redacted(), err)
			rep.Remedy = "start the mirror, or check --mirror and the network between this node and it"
			continue
		case err != nil:
			e.add(rep.Runtime, "traffic", Unread, "%v", err)
			continue
		}
		e.judgeTraffic(rep, ev)
	}
}

func (e *evaluator) judgeTraffic(rep *RuntimeReport, ev *ClientEvidence) {
	fam := runtimeFamily(rep.Runtime)
	addrs, err := e.addrs()
	if err != nil {
		e.add(rep.Runtime, "traffic", Unread, "%v", err)
		return
	}
	replica := ""
	if ev.From != "" {
		replica = " (read from the mirror replica at " + ev.From + ": with several replicas, pulls served by another are not seen)"
	}
	s, ok := findSighting(ev, addrs, fam)
	var since time.Time
	if rep.ProcessStart != nil {
		since = *rep.ProcessStart
	}
	switch {
	case !ok:
		e.add(rep.Runtime, "traffic", Info, "the mirror has served no %s manifest or blob to this node's addresses (no pull yet is not proof of a bypass)%s", fam, replica)
		return
	case !since.IsZero() && s.Local.Before(since):
		e.add(rep.Runtime, "traffic", Info, "the mirror last served %s content to %s at %s (mirror clock; here not before %s), not after this daemon started (%s)%s",
			fam, s.Address, fmtPrecise(s.Last), fmtPrecise(s.Local), fmtPrecise(since), replica)
		return
	}
	e.add(rep.Runtime, "traffic", Pass, "the mirror served %d %s manifest/blob requests to %s, the last at %s (mirror clock; here not before %s)%s%s",
		s.Count, fam, s.Address, fmtPrecise(s.Last), fmtPrecise(s.Local), sinceText(since), replica)
	if rep.State == NotActive && rep.startTimeOnly {
		e.warn("%s: configuration evidence said %s (%s), but the mirror served this node's %s since it started", rep.Runtime, rep.State.Text(), rep.Reason, fam)
		rep.State = Active
		rep.Reason = fmt.Sprintf("the mirror served %s manifests or blobs to this node (%s) since the daemon started", fam, s.Address)
		rep.Remedy = ""
	}
}

func sinceText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return ", after the daemon started (" + fmtPrecise(t) + ")"
}

func (e *evaluator) addrs() ([]netip.Addr, error) {
	if e.opts.NodeAddrs != nil {
		return e.opts.NodeAddrs()
	}
	return nodeAddrs()
}
