package activation

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// PeerSummary is what the mirror says of its cluster (--peers, mirrorapi.PeersPath): shown by
// `status --mirror` and the agent, never part of the verdict (a cluster without live peers pulls
// as without peers).
type PeerSummary struct {
	// Self is the mirror's instance id; SelfListed whether its member source lists it.
	Self       string `json:"self"`
	SelfListed bool   `json:"self_listed"`
	// Live and Failed count the members other than the mirror that answer, and those listed
	// that do not (or refuse its key).
	Live   int `json:"live"`
	Failed int `json:"failed"`
}

// Text is the summary as status prints it.
func (p *PeerSummary) Text() string {
	s := fmt.Sprintf("peers: %d live, %d failed", p.Live, p.Failed)
	if !p.SelfListed {
		s += "; the member list does not list this mirror itself (expected for a node without --peer-listen; otherwise another Service or port in --peers?)"
	}
	return s
}

// FetchPeers reads the mirror's peer list: nil without error when the mirror has no peers (404).
//
// Errors: no answer, a status other than 200 and 404, a body that is not the document.
func FetchPeers(ctx context.Context, client *http.Client, mirrorURL *url.URL) (*PeerSummary, error) {
	var doc mirrorapi.Peers
	if found, err := fetchMirrorDoc(ctx, client, mirrorURL, mirrorapi.PeersPath, "peers", &doc); !found || err != nil {
		return nil, err
	}
	p := &PeerSummary{Self: doc.Self, SelfListed: doc.SelfListed}
	for _, m := range doc.Members {
		if m.State == mirrorapi.PeerLive {
			p.Live++
		} else {
			p.Failed++
		}
	}
	return p, nil
}

// peers adds the mirror's peer summary to the report (with --mirror); a failure to read it is a
// warning, never a verdict.
func (e *evaluator) peers(ctx context.Context) {
	if e.opts.Mirror == nil {
		return
	}
	p, err := FetchPeers(ctx, e.opts.HTTPClient, e.opts.Mirror)
	if err != nil {
		e.warn("%v", err)
		return
	}
	e.report.Peers = p
}
