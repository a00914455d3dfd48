package faults

import (
	"os"
	"path/filepath"
	"time"
)

// Full-disk shape: serve's root is a tmpfs of diskBytes, all of it filled but diskFree.
const (
	diskBytes = 8 << 20
	diskFree  = 128 << 10
	// bigBlob is the blob of the memory round (issue 23: a 150 MiB layer on a full 8 MiB root).
	bigBlob = 150 << 20
)

// fullDiskServe starts a serve for round r on a fresh tmpfs root and returns the path of the
// filler file that fill writes beside the root.
func (c *caseRun) fullDiskServe(r *round) string {
	t := c.t
	dir := tmpfs(t, diskBytes)
	c.root = filepath.Join(dir, "root")
	c.cached = nil
	c.srv = newServe(t, c.bin, c.root, c.up.URL, filepath.Join(t.TempDir(), "serve.log"))
	if err := c.srv.start(t.Context()); err != nil {
		t.Fatalf("round %d: %v", r.n, err)
	}
	return filepath.Join(dir, "filler")
}

// fillDisk fills serve's file system but for diskFree and sets the full-disk fault with the room
// left.
func (c *caseRun) fillDisk(filler string) int64 {
	free, err := fill(filler, diskFree)
	if err != nil {
		c.t.Fatalf("fill the tmpfs: %v", err)
	}
	c.up.set(c.t, &faultPlan{kind: kindDiskFull, free: free})
	return free
}

// diskFullRound runs waves of new content, every layer larger than the room left, until the
// round's target; then the filler goes (the fault removed) before recovery.
func (c *caseRun) diskFullRound(n int) {
	r := &round{n: n, spec: specOf(kindDiskFull)}
	filler := c.fullDiskServe(r)
	c.run(r, func(r *round) {
		free := c.fillDisk(filler)
		for r.waves < maxWaves && c.injected(r) < r.spec.target {
			c.wave(r, c.push(r, 3, max(free+1, 256<<10), 1<<20))
		}
		if err := os.Remove(filler); err != nil {
			c.t.Fatal(err)
		}
	})
	c.srv.stop()
}

// bigRound has 1 to 3 clients get a 150 MiB blob at once from a serve whose root is full: each
// gets it right or is cut or refused (503), and serve's peak RSS stays under peakRSSBound. The
// front serves the blob itself (distribution's in-memory storage copies a blob as it grows:
// minutes for this one). It is not asked again in the recovery step: the disk still has no room for it, and a 503
// (which sends containerd to the registry) is a right answer for as long as that lasts.
func (c *caseRun) bigRound() {
	r := &round{spec: specOf(kindDiskFull)}
	filler := c.fullDiskServe(r)
	c.run(r, func(r *round) {
		c.fillDisk(filler)
		data := randomBytes(c.rng, bigBlob)
		big := &object{repo: "faults/" + c.name, digest: sha256Of(data), data: data, bigNoRecovery: true}
		c.up.serveBlob(big)
		plans := make([][]request, 1+c.rng.IntN(3))
		for i := range plans {
			plans[i] = []request{{obj: big, from: -1, to: -1}}
		}
		r.waves++
		r.clients = len(plans)
		start := time.Now()
		c.runWave(r, plans)
		rss, err := c.srv.peakRSS()
		switch {
		case err != nil:
			c.t.Errorf("peak RSS of serve: %v", err)
		case rss > peakRSSBound:
			r.c.memoryOver++
			c.tl.problem(kindDiskFull, "memory", "%s: %d clients got a %d MiB blob on a full disk in %s; serve's peak RSS %d MiB, over the %d MiB bound",
				c.name, len(plans), bigBlob>>20, time.Since(start).Round(time.Millisecond), rss>>20, peakRSSBound>>20)
		default:
			c.t.Logf("%d clients got a %d MiB blob on a full disk in %s; serve's peak RSS %d MiB (bound %d MiB)",
				len(plans), bigBlob>>20, time.Since(start).Round(time.Millisecond), rss>>20, peakRSSBound>>20)
		}
		if err := os.Remove(filler); err != nil {
			c.t.Fatal(err)
		}
	})
	c.srv.stop()
}
