package peer_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirror/peer"
)

func TestHealthBreaker(t *testing.T) {
	t.Parallel()
	c := mirrortest.NewClock(time.Unix(1_800_000_000, 0))
	h := peer.NewHealth(c.Now)
	usable := func(id string, want bool) {
		t.Helper()
		if got := h.Usable(id); got != want {
			t.Fatalf("at +%v: Usable(%s) = %v; want %v", c.Now().Sub(time.Unix(1_800_000_000, 0)), id, got, want)
		}
	}

	// Two failures and a success: still usable, the count starts again.
	for _, failed := range []bool{true, true, false, true, true} {
		usable("a", true)
		h.Done("a", failed)
	}
	usable("a", true)
	h.Done("a", true) // the third in a row
	usable("a", false)
	usable("b", true) // another member is not affected

	c.Advance(peer.HealthOpen - time.Second)
	usable("a", false)
	c.Advance(time.Second)
	usable("a", true)  // the probe
	usable("a", false) // no second request while the probe is out
	h.Done("a", true)  // the probe failed: open again for HealthOpen
	usable("a", false)
	c.Advance(peer.HealthOpen - time.Second)
	usable("a", false)
	c.Advance(time.Second)
	usable("a", true)
	h.Done("a", false) // the probe worked: closed
	usable("a", true)
	usable("a", true)
	h.Done("a", true)
	usable("a", true) // one failure after closing does not open it
}

func TestHealthDistrust(t *testing.T) {
	t.Parallel()
	c := mirrortest.NewClock(time.Unix(1_800_000_000, 0))
	h := peer.NewHealth(c.Now)
	h.Distrust("a")
	if h.Usable("a") {
		t.Fatal("a distrusted member is usable")
	}
	h.Done("a", false) // a success does not lift the distrust
	c.Advance(peer.DistrustFor - time.Second)
	if h.Usable("a") {
		t.Fatalf("usable %v after Distrust; want not before %v", peer.DistrustFor-time.Second, peer.DistrustFor)
	}
	if !h.Usable("b") {
		t.Fatal("another member is not usable")
	}
	c.Advance(time.Second)
	if !h.Usable("a") {
		t.Fatalf("not usable %v after Distrust", peer.DistrustFor)
	}
	// A member forgotten after a long silence starts afresh, but not while distrusted.
	for range peer.HealthFailures {
		h.Done("c", true)
	}
	h.Distrust("a")
	c.Advance(time.Hour)
	if !h.Usable("c") {
		t.Error("a member with an open breaker an hour ago is still skipped")
	}
	if !h.Usable("a") {
		t.Error("distrusted an hour ago, still skipped")
	}
}

func TestHealthConcurrent(t *testing.T) {
	t.Parallel()
	h := peer.NewHealth(nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 1000 {
				id := string(rune('a' + (i+j)%4))
				if h.Usable(id) {
					h.Done(id, j%3 == 0)
				}
				if j%500 == 0 {
					h.Distrust(id)
				}
			}
		})
	}
	wg.Wait()
}
