package mirror

import (
	"net/http"
	"net/url"

	"github.com/nodecache/nodecache/pkg/mirror/upstream"
)

// refuseLoop answers 508 Loop Detected, with an OCI error body, to a request that already
// passed through this instance or through more than upstream.MaxHops nodecaches (its Via
// entries "1.1 nodecache/<id>"), and reports whether it did. Otherwise it returns the hops for
// the requests this one makes to a shared tier.
func (m *Mirror) refuseLoop(w http.ResponseWriter, r *http.Request) ([]string, bool) {
	ids := upstream.ViaIDs(r.Header.Values("Via"))
	if err := upstream.CheckLoop(ids, m.fetch.InstanceID()); err != nil {
		m.metrics.refused.WithLabelValues(RefusedLoop).Inc()
		(&apiError{Status: http.StatusLoopDetected, Code: "UNKNOWN", Message: err.Error()}).write(w)
		return nil, true
	}
	return ids, false
}

func chainString(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.String()
}
