package mirror_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// TestMain fails the package when a goroutine outlives its tests: every Mirror, Fetcher and
// test server a test starts is stopped by it (the goroutines of the distribution registries the
// tests run as upstreams aside:
// mirrortest.DistributionGoroutines).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, mirrortest.DistributionGoroutines()...)
}
