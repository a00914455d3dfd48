package peer

import (
	"sync"
	"time"
)

// Health tuning: after HealthFailures failures in a row a member is skipped for HealthOpen, then
// one request probes it; a member that served bytes that did not match their digest is skipped
// for DistrustFor. The breaker's numbers are those of the shared tier's (pkg/mirror/upstream,
// BreakerFailures and BreakerOpen).
const (
	HealthFailures = 3
	HealthOpen     = 30 * time.Second
	DistrustFor    = 10 * time.Minute
	// healthForget is how long a member's entry is kept without a Usable, Done or Distrust call
	// about it (a member long gone); afterwards it starts afresh.
	healthForget = 10 * time.Minute
)

// Health tracks members' failures, by instance id: a breaker per member (closed until
// HealthFailures failures in a row, then open for HealthOpen, then half-open: one request
// probes it, and its result closes or opens it again) and a distrust list (DistrustFor). Safe for
// concurrent use.
type Health struct {
	now func() time.Time

	mu        sync.Mutex
	members   map[string]*health
	lastSweep time.Time
}

// health is one member's state.
type health struct {
	failures      int
	openUntil     time.Time
	probing       bool // the half-open breaker let its probe through; no other request until Done
	distrustUntil time.Time
	used          time.Time // the last call about it
}

// NewHealth returns a Health that tells time with now (nil: time.Now).
func NewHealth(now func() time.Time) *Health {
	if now == nil {
		now = time.Now
	}
	return &Health{now: now, members: map[string]*health{}}
}

// get returns id's entry, creating it; h.mu is held. Entries idle for healthForget are swept
// (at most once every healthForget), so members that left do not pile up.
func (h *Health) get(id string, now time.Time) *health {
	if now.Sub(h.lastSweep) >= healthForget {
		h.lastSweep = now
		for k, e := range h.members {
			if now.Sub(e.used) >= healthForget && !now.Before(e.distrustUntil) {
				delete(h.members, k)
			}
		}
	}
	e := h.members[id]
	if e == nil {
		e = &health{}
		h.members[id] = e
	}
	e.used = now
	return e
}

// Usable reports whether a request may go to member id: not distrusted, and its breaker closed,
// or half-open with no probe out (this request is then the probe, and its Done decides).
func (h *Health) Usable(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	e := h.get(id, now)
	switch {
	case now.Before(e.distrustUntil):
		return false
	case e.failures < HealthFailures:
		return true
	case e.probing || now.Before(e.openUntil):
		return false
	}
	e.probing = true
	return true
}

// Done records the result of a request to member id; failed: no answer, a timeout, a 5xx. Once
// the breaker opened, the next Done is taken as the probe's result (a request still in flight
// when it opened may finish first and count as the probe).
func (h *Health) Done(id string, failed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	e := h.get(id, now)
	e.probing = false
	if !failed {
		e.failures = 0
		return
	}
	e.failures++
	if e.failures >= HealthFailures {
		e.openUntil = now.Add(HealthOpen)
	}
}

// Hung opens member id's breaker at once, for HealthOpen: it accepted a request and did not
// answer within the whole header budget. Each such request costs a client the budget, so the
// next one goes elsewhere rather than waiting for two more.
func (h *Health) Hung(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	e := h.get(id, now)
	e.probing = false
	e.failures = max(e.failures+1, HealthFailures)
	e.openUntil = now.Add(HealthOpen)
}

// Distrust skips member id for DistrustFor: it served bytes that did not match their digest.
func (h *Health) Distrust(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	h.get(id, now).distrustUntil = now.Add(DistrustFor)
}
