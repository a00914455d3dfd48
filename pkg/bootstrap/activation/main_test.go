package activation

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

// TestMain fails the package when a goroutine outlives its tests: whatever a test starts, it
// stops (distribution's own goroutines aside: mirrortest.DistributionGoroutines).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, mirrortest.DistributionGoroutines()...)
}
