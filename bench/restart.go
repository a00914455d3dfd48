package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// restartRuns is how many restarts the restart scenario measures per server (medians of these).
const restartRuns = 5

// restartRun is one server's restart scenario: per restart, the first GET of the cached 64 MiB
// blob after the process started (with the blob's data file dropped from the page cache, as after
// a node's reboot, and with it still cached, as after a process restart), and the median of the
// GETs that follow it in the same process.
type restartRun struct {
	label              string // the row's name: stock, nodecache, or nodecache at an earlier commit
	coldPage, warmPage []time.Duration
	repeated           []time.Duration // per restart: the median of its repeated GETs
	startup            []time.Duration // exec to /v2/ 200, per start
	err                string
}

// median is the middle of ds (the lower middle for an even count; 0 when empty).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// dropPageCache asks the kernel to drop path's pages from the page cache (posix_fadvise
// POSIX_FADV_DONTNEED: a hint for clean pages, which these are once written back; fsync first).
func dropPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", path, err)
	}
	return nil
}

// readAll reads path once, so that its pages are in the page cache.
func readAll(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) != coldSize {
		return fmt.Errorf("read %s: %d bytes, want %d", path, len(b), coldSize)
	}
	return nil
}

// restartServer names a server the restart scenario measures and how to start it over a root.
type restartServer struct {
	label string
	impl  string // stock or nodecache
	bin   string // nodecache binary (empty for stock)
}

// restart measures what a restart costs a cached blob: per server, the 64 MiB blob is pulled
// once into a fresh root; then restartRuns times over the same root: the process is started,
// GETs the blob once (the first serve after a start, which may check the stored bytes before it
// trusts them) and 5 times more (repeated warm serves), and is stopped; each restart alternates
// between the data file dropped from the page cache and read into it just before the start.
// With an earlier nodecache (-before), the same is measured for it, on its own root.
func (b *bench) restart(eps map[string]*endpoint, dgst string, before, beforeLabel string) error {
	servers := []restartServer{{label: stock, impl: stock}, {label: nc, impl: nc, bin: b.srv.nodecache}}
	if before != "" {
		servers = append(servers, restartServer{label: "nodecache at " + beforeLabel, impl: nc, bin: before})
	}
	for i, s := range servers {
		run := &restartRun{label: s.label}
		b.res.restart = append(b.res.restart, run)
		if err := b.restartOne(eps[s.impl], s, i, dgst, run); err != nil {
			run.err = err.Error()
			b.stopAll()
			fmt.Fprintf(os.Stderr, "bench: restart %s: %v\n", s.label, err)
		}
	}
	return nil
}

func (b *bench) restartOne(ep *endpoint, s restartServer, i int, dgst string, run *restartRun) error {
	root := filepath.Join(b.work, fmt.Sprintf("restart-%d", i))
	srv := b.srv
	if s.bin != "" {
		srv.nodecache = s.bin
	}
	start := func(tag string) (*proc, error) {
		var p *proc
		var err error
		if s.impl == nc {
			p, err = srv.startNodecache(b.ctx, tag, root, ep.URL, 30*time.Second)
		} else {
			p, err = srv.startStock(b.ctx, tag, root, ep.URL, 30*time.Second)
		}
		if err != nil {
			return nil, err
		}
		return b.track(p), nil
	}
	p, err := start(fmt.Sprintf("restart-%d-fill", i))
	if err != nil {
		return err
	}
	url := blobURL(p, "bench/cold", dgst)
	if r := pull(b.ctx, url, time.Now(), true); r.err != nil || "sha256:"+r.digest != dgst {
		p.stop()
		return fmt.Errorf("fill: %v (digest sha256:%s)", r.err, r.digest)
	}
	data := blobFile(root, dgst)
	if err := waitFile(b.ctx, data, coldSize, 60*time.Second); err != nil {
		p.stop()
		return err
	}
	p.stop()
	for k := range restartRuns * 2 {
		cold := k%2 == 0
		if cold {
			err = dropPageCache(data)
		} else {
			err = readAll(data)
		}
		if err != nil {
			return err
		}
		if p, err = start(fmt.Sprintf("restart-%d-%d", i, k)); err != nil {
			return err
		}
		run.startup = append(run.startup, p.ready)
		url := blobURL(p, "bench/cold", dgst)
		first := pull(b.ctx, url, time.Now(), true)
		if first.err == nil && "sha256:"+first.digest != dgst {
			first.err = fmt.Errorf("first serve after the start: digest sha256:%s", first.digest)
		}
		if first.err != nil {
			p.stop()
			return first.err
		}
		if cold {
			run.coldPage = append(run.coldPage, first.done)
		} else {
			run.warmPage = append(run.warmPage, first.done)
		}
		var again []time.Duration
		for range 5 {
			r := pull(b.ctx, url, time.Now(), false)
			if r.err == nil && r.n != coldSize {
				r.err = fmt.Errorf("repeated serve: %d of %d bytes", r.n, coldSize)
			}
			if r.err != nil {
				p.stop()
				return r.err
			}
			again = append(again, r.done)
		}
		run.repeated = append(run.repeated, median(again))
		p.stop()
	}
	fmt.Fprintf(os.Stderr, "bench: restart %s: first serve %s (page cache dropped), %s (cached), repeated %s\n",
		s.label, ms(median(run.coldPage)), ms(median(run.warmPage)), ms(median(run.repeated)))
	return nil
}

// restartMarkdown is the restart scenario's section.
func (r *results) restartMarkdown(p func(string, ...any)) {
	p("## First serve after a restart, and repeated warm serves, of the cached 64 MiB blob")
	p("")
	if len(r.restart) == 0 {
		p("Not run.")
		return
	}
	p("Each server pulls the blob once into its own root, then is started %d times over it. After each start, one", restartRuns*2)
	p("client GETs the blob once (first serve: exec is done and `/v2/` answered; time to the last byte), then 5 times more")
	p("(repeated: the median of the 5). Starts alternate between the blob's data file dropped from the page cache")
	p("(posix_fadvise DONTNEED, as after a reboot; on a virtual machine the host may still cache the disk) and read")
	p("into it just before the start (as after a process restart).")
	p("Each cell is the median of %d starts.", restartRuns)
	p("")
	p("| server | first serve, page cache dropped | first serve, page cache warm | repeated serve | start-up (/v2/ 200) | error |")
	p("|---|---|---|---|---|---|")
	for _, run := range r.restart {
		p("| %s | %s | %s | %s | %s | %s |", run.label, ms(median(run.coldPage)), ms(median(run.warmPage)),
			ms(median(run.repeated)), ms(median(run.startup)), run.err)
	}
	var n, s *restartRun
	for _, run := range r.restart {
		switch run.label {
		case nc:
			n = run
		case stock:
			s = run
		}
	}
	if n != nil && s != nil {
		p("| nodecache ÷ stock | %s | %s | %s | %s | |",
			ratio(float64(median(n.coldPage)), float64(median(s.coldPage))),
			ratio(float64(median(n.warmPage)), float64(median(s.warmPage))),
			ratio(float64(median(n.repeated)), float64(median(s.repeated))),
			ratio(float64(median(n.startup)), float64(median(s.startup))))
	}
	for _, run := range r.restart {
		if n != nil && run != n && run.label != stock {
			p("| nodecache ÷ %s | %s | %s | %s | %s | |", run.label,
				ratio(float64(median(n.coldPage)), float64(median(run.coldPage))),
				ratio(float64(median(n.warmPage)), float64(median(run.warmPage))),
				ratio(float64(median(n.repeated)), float64(median(run.repeated))),
				ratio(float64(median(n.startup)), float64(median(run.startup))))
		}
	}
	p("")
}
