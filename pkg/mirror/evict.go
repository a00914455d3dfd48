package mirror

import "github.com/nodecache/nodecache/pkg/mirror/cache"

// Eviction reasons, the values of nodecache_evictions_total's reason label (cache.EvictCap, ...).
const (
	EvictCap          = cache.EvictCap          // the cache grew over --max-size
	EvictENOSPC       = cache.EvictENOSPC       // a fill found the disk full
	EvictUnreferenced = cache.EvictUnreferenced // blob data no manifest references
	EvictAPI          = cache.EvictAPI          // DELETE /nodecache/v1/cache/...
)
