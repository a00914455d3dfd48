package mirror

import (
	"fmt"

	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodecache/nodecache/pkg/name"
)

// Offline upstreams (issue 24; --upstream NAME=offline, --offline for all): an upstream that is
// never asked. Its repositories are served from what the cache holds, a cached tag included
// (without revalidation: the tag as it was stored, answered "hit"); anything else is answered at
// once with 404 and the OCI error code of what was asked (OCI distribution spec, "Error Codes":
// MANIFEST_UNKNOWN, BLOB_UNKNOWN, NAME_UNKNOWN for a tag listing), its message saying the
// upstream is offline. Nothing is asked on its behalf: no fetcher remote is built for it (no
// transport, no connection pool), and neither --chain nor --peers is asked for its content.
// Members may still ask this node for it: they get what the cache holds, or the 404.

// offlineMiss is the answer for what, not in the cache of r's repository, whose upstream is
// offline: 404 with code, at once.
func (r *repository) offlineMiss(code errcode.ErrorCode, what string) *readError {
	return &readError{err: code.WithMessage(fmt.Sprintf(
		"%s is not in the cache, and upstream %s is offline (never asked: --upstream %s=offline or --offline)",
		what, r.up.Name, r.up.Name))}
}

// offlineGauge is nodecache_upstream_offline: 1 for each offline upstream, 0 for the others, so
// that dashboards and alerts tell an upstream that is never asked by design from one that stopped
// answering.
func offlineGauge(reg prometheus.Registerer, ups []name.Upstream) error {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodecache_upstream_offline",
		Help: "1 for an upstream that is offline (--upstream NAME=offline or --offline: served from the cache only, never asked), 0 for one that is asked.",
	}, []string{"upstream"})
	for _, u := range ups {
		v := 0.0
		if u.Offline {
			v = 1
		}
		g.WithLabelValues(u.Name).Set(v)
	}
	return reg.Register(g)
}

// offlineNames are the names of the offline upstreams of ups.
func offlineNames(ups []name.Upstream) []string {
	var out []string
	for _, u := range ups {
		if u.Offline {
			out = append(out, u.Name)
		}
	}
	return out
}
