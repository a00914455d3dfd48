package upstream

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Request kinds in the upstream metrics' kind label.
const (
	KindManifest = "manifest"
	KindBlob     = "blob"
)

// metrics are the upstream side's Prometheus collectors.
type metrics struct {
	upstreamBytes   *prometheus.CounterVec   // upstream, tier
	upstreamSeconds *prometheus.HistogramVec // upstream, tier, kind, result
	fillsInFlight   prometheus.Gauge
	resumes         *prometheus.CounterVec // upstream
	mismatches      *prometheus.CounterVec // upstream, kind, tier
	refusedTargets  *prometheus.CounterVec // upstream, reason
	busy            *prometheus.CounterVec // upstream
	spillBytes      prometheus.Gauge
	failures        *prometheus.CounterVec // upstream, tier, reason (health.go)
	lastSuccess     *prometheus.GaugeVec   // upstream, tier
	rateLimit       *prometheus.GaugeVec   // upstream
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		upstreamBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_upstream_fetched_bytes_total",
			Help: "Bytes read from upstream registries (manifests and blobs); tier: upstream (the registry itself), shared (a chained nodecache) or peer (a member of --peers).",
		}, []string{"upstream", "tier"}),
		upstreamSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodecache_upstream_fetch_duration_seconds",
			Help:    "Duration of upstream fetches in seconds: tag and blob HEADs, manifest GETs, whole blob fills; tier: upstream or shared (a chained nodecache).",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"upstream", "tier", "kind", "result"}),
		fillsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodecache_blob_fills_in_flight",
			Help: "Blob fills from upstreams currently running.",
		}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_upstream_resumes_total",
			Help: "Blob streams from an upstream that broke and were resumed (a new request, with Range from the byte reached).",
		}, []string{"upstream"}),
		mismatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_digest_mismatches_total",
			Help: "Manifests and blobs from an upstream whose bytes did not match their digest (nothing of them was stored), by kind (manifest, blob) and tier (upstream, shared, peer: a member of --peers, then skipped for 10 minutes).",
		}, []string{"upstream", "kind", "tier"}),
		refusedTargets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_upstream_refused_targets_total",
			Help: "Connections an upstream's answer asked for (a redirect, a token realm) that nodecache refused, by reason: loopback, private, link-local, shared-address-space, unspecified, multicast (the address it resolved to) or https-to-http (a downgrading redirect).",
		}, []string{"upstream", "reason"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_upstream_busy_total",
			Help: "Requests that waited --upstream-timeout for one of the upstream's --upstream-concurrency slots (requests waiting for its response headers) without getting one, answered 429.",
		}, []string{"upstream"}),
		spillBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodecache_fill_spill_bytes",
			Help: "Bytes held in memory for blob fills that could not be stored (the disk was full) and for clients' own streams of them; bounded by a fixed budget (64 MiB).",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_upstream_failures_total",
			Help: "Upstream exchanges (tag and blob HEADs, manifest GETs, whole blob fills, tag lists, referrers listings; and each failed attempt at a shared tier or a peer before the next tier) that failed, by tier (upstream, shared, peer) and reason: dns, connect, tls, timeout, http_401, http_403, http_429, http_5xx, redirect_host (a host the upstream redirected to could not be reached), too_large, not_manifest, digest_mismatch, short_body, bad_range, refused_target, other. An upstream's 404 is not a failure.",
		}, []string{"upstream", "tier", "reason"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodecache_upstream_last_success_timestamp_seconds",
			Help: "When an upstream exchange of this upstream and tier last ended well (Unix time in seconds); absent before the first.",
		}, []string{"upstream", "tier"}),
		rateLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodecache_upstream_ratelimit_remaining",
			Help: "Pulls the upstream's latest manifest answer said remain in its rate limit window (Docker Hub's ratelimit-remaining header); absent while its answers carry no such header.",
		}, []string{"upstream"}),
	}
	for _, c := range []prometheus.Collector{m.upstreamBytes, m.upstreamSeconds, m.fillsInFlight, m.resumes, m.mismatches, m.refusedTargets, m.busy, m.spillBytes,
		m.failures, m.lastSuccess, m.rateLimit} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// initUpstream puts upstream's resume, busy and digest mismatch series on /metrics at 0, so a
// dashboard or alert shows "none yet" rather than "no data" before the first one happens.
func (m *metrics) initUpstream(upstream string, peers bool) {
	m.resumes.WithLabelValues(upstream)
	m.busy.WithLabelValues(upstream)
	for _, kind := range []string{KindManifest, KindBlob} {
		m.mismatches.WithLabelValues(upstream, kind, TierUpstream)
		if peers {
			m.mismatches.WithLabelValues(upstream, kind, TierPeer)
		}
	}
}

// done ends one exchange of kind with upstream, answered by tier: its duration
// (nodecache_upstream_fetch_duration_seconds) and its health (health.go).
func (f *Fetcher) done(upstream, tier, kind string, start time.Time, err error) {
	f.metrics.observe(upstream, tier, kind, start, err)
	f.health.record(upstream, tier, err)
}

// observe records one exchange in nodecache_upstream_fetch_duration_seconds, its result "ok",
// "not_found" (the upstream answered 404: an answer to the client's question, not a failure of
// the upstream, issue 25) or "error".
func (m *metrics) observe(upstream, tier, kind string, start time.Time, err error) {
	result := "ok"
	var ue *Error
	switch {
	case errors.As(err, &ue) && ue.NotFound():
		result = "not_found"
	case err != nil:
		result = "error"
	}
	m.upstreamSeconds.WithLabelValues(upstream, tier, kind, result).Observe(time.Since(start).Seconds())
}
