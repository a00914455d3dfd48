package mirror

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the mirror's Prometheus collectors. Labels never carry client addresses.
type metrics struct {
	requests    *prometheus.CounterVec // upstream, kind, method, code, cache
	servedBytes *prometheus.CounterVec // upstream, source (cache|upstream)
	refused     *prometheus.CounterVec // reason (RefusedPullAllow, RefusedAllow)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_requests_total",
			Help: "Registry API requests answered, by upstream, kind (manifest, blob, tags, base), method, HTTP status code and cache result.",
		}, []string{"upstream", "kind", "method", "code", "cache"}),
		servedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_served_bytes_total",
			Help: "Response body bytes sent to clients, by upstream and source: cache (local storage) or upstream (streamed from a fill in flight).",
		}, []string{"upstream", "source"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_refused_total",
			Help: "Requests refused with 403 because of the client's address, by reason: pull_allow (a registry request from outside --pull-allow), allow (client evidence asked from outside loopback and --allow).",
		}, []string{"reason"}),
	}
	for _, r := range []string{RefusedPullAllow, RefusedAllow} {
		m.refused.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.requests, m.servedBytes, m.refused} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
