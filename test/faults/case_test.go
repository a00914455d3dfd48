package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
)

// caseRun is one case: its upstream (a front over a registry), its serve, and what it has
// checked is cached.
type caseRun struct {
	t    *testing.T
	name string
	seed uint64
	// rng is the round's random source, drawn anew from the case's seed and the round's number
	// at each round: a round's plan replays whatever the rounds before it did.
	rng    *rand.Rand
	tl     *tally
	bin    string
	up     *front
	srv    *serveProc
	root   string
	client *http.Client
	// cached are the objects a recovery step got right: stored, to be served from then on
	// (one whose recovery failed later is dropped: later rounds do not judge it again).
	cached []*object
	// reported are the corrupt stored blobs counted already, so that a blob left corrupt counts
	// once, in the round that found it.
	reported map[string]bool
	pushes   int
}

// round is one round: a kind's fault on, waves of clients, the fault off, recovery, the checks.
type round struct {
	n    int
	spec kindSpec
	// objs are what the round's clients asked for first (its new content, the blobs it
	// damaged): what the recovery step asks again.
	objs    []*object
	faults0 int
	waves   int
	clients int
	c       counts
}

func runCase(t *testing.T, cp casePlan, bin string, tsrv *toxiproxy.ApiServer, tl *tally) {
	c := &caseRun{
		t: t, name: cp.name, seed: cp.seed, rng: rand.New(rand.NewPCG(cp.seed, 0)), tl: tl, bin: bin,
		client:   &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: maxClients}},
		reported: map[string]bool{},
	}
	c.up = newFront(t, tsrv, "faults-"+cp.name, cp.seed)
	defer func() {
		for _, k := range append([]kind{kindClean}, kindsOf()...) {
			tl.add(k, counts{faults: c.up.faults(k)})
		}
	}()
	if cp.diskFull {
		c.bigRound()
		for i := range cp.rounds {
			c.diskFullRound(i + 1)
		}
		return
	}
	c.root = filepath.Join(t.TempDir(), "root")
	c.srv = newServe(t, bin, c.root, c.up.URL, filepath.Join(t.TempDir(), "serve.log"))
	if err := c.srv.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Content stored before the first fault: the at-rest kind damages stored blobs.
	c.run(&round{spec: kindSpec{kind: kindClean}}, func(r *round) {
		var objs []*object
		for range 3 {
			objs = append(objs, c.push(r, 3, 4<<10, 256<<10)...)
		}
		c.wave(r, objs)
	})
	for i, k := range cp.rounds {
		r := &round{n: i + 1, spec: specOf(k)}
		switch k {
		case kindSIGKILL:
			c.run(r, c.sigkill)
		case kindAtRest:
			c.run(r, c.atRest)
		default:
			c.run(r, c.upstreamFault)
		}
	}
}

func kindsOf() []kind {
	out := make([]kind, 0, len(specs))
	for _, s := range specs {
		out = append(out, s.kind)
	}
	return out
}

// run runs round r's faults (inject), then removes them and checks: serve settles, recovers
// every object the round asked for, stores nothing corrupt, and is alive.
func (c *caseRun) run(r *round, inject func(*round)) {
	t := c.t
	c.rng = rand.New(rand.NewPCG(c.seed, uint64(r.n)+1))
	r.faults0 = c.up.faults(r.spec.kind)
	start := time.Now()
	inject(r)
	c.up.clear()
	c.client.CloseIdleConnections()
	c.settle(r)
	c.recovery(r)
	c.settle(r)
	c.checkStored(r, c.root)
	c.checkAlive(r)
	c.tl.add(r.spec.kind, r.c)
	t.Logf("%s round %d %s: %d faults, %d waves of up to %d clients, %d requests (ok %d, cut %d, refused %d, wrong bytes %d, wrong answer %d), failed recoveries %d, corrupt stored %d, in %s",
		c.name, r.n, r.spec.kind, c.up.faults(r.spec.kind)-r.faults0, r.waves, r.clients, r.c.requests, r.c.ok, r.c.cut, r.c.refused,
		r.c.wrongBytes, r.c.wrongAnswer, r.c.failedRecoveries, r.c.corruptStored, time.Since(start).Round(100*time.Millisecond))
}

// settle waits until serve has no fill in flight; one that never ends after the fault was
// removed fails the round's recovery.
func (c *caseRun) settle(r *round) {
	if err := c.srv.waitQuiet(c.t.Context(), 30*time.Second); err != nil && c.srv.alive(c.t.Context()) == "" {
		r.c.failedRecoveries++
		c.tl.problem(r.spec.kind, "failed recovery", "%s round %d: serve did not settle after the fault was removed: %v", c.name, r.n, err)
	}
}

// push pushes a new image of 1 to maxLayers layers of lo to hi bytes (as a new tag of the case's
// repository) and returns its objects, which become the round's.
func (c *caseRun) push(r *round, maxLayers int, lo, hi int64) []*object {
	c.pushes++
	sizes := make([]int64, 1+c.rng.IntN(maxLayers))
	for i := range sizes {
		sizes[i] = sizeBetween(c.rng, lo, hi)
	}
	objs := pushImage(c.t, c.up.reg, c.rng, "faults/"+c.name, fmt.Sprintf("r%dp%d", r.n, c.pushes), sizes)
	c.up.learn(objs)
	r.objs = append(r.objs, objs...)
	return objs
}

// injected is how many faults of r's kind were injected since r began.
func (c *caseRun) injected(r *round) int { return c.up.faults(r.spec.kind) - r.faults0 }

// upstreamFault runs a round whose fault is in the upstream: waves of clients, each wave with
// new content, until the round has injected its target.
func (c *caseRun) upstreamFault(r *round) {
	p := &faultPlan{kind: r.spec.kind, p: 0.3 + 0.5*c.rng.Float64()}
	var toxics []string
	switch r.spec.kind {
	case kindThrottle:
		// toxiproxy's rate is in KB/s (1000 bytes).
		toxics = append(toxics, fmt.Sprintf(`{"name":"bandwidth","type":"bandwidth","stream":"downstream","attributes":{"rate":%d}}`, 256+c.rng.IntN(1792)))
		if c.rng.IntN(2) == 0 {
			toxics = append(toxics, fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, 20+c.rng.IntN(180), c.rng.IntN(50)))
		}
	case kindBlackhole:
		// A stall costs the wave an upstream timeout or more: fewer, denser waves.
		p.p = 0.6 + 0.3*c.rng.Float64()
		if p.toxic = c.rng.IntN(2) == 0; p.toxic {
			toxics = append(toxics, `{"name":"blackhole","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
		}
	case kindBad206:
		p.p = 0.5 + 0.5*c.rng.Float64()
	}
	c.up.set(c.t, p, toxics...)
	for r.waves < maxWaves && c.injected(r) < r.spec.target {
		c.wave(r, c.push(r, 3, 4<<10, 1536<<10))
	}
}

// sigkill runs a round that kills serve (SIGKILL) while a blob fill streams from a slow
// upstream, then starts it again on the same root; an attempt that finds no fill streaming at
// the kill is not counted, and the round tries again with new content.
func (c *caseRun) sigkill(r *round) {
	t := c.t
	c.up.set(t, &faultPlan{kind: kindSIGKILL, chunkDelay: time.Duration(10+c.rng.IntN(20)) * time.Millisecond})
	for r.waves < maxWaves && c.injected(r) < r.spec.target {
		plans := c.planWave(r, c.push(r, 2, 1<<20, 3<<20))
		after := time.Duration(c.rng.IntN(100)) * time.Millisecond
		c.up.bodyBytes.Store(0)
		done := make(chan struct{})
		go func() { defer close(done); c.runWave(r, plans) }()
		deadline := time.Now().Add(15 * time.Second)
		for c.up.bodyBytes.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(after)
		inFlight := c.up.inBody.Load() > 0
		c.srv.kill()
		if inFlight {
			c.up.count(kindSIGKILL)
		}
		<-done
		c.restart(r, "after SIGKILL")
	}
}

// atRest damages four stored files in place: three blobs, one each way (a flipped byte, the
// last 100 bytes cut off, emptied), and a manifest (distribution stores manifests as blobs too)
// one of those ways; then a wave of clients asks for them. A flip is made while serve is down
// (stopped, or killed: an unclean stop), so its next serve is the first since a start;
// truncations and emptied files while it runs.
func (c *caseRun) atRest(r *round) {
	t := c.t
	var blobs, manifests []*object
	for _, o := range c.cached {
		if _, err := os.Stat(dataPath(c.root, o.digest)); o.size() > 100 && err == nil {
			if o.manifest {
				manifests = append(manifests, o)
			} else {
				blobs = append(blobs, o)
			}
		}
	}
	if len(blobs) < 3 || len(manifests) < 1 {
		t.Fatalf("round %d: %d stored blobs and %d manifests to damage, want 3 and 1", r.n, len(blobs), len(manifests))
	}
	c.rng.Shuffle(len(blobs), func(i, j int) { blobs[i], blobs[j] = blobs[j], blobs[i] })
	hows := []damage{damageFlip, damageTruncate, damageEmpty}
	type target struct {
		o   *object
		how damage
	}
	targets := []target{{blobs[0], damageFlip}, {blobs[1], damageTruncate}, {blobs[2], damageEmpty},
		{manifests[c.rng.IntN(len(manifests))], hows[c.rng.IntN(len(hows))]}}
	if c.rng.IntN(2) == 0 {
		c.srv.kill()
	} else {
		c.srv.stop()
	}
	for _, down := range []bool{true, false} {
		for _, tg := range targets {
			if (tg.how == damageFlip) != down {
				continue
			}
			if err := damageBlob(dataPath(c.root, tg.o.digest), tg.how, c.rng.Int64N(tg.o.size())); err != nil {
				t.Fatal(err)
			}
			c.up.count(kindAtRest)
			r.objs = append(r.objs, tg.o)
		}
		if down {
			c.restart(r, "after the flips")
		}
	}
	c.wave(r, r.objs)
}

// wave sends 1 to maxClients concurrent clients: each asks in full for one of fresh (every
// object of fresh is asked for) and makes up to three more requests of any kind, mostly for
// fresh, some for what is cached.
func (c *caseRun) wave(r *round, fresh []*object) { c.runWave(r, c.planWave(r, fresh)) }

// planWave draws a wave's requests, one list per client.
func (c *caseRun) planWave(r *round, fresh []*object) [][]request {
	n := 1 + c.rng.IntN(maxClients)
	r.waves++
	r.clients = max(r.clients, n)
	plans := make([][]request, n)
	for i, o := range fresh {
		plans[i%n] = append(plans[i%n], request{obj: o, from: -1, to: -1, cached: slices.Contains(c.cached, o)})
	}
	for i := range plans {
		for range c.rng.IntN(4) {
			plans[i] = append(plans[i], c.randomRequest(fresh))
		}
		c.rng.Shuffle(len(plans[i]), func(a, b int) { plans[i][a], plans[i][b] = plans[i][b], plans[i][a] })
	}
	return plans
}

// randomRequest is a request for one of fresh (four in five) or of what is cached: a manifest
// by tag (GET or HEAD) or digest; a blob whole, from an offset to its end (containerd's
// resume), a bounded range (containerd 2's parallel chunks), or a HEAD.
func (c *caseRun) randomRequest(fresh []*object) request {
	o := fresh[c.rng.IntN(len(fresh))]
	if len(c.cached) > 0 && c.rng.IntN(5) == 0 {
		o = c.cached[c.rng.IntN(len(c.cached))]
	}
	r := request{obj: o, from: -1, to: -1, cached: slices.Contains(c.cached, o)}
	switch x := c.rng.IntN(10); {
	case o.manifest && x < 5:
	case o.manifest && x < 8:
		r.head = true
	case o.manifest:
		r.byDigest = true
	case x < 4:
	case x < 6:
		r.from = c.rng.Int64N(o.size())
	case x < 8:
		r.from = c.rng.Int64N(o.size())
		r.to = r.from + c.rng.Int64N(min(o.size()-r.from, 1<<20))
	default:
		r.head = true
	}
	return r
}

// runWave runs the clients of plans at once and judges every response.
func (c *caseRun) runWave(r *round, plans [][]request) {
	spec := r.spec
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := make(chan struct{})
	for _, plan := range plans {
		wg.Go(func() {
			<-start
			for _, q := range plan {
				ctx, cancel := context.WithTimeout(c.t.Context(), requestWithin)
				res := do(ctx, c.client, c.srv.url(), q, func(status int, h http.Header) bool {
					return !q.cached && spec.refused(status) && (status != http.StatusTooManyRequests || h.Get("Retry-After") != "")
				})
				cancel()
				mu.Lock()
				r.c.judged(res)
				mu.Unlock()
				switch res.out {
				case outWrongBytes:
					c.tl.problem(spec.kind, "wrong bytes", "%s round %d: %s: %s", c.name, r.n, q, res.detail)
				case outWrongAnswer:
					c.tl.problem(spec.kind, "wrong answer", "%s round %d: %s: %s", c.name, r.n, q, res.detail)
				}
			}
		})
	}
	close(start)
	wg.Wait()
}

// recovery asks once more, with the fault removed, for every object of the round, in full, at
// most eight at a time: each must come back right within recoveryWithin. What was right is
// cached from then on.
func (c *caseRun) recovery(r *round) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	sem := make(chan struct{}, 8)
	right := map[*object]bool{}
	for _, o := range r.objs {
		if o.bigNoRecovery {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(c.t.Context(), recoveryWithin)
			defer cancel()
			q := request{obj: o, from: -1, to: -1}
			res := do(ctx, c.client, c.srv.url(), q, func(int, http.Header) bool { return false })
			mu.Lock()
			defer mu.Unlock()
			r.c.requests++
			if res.out != outOK {
				c.cached = slices.DeleteFunc(c.cached, func(x *object) bool { return x == o })
				r.c.failedRecoveries++
				c.tl.problem(r.spec.kind, "failed recovery", "%s round %d: %s: %s (after %s)", c.name, r.n, q, res.detail, res.took.Round(time.Millisecond))
				return
			}
			r.c.ok++
			right[o] = true
		})
	}
	wg.Wait()
	for _, o := range r.objs { // in the round's order: the next rounds draw from the list
		if right[o] && !slices.Contains(c.cached, o) {
			c.cached = append(c.cached, o)
		}
	}
}

// checkStored re-hashes every blob stored under root. A blob found corrupt is dropped from
// what the case takes as cached (later rounds would judge the same defect again, under their
// kind).
func (c *caseRun) checkStored(r *round, root string) {
	bad, _, err := rehash(root)
	if err != nil {
		c.t.Errorf("%s round %d: re-hash the stored blobs: %v", c.name, r.n, err)
	}
	for _, b := range bad {
		c.cached = slices.DeleteFunc(c.cached, func(o *object) bool { return o.digest.String() == b.digest })
		if c.reported[b.what] {
			continue
		}
		c.reported[b.what] = true
		r.c.corruptStored++
		c.tl.problem(r.spec.kind, "corrupt stored", "%s round %d: %s", c.name, r.n, b.what)
	}
}

// checkAlive counts a crash when serve is not alive, and starts it again so the case goes on.
func (c *caseRun) checkAlive(r *round) {
	why := c.srv.alive(c.t.Context())
	if why == "" {
		return
	}
	r.c.crashes++
	c.tl.problem(r.spec.kind, "crash", "%s round %d: %s", c.name, r.n, why)
	c.srv.kill()
	c.restart(r, "after a crash")
}

// restart starts serve (stopped or killed) again on its root. When it does not start, that is a
// crash of round r's kind, and the case ends.
func (c *caseRun) restart(r *round, when string) {
	c.client.CloseIdleConnections()
	if err := c.srv.start(c.t.Context()); err != nil {
		c.tl.add(r.spec.kind, counts{crashes: 1})
		c.tl.problem(r.spec.kind, "crash", "%s round %d: serve does not start again %s: %v", c.name, r.n, when, err)
		c.t.Fatalf("%s round %d: serve does not start again %s: %v", c.name, r.n, when, err)
	}
}
