package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

type startupRun struct {
	stock, ncCold, ncWarm time.Duration // exec to the first 200 on /v2/
	ncIndex, ncIndexWarm  time.Duration // exec to nodecache_cache_blobs >= 100,000
	indexErr, stockErr    string
	dir                   string        // where the layout was
	layout                time.Duration // writing it
}

type evictRun struct {
	took                  time.Duration
	freeBefore, freeAfter int64
	hwm                   int64
	err                   string
}

type results struct {
	commit       string
	started      time.Time
	elapsed      time.Duration
	machine      string
	loadBefore   string
	loadAfter    string
	cold         map[string][]*coldRun
	warm         map[string]float64 // bytes/s, best round
	throttled    map[string]*throttledRun
	startup      *startupRun
	evict        *evictRun
	restart      []*restartRun
	cluster      *clusterResults
	skips, notes []string
}

func machineInfo() string {
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				var kb int64
				if _, err := fmt.Sscan(strings.TrimSpace(v), &kb); err == nil {
					mem = human(kb << 10)
				}
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d CPUs (nproc), %s memory, Linux %s, %s %s/%s", runtime.NumCPU(), mem, kernel, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func human(n int64) string {
	switch {
	case n >= gib:
		return fmt.Sprintf("%.1f GiB", float64(n)/float64(gib))
	case n >= mib:
		return fmt.Sprintf("%.1f MiB", float64(n)/float64(mib))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func ms(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

// percentile is the nearest-rank q-quantile of ds (0 when empty).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**MISSED**"
}

func (r *results) coldFor(impl string, n int) *coldRun {
	for _, c := range r.cold[impl] {
		if c.clients == n {
			return c
		}
	}
	return nil
}

func (r *results) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("# nodecache benchmark")
	p("")
	p("Written by `make bench` (bench/, its own Go module); not run in CI. One run; read the numbers as indicative:")
	p("the machine is shared with other jobs and was loaded during the run (load average below), which")
	p("inflates times and deflates throughput for all three servers alike.")
	p("")
	p("- Machine: %s", r.machine)
	p("- Commit: %s", r.commit)
	p("- Date: %s, run took %s", r.started.UTC().Format(time.RFC3339), r.elapsed.Round(time.Second))
	p("- Load average (1/5/15 min): %s before, %s after", r.loadBefore, r.loadAfter)
	p("- Upstream: distribution v3.1.2 (library) over filesystem storage in the bench process, reached")
	p("  by each proxy on its own loopback listener that counts the blob body bytes it sends.")
	p("  Stock proxy: distribution's `registry` v3.1.2 binary in proxy mode. nodecache: `bin/nodecache serve`.")
	p("  Each proxy is a separate process, started fresh (empty storage) for each scenario, so its peak RSS")
	p("  (VmHWM) is that scenario's.")
	p("")
	for _, s := range r.skips {
		p("- Skipped: %s", s)
	}
	for _, s := range r.notes {
		p("- Note: %s", s)
	}
	if len(r.skips)+len(r.notes) > 0 {
		p("")
	}

	p("## Targets (nodecache)")
	p("")
	p("| target | measured | |")
	p("|---|---|---|")
	if c := r.coldFor(nc, 200); c != nil {
		up := float64(c.upBytes) / float64(coldSize)
		p("| upstream bytes ≤ 1.02× the blob at 200 clients | %.3f× | %s |", up, verdict(up <= 1.02 && c.failures == 0))
	} else {
		p("| upstream bytes ≤ 1.02× the blob at 200 clients | not measured | **MISSED** |")
	}
	worst := time.Duration(0)
	all := true
	for _, n := range []int{20, 50, 200} {
		c := r.coldFor(nc, n)
		if c == nil || c.failures > 0 {
			all = false
			continue
		}
		worst = max(worst, percentile(c.firstByte, 1))
	}
	p("| first byte < 1 s for every client (20/50/200 cold) | slowest %s%s | %s |", ms(worst), map[bool]string{true: "", false: " (some runs failed or missing)"}[all], verdict(all && worst < time.Second))
	wr := 0.0
	if r.warm["fileserver"] > 0 {
		wr = r.warm[nc] / r.warm["fileserver"]
	}
	p("| warm throughput ≥ 0.9× the plain Go file server | %.2f× | %s |", wr, verdict(wr >= 0.9))
	if c := r.coldFor(nc, 200); c != nil {
		p("| peak RSS < 128 MiB at 200 clients | %s | %s |", human(c.hwm), verdict(c.hwm < 128*mib))
	} else {
		p("| peak RSS < 128 MiB at 200 clients | not measured | **MISSED** |")
	}
	if s := r.startup; s != nil {
		p("| start-up < 2 s with 100,000 blobs | %s (index rebuilt from storage), %s (index file) | %s |", ms(s.ncCold), ms(s.ncWarm), verdict(s.ncCold > 0 && s.ncCold < 2*time.Second && s.ncWarm < 2*time.Second))
	} else {
		p("| start-up < 2 s with 100,000 blobs | not measured | **MISSED** |")
	}
	p("")
	p("The cluster scenario's targets are in its own section, at the end.")
	p("")

	p("## Cold pulls: N clients GET one 64 MiB blob at once, empty cache")
	p("")
	p("Upstream ÷ blob: blob body bytes the upstream sent ÷ 64 MiB. All done: from the common start until the last client")
	p("has the whole blob. First byte: from the common start to a client's first body byte. Client 0 checks the digest, all check the size.")
	p("The clients run in the bench process, which also serves the upstream, so on this machine's shared cores the first-byte")
	p("times include waiting for CPU; p99 is the nearest rank (the slowest client at 20 and 50).")
	p("")
	p("| clients | proxy | upstream ÷ blob | upstream GETs | all done | first byte p50 | p99 | max | failed clients | peak RSS |")
	p("|---|---|---|---|---|---|---|---|---|---|")
	for _, n := range []int{20, 50, 200} {
		for _, impl := range impls {
			c := r.coldFor(impl, n)
			if c == nil {
				p("| %d | %s | not run | | | | | | | |", n, impl)
				continue
			}
			fail := fmt.Sprint(c.failures)
			if c.failures > 0 {
				fail += ": " + strings.ReplaceAll(c.firstErr, "|", "/")
			}
			p("| %d | %s | %.3f× | %d | %s | %s | %s | %s | %s | %s |", n, impl, float64(c.upBytes)/float64(coldSize), c.upGETs,
				ms(c.wall), ms(percentile(c.firstByte, 0.5)), ms(percentile(c.firstByte, 0.99)), ms(percentile(c.firstByte, 1)), fail, human(c.hwm))
		}
		s, n2 := r.coldFor(stock, n), r.coldFor(nc, n)
		if s != nil && n2 != nil {
			p("| %d | nodecache ÷ stock | %s | | %s | %s | %s | %s | | %s |", n, ratio(float64(n2.upBytes), float64(s.upBytes)),
				ratio(float64(n2.wall), float64(s.wall)), ratio(float64(percentile(n2.firstByte, 0.5)), float64(percentile(s.firstByte, 0.5))),
				ratio(float64(percentile(n2.firstByte, 0.99)), float64(percentile(s.firstByte, 0.99))),
				ratio(float64(percentile(n2.firstByte, 1)), float64(percentile(s.firstByte, 1))), ratio(float64(n2.hwm), float64(s.hwm)))
		}
	}
	p("")

	p("## Warm GET throughput of the cached 64 MiB blob")
	p("")
	p("4 clients × 4 GETs each (1 GiB), best of two interleaved rounds. The file server is a plain Go `http.ServeFile`")
	p("process serving nodecache's own data file of the blob.")
	p("")
	p("| server | MiB/s | ÷ file server |")
	p("|---|---|---|")
	for _, who := range []string{"fileserver", nc, stock} {
		p("| %s | %.0f | %s |", who, r.warm[who]/float64(mib), ratio(r.warm[who], r.warm["fileserver"]))
	}
	p("| nodecache ÷ stock | %s | |", ratio(r.warm[nc], r.warm[stock]))
	p("")

	r.restartMarkdown(p)

	p("## 200 MiB blob through an upstream at 4 MiB/s that resets every connection after 8 MiB")
	p("")
	p("toxiproxy v2.12.0 in-process (bandwidth 4194 KB/s and limit_data 8 MiB, downstream) in front of each proxy's")
	p("upstream listener; one client GET through each proxy, both at once, bounded to 3 minutes. Upstream sent: blob body")
	p("bytes the upstream wrote to its sockets; at each cut toxiproxy and the socket buffers still hold some of them, so")
	p("proxy received (every byte that reached the proxy through toxiproxy, response headers included) is what the")
	p("resets really cost.")
	p("")
	p("| proxy | completed (one request, digest checked) | client got | upstream sent ÷ size | proxy received ÷ size | upstream GETs | time | error |")
	p("|---|---|---|---|---|---|---|---|")
	for _, impl := range impls {
		t := r.throttled[impl]
		if t == nil {
			p("| %s | not run | | | | | | |", impl)
			continue
		}
		p("| %s | %v | %s | %.3f× | %.3f× | %d | %s | %s |", impl, t.completed, human(t.n), float64(t.upBytes)/float64(bigSize),
			float64(t.received)/float64(bigSize), t.upGETs, ms(t.took), strings.ReplaceAll(t.err, "|", "/"))
	}
	p("")

	p("## Start-up with 100,000 blobs in the cache")
	p("")
	if s := r.startup; s != nil {
		p("1,000 images (config, 98 random 256-byte layers, OCI manifest: 100,000 blobs) written directly in distribution's")
		p("filesystem layout with its repository, tag and layer links, in %s (took %s). Time from exec until `/v2/` answers 200;", s.dir, ms(s.layout))
		p("for nodecache also until its index holds every blob (`nodecache_cache_blobs` ≥ 100,000). nodecache started twice:")
		p("first without its index file (rebuilt from storage), then with the index file the first run wrote at shutdown.")
		p("The stock proxy reads nothing of its storage at start, so its time does not depend on the cache.")
		if strings.HasPrefix(s.dir, "/dev/shm") {
			p("The layout is on tmpfs because this shared disk deletes only a few hundred directory entries a second (removing")
			p("the layout would outlast the run); the metadata is in memory as it would be right after writing on disk, so a")
			p("start after a reboot (cold dentry and inode caches) on a disk is slower than shown here.")
		}
		p("")
		p("| proxy | serving (/v2/ 200) | index holds all blobs |")
		p("|---|---|---|")
		if s.stockErr != "" {
			p("| stock | failed: %s | (no index) |", strings.ReplaceAll(s.stockErr, "|", "/"))
		} else {
			p("| stock | %s | (no index) |", ms(s.stock))
		}
		p("| nodecache, index rebuilt | %s | %s |", ms(s.ncCold), ms(s.ncIndex))
		p("| nodecache, index file | %s | %s |", ms(s.ncWarm), ms(s.ncIndexWarm))
		if s.indexErr != "" {
			p("")
			p("Index: %s", s.indexErr)
		}
	} else {
		p("Not run (see Skipped above).")
	}
	p("")

	p("## Eviction of 10 GiB")
	p("")
	if e := r.evict; e != nil {
		p("40 images of one 256 MiB layer (10 GiB; layer space allocated with fallocate, content not matching the digest,")
		p("which eviction does not read) written in nodecache's storage layout; nodecache started with `--max-size 64MiB`, so")
		p("every image is over the cap and goes. Time from exec until `nodecache_evicted_bytes_total` ≥ 10 GiB.")
		p("The stock proxy has no size cap (it expires by TTL only), so it has no row.")
		p("")
		p("| proxy | evicted 10 GiB after | free disk before → after | peak RSS |")
		p("|---|---|---|---|")
		took := ms(e.took)
		if e.err != "" {
			took = "not reached: " + strings.ReplaceAll(e.err, "|", "/")
		}
		p("| nodecache | %s | %s → %s | %s |", took, human(e.freeBefore), human(e.freeAfter), human(e.hwm))
	} else {
		p("Not run (see Skipped above).")
	}
	return b.String()
}
