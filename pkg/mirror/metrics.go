package mirror

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
)

// metrics are the mirror's Prometheus collectors. Labels never carry client addresses.
type metrics struct {
	requests    *prometheus.CounterVec // upstream, kind, method, code, cache
	servedBytes *prometheus.CounterVec // upstream, source (cache|upstream|shared)
	refused     *prometheus.CounterVec // reason (RefusedPullAllow, RefusedAllow, RefusedLoop)
	// evictedBytes and evictions count what eviction removed (reason: EvictCap, ...).
	evictedBytes prometheus.Counter
	evictions    *prometheus.CounterVec
	// corrupt counts stored blobs found damaged (found_by: cache.FoundByServe, ...).
	corrupt *prometheus.CounterVec
	// firstByte is the time from a manifest or blob request to its response headers, which go
	// out with (or, for a fill, at most a few seconds before) the first body byte.
	firstByte *prometheus.HistogramVec // upstream, kind, cache
	// connections and connBudget are the client connections Serve's listeners hold and their
	// budget (conns.go); 0 until Serve runs.
	connections, connBudget prometheus.Gauge
}

// cacheTotals is what the cache gauges read: a *cache.Store.
type cacheTotals interface {
	Totals() (size int64, blobs int)
	PinnedBytes() int64
}

func newMetrics(reg prometheus.Registerer, idx cacheTotals, maxSize int64) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_requests_total",
			Help: "Registry API requests answered, by upstream, kind (manifest, blob, tags, base), method, HTTP status code and cache result.",
		}, []string{"upstream", "kind", "method", "code", "cache"}),
		servedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_served_bytes_total",
			Help: "Response body bytes sent to clients, by upstream and source: cache (local storage), upstream (streamed from a fill in flight from the registry) shared (from a fill in flight from a chained nodecache) or peer (from a fill in flight from a member of --peers).",
		}, []string{"upstream", "source"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodecache_refused_total",
			Help: "Requests refused, by reason: pull_allow (403, a registry request from outside --pull-allow), allow (403, client evidence asked from outside loopback and --allow), loop (508, a request that went round a loop of chained nodecaches), peer_key (401, a request to the peer port without a valid proof of the cluster key), connections (503, a connection past the connection budget), client_max_conns (503, a connection from an address holding --client-max-conns while the budget is under pressure), pull_allow_conns (503, a connection from an address outside --pull-allow holding 4 already).",
		}, []string{"reason"}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodecache_connections",
			Help: "Client connections open on every listener (registry, metrics, peer), counted against the connection budget.",
		}),
		connBudget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodecache_connections_budget",
			Help: "The connection budget: connections the listeners hold at once, from the descriptor limit (RLIMIT_NOFILE): (limit - 128) / 2.",
		}),
	}
	m.evictedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodecache_evicted_bytes_total",
		Help: "Bytes of blob and manifest data eviction removed from the cache.",
	})
	m.evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodecache_evictions_total",
		Help: "Evictions by reason: cap (an image, the cache was over --max-size), enospc (an image, a fill found the disk full), unreferenced (a blob no manifest references), api (an image, DELETE /nodecache/v1/cache/...).",
	}, []string{"reason"})
	m.corrupt = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodecache_cache_corrupt_total",
		Help: "Stored blobs (manifests included) whose data did not match their digest or verified size, each evicted (the next request fetches it again), by where it was found: serve (a serve's size check, or the hash of its first serve since the start), scrub (the background scrubber), verify (a verify pass, nodecache cache verify).",
	}, []string{"found_by"})
	m.firstByte = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "nodecache_first_byte_seconds",
		Help:    "Seconds from a manifest or blob request to its response headers (sent with the first body byte), successful answers only, by upstream, kind and cache result.",
		Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"upstream", "kind", "cache"})
	sizeGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nodecache_cache_size_bytes",
		Help: "Bytes of blob and manifest data in the cache (uploads in progress excluded).",
	}, func() float64 { s, _ := idx.Totals(); return float64(s) })
	blobsGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nodecache_cache_blobs",
		Help: "Blob data files in the cache (manifests included).",
	}, func() float64 { _, n := idx.Totals(); return float64(n) })
	pinnedGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nodecache_cache_pinned_bytes",
		Help: "Bytes of blob and manifest data in the cache that pins hold (nodecache cache pin, warm --pin): never evicted; at most 80% of --max-size.",
	}, func() float64 { return float64(idx.PinnedBytes()) })
	maxGauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nodecache_cache_max_size_bytes",
		Help: "The cache's size cap in bytes (--max-size); 0 when there is none.",
	})
	maxGauge.Set(float64(maxSize))
	for _, r := range []string{RefusedPullAllow, RefusedAllow, RefusedLoop, RefusedConnections, RefusedClientConns, RefusedPullAllowConns} {
		m.refused.WithLabelValues(r)
	}
	for _, r := range []string{EvictCap, EvictENOSPC, EvictUnreferenced, EvictAPI} {
		m.evictions.WithLabelValues(r)
	}
	for _, f := range []string{cache.FoundByServe, cache.FoundByScrub, cache.FoundByVerify} {
		m.corrupt.WithLabelValues(f)
	}
	for _, c := range []prometheus.Collector{m.requests, m.servedBytes, m.refused, m.evictedBytes, m.evictions, m.corrupt, m.firstByte, sizeGauge, blobsGauge, pinnedGauge, maxGauge, m.connections, m.connBudget} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
