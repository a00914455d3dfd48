package mirror

import (
	"encoding/json"
	"net/http"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// serveUpstreams answers mirrorapi.UpstreamsPath (GET; loopback and --allow networks, the rule
// of client evidence): per upstream and tier, the failures by reason, the last failure with its
// cause, the last success and the announced rate limit (issue 25).
func (m *Mirror) serveUpstreams(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case !m.clients.allowed(r.RemoteAddr):
		m.metrics.refused.WithLabelValues(RefusedAllow).Inc()
		writeJSONError(w, http.StatusForbidden, "upstream health is served to loopback and --allow networks only")
		return
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		writeJSONError(w, http.StatusMethodNotAllowed, "only GET is served here")
		return
	}
	doc := m.fetch.Health()
	if doc.Upstreams == nil {
		doc.Upstreams = []mirrorapi.UpstreamHealth{}
	}
	_ = json.NewEncoder(w).Encode(doc)
}
