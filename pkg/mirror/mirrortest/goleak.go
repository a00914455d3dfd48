package mirrortest

import "go.uber.org/goleak"

// DistributionGoroutines are the goleak options that ignore the goroutines distribution's
// registry starts and offers no way to stop, for the TestMain of every package whose tests run
// one as their upstream (NewRegistry): handlers.NewApp's notification broadcaster
// (registry/handlers/app.go, configureEvents; the App's Shutdown does not close it), and the
// pull-through proxy's TTL expiration scheduler (registry/proxy/scheduler), which the stock
// distribution proxy that warm's tests compare against starts. A Mirror builds no App (only
// distribution's storage) and starts neither. Nothing of nodecache's is ignored.
func DistributionGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/docker/go-events.(*Broadcaster).run"),
		goleak.IgnoreAnyFunction("github.com/distribution/distribution/v3/registry/proxy/scheduler.(*TTLExpirationScheduler).Start.func1"),
	}
}
