package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

const (
	mib       = int64(1) << 20
	gib       = int64(1) << 30
	coldSize  = 64 * mib
	bigSize   = 200 * mib
	startBlob = 100_000
	evictSize = 10 * gib
	// Impls are the two proxies compared, in table order.
	stock = "stock"
	nc    = "nodecache"
)

var impls = []string{stock, nc}

type bench struct {
	ctx  context.Context
	work string
	srv  servers
	res  *results
	only map[string]bool
	// startupDir holds the 100,000-blob layout (tmpfs: this disk deletes a few hundred entries a second).
	startupDir string
	idleUp     string // an upstream URL for scenarios that pull nothing (the stock proxy pings it at start)
	// clusterLayer is the size of each of the cluster image's clusterLayers layers.
	clusterLayer int64
	// before is an earlier nodecache binary the restart scenario measures too (empty: none),
	// beforeLabel what it was built from.
	before, beforeLabel string

	mu    sync.Mutex
	procs []*proc
}

func (b *bench) track(p *proc) *proc {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.procs = append(b.procs, p)
	return p
}

func (b *bench) stopAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.procs {
		p.stop()
	}
	b.procs = nil
}

// start starts impl over root pulling from upURL; extra flags go to nodecache only.
func (b *bench) start(impl, tag, root, upURL string, wait time.Duration, extra ...string) (*proc, error) {
	var p *proc
	var err error
	if impl == nc {
		p, err = b.srv.startNodecache(b.ctx, tag, root, upURL, wait, extra...)
	} else {
		p, err = b.srv.startStock(b.ctx, tag, root, upURL, wait)
	}
	if err != nil {
		return nil, err
	}
	return b.track(p), nil
}

// freeBytes is the space an unprivileged writer has left on dir's filesystem.
func freeBytes(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// fits says whether need bytes (plus 2 GiB to spare) are free under the work directory, and
// records a skip note when not.
func (b *bench) fits(scenario string, need int64) bool {
	free := freeBytes(b.work)
	if free >= need+2*gib {
		return true
	}
	b.res.skips = append(b.res.skips, fmt.Sprintf("%s: skipped, needs %s free (+2 GiB spare) in %s, %s free",
		scenario, human(need), b.work, human(free)))
	return false
}

func (b *bench) all() error {
	up := newUpstream(b.ctx, filepath.Join(b.work, "upstream"))
	if !b.fits("upstream blobs", coldSize+bigSize) {
		return errors.New("no room for the upstream's blobs")
	}
	seed, err := up.listen()
	if err != nil {
		return err
	}
	defer seed.close()
	b.idleUp = seed.URL
	var smallDigest, bigDigest string
	if b.only["cold"] || b.only["warm"] || b.only["throttled"] || b.only["restart"] {
		rng := rand.NewChaCha8([32]byte{1})
		small := make([]byte, coldSize)
		_, _ = rng.Read(small)
		big := make([]byte, bigSize)
		_, _ = rng.Read(big)
		if smallDigest, err = pushBlob(b.ctx, seed, "bench/cold", small); err != nil {
			return err
		}
		if bigDigest, err = pushBlob(b.ctx, seed, "bench/big", big); err != nil {
			return err
		}
	}
	eps := map[string]*endpoint{}
	for _, impl := range impls {
		if eps[impl], err = up.listen(); err != nil {
			return err
		}
		defer eps[impl].close()
	}
	// A scenario that fails is noted in the table and the next one still runs.
	note := func(scenario string, err error) {
		if err != nil {
			b.stopAll()
			b.res.notes = append(b.res.notes, scenario+" failed: "+err.Error())
			fmt.Fprintf(os.Stderr, "bench: %s failed: %v\n", scenario, err)
		}
	}
	for _, n := range []int{20, 50, 200} {
		if b.only["cold"] {
			note(fmt.Sprintf("cold pulls, %d clients", n), b.cold(eps, n, smallDigest))
		}
	}
	if b.only["warm"] && !b.only["cold"] {
		// Warm alone (the cold scenario runs it after its 20-client pulls): the same 20-client
		// cold pulls fill the caches, then their numbers are dropped, the warm table is kept.
		err := b.cold(eps, 20, smallDigest)
		b.res.cold = map[string][]*coldRun{}
		note("warm throughput", err)
	}
	if b.only["restart"] {
		note("restart", b.restart(eps, smallDigest, b.before, b.beforeLabel))
	}
	if b.only["throttled"] {
		note("throttled 200 MiB", b.throttled(eps, bigDigest))
	}
	if b.only["startup"] {
		note("start-up", b.startup())
	}
	if b.only["evict"] {
		note("eviction", b.evict())
	}
	if b.only["cluster"] {
		// Its failure is noted in its own section: a run of the cluster scenario alone rewrites
		// only that section of the results file.
		if err := b.cluster(up, b.clusterLayer); err != nil {
			b.stopAll()
			b.res.cluster.notes = append(b.res.cluster.notes, "cluster failed: "+err.Error())
			fmt.Fprintf(os.Stderr, "bench: cluster failed: %v\n", err)
		}
	}
	return b.ctx.Err()
}

// pullResult is one client's GET of a blob.
type pullResult struct {
	firstByte time.Duration // from the common start to the first body byte
	done      time.Duration
	n         int64
	digest    string // hex SHA-256 of the body when asked for
	err       error
}

var transport = &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true, ForceAttemptHTTP2: false}

func pull(ctx context.Context, url string, start time.Time, hash bool) pullResult {
	var r pullResult
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		r.err = err
		return r
	}
	resp, err := transport.RoundTrip(req)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.err = fmt.Errorf("GET %s: %s", url, resp.Status)
		return r
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	for {
		k, err := resp.Body.Read(buf)
		if k > 0 {
			if r.n == 0 {
				r.firstByte = time.Since(start)
			}
			r.n += int64(k)
			if hash {
				h.Write(buf[:k])
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			r.err = err
			break
		}
	}
	r.done = time.Since(start)
	if hash {
		r.digest = hex.EncodeToString(h.Sum(nil))
	}
	return r
}

// pullMany runs n clients at once; client 0 checks the digest.
func pullMany(ctx context.Context, url string, n int) ([]pullResult, time.Duration) {
	out := make([]pullResult, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var start time.Time
	for i := range n {
		wg.Go(func() {
			<-gate
			out[i] = pull(ctx, url, start, i == 0)
		})
	}
	start = time.Now()
	close(gate)
	wg.Wait()
	return out, time.Since(start)
}

// coldRun is one proxy's cold concurrent pulls.
type coldRun struct {
	clients   int
	wall      time.Duration
	upBytes   int64
	upGETs    int64
	firstByte []time.Duration
	failures  int
	firstErr  string
	hwm       int64
	startup   time.Duration
}

func blobURL(p *proc, repo, dgst string) string {
	return "http://" + p.addr + "/v2/" + repo + "/blobs/" + dgst
}

func (b *bench) cold(eps map[string]*endpoint, n int, dgst string) error {
	live := map[string]*proc{}
	for _, impl := range impls {
		root := filepath.Join(b.work, fmt.Sprintf("%s-cold-%d", impl, n))
		p, err := b.start(impl, fmt.Sprintf("cold-%d", n), root, eps[impl].URL, 30*time.Second)
		if err != nil {
			return err
		}
		live[impl] = p
		eps[impl].reset()
		ctx, cancel := context.WithTimeout(b.ctx, 4*time.Minute)
		rs, wall := pullMany(ctx, blobURL(p, "bench/cold", dgst), n)
		cancel()
		cr := &coldRun{clients: n, wall: wall, upBytes: eps[impl].blobBytes.Load(), upGETs: eps[impl].blobGETs.Load(), startup: p.ready}
		for i, r := range rs {
			switch {
			case r.err == nil && r.n != coldSize:
				r.err = fmt.Errorf("short body: %d of %d bytes", r.n, coldSize)
			case r.err == nil && i == 0 && "sha256:"+r.digest != dgst:
				r.err = fmt.Errorf("digest mismatch: sha256:%s", r.digest)
			}
			if r.err != nil {
				cr.failures++
				if cr.firstErr == "" {
					cr.firstErr = r.err.Error()
				}
				continue
			}
			cr.firstByte = append(cr.firstByte, r.firstByte)
		}
		if cr.hwm, err = p.hwm(); err != nil {
			return err
		}
		b.res.cold[impl] = append(b.res.cold[impl], cr)
		fmt.Fprintf(os.Stderr, "bench: cold %s x%d: %s, upstream %.2fx\n", impl, n, wall.Round(time.Millisecond), float64(cr.upBytes)/float64(coldSize))
	}
	if n == 20 {
		if err := b.warm(live, dgst); err != nil {
			return err
		}
	}
	for _, p := range live {
		p.stop()
	}
	return nil
}

// blobFile is where distribution's filesystem driver keeps a blob's data under root.
func blobFile(root, dgst string) string {
	hex := strings.TrimPrefix(dgst, "sha256:")
	return filepath.Join(root, "docker/registry/v2/blobs/sha256", hex[:2], hex, "data")
}

// warm compares GET throughput of the cached blob: nodecache, the stock proxy and a plain Go
// file server of nodecache's own data file, 4 clients x 4 GETs each, best of two interleaved rounds.
func (b *bench) warm(live map[string]*proc, dgst string) error {
	ncFile := blobFile(filepath.Join(b.work, "nodecache-cold-20"), dgst)
	for _, impl := range impls {
		root := filepath.Join(b.work, impl+"-cold-20")
		if err := waitFile(b.ctx, blobFile(root, dgst), coldSize, 60*time.Second); err != nil {
			return fmt.Errorf("warm %s: %w", impl, err)
		}
	}
	fs, err := b.srv.startFileServer(b.ctx, ncFile)
	if err != nil {
		return err
	}
	b.track(fs)
	defer fs.stop()
	urls := map[string]string{
		"fileserver": "http://" + fs.addr + "/data",
		nc:           blobURL(live[nc], "bench/cold", dgst),
		stock:        blobURL(live[stock], "bench/cold", dgst),
	}
	const clients, gets = 4, 4
	for round := 0; round < 2; round++ {
		for _, who := range []string{"fileserver", nc, stock} {
			start := time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			var total int64
			var failed error
			for range clients {
				wg.Go(func() {
					for range gets {
						r := pull(b.ctx, urls[who], time.Now(), false)
						mu.Lock()
						total += r.n
						if r.err != nil && failed == nil {
							failed = r.err
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if failed != nil {
				return fmt.Errorf("warm %s: %w", who, failed)
			}
			bps := float64(total) / time.Since(start).Seconds()
			if bps > b.res.warm[who] {
				b.res.warm[who] = bps
			}
		}
	}
	return nil
}

// waitFile waits until path exists with size bytes (a proxy stores a fill in the background).
func waitFile(ctx context.Context, path string, size int64, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		if st, err := os.Stat(path); err == nil && st.Size() == size {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not stored with %d bytes within %s", path, size, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// throttledRun is one client's GET of the 200 MiB blob through the throttled, resetting upstream.
type throttledRun struct {
	completed bool
	n         int64
	upBytes   int64
	upGETs    int64
	received  int64 // bytes the proxy received through toxiproxy (headers included)
	took      time.Duration
	err       string
}

// throttled pulls the 200 MiB blob once through each proxy at the same time, each over its own
// toxiproxy in front of the upstream: 4 MiB/s downstream, every connection closed after 8 MiB.
func (b *bench) throttled(eps map[string]*endpoint, dgst string) error {
	if !b.fits("throttled 200 MiB", 2*bigSize) {
		return nil
	}
	tsrv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	var wg sync.WaitGroup
	for _, impl := range impls {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		tp := toxiproxy.NewProxy(tsrv, "up-"+impl, addr, eps[impl].addr)
		if err := tp.Start(); err != nil {
			return fmt.Errorf("toxiproxy: %w", err)
		}
		defer tp.Stop()
		for _, toxic := range []string{
			// toxiproxy's rate is in KB/s of 1000 bytes: 4 MiB/s = 4194 KB/s.
			`{"name":"bw","type":"bandwidth","stream":"downstream","attributes":{"rate":4194}}`,
			`{"name":"reset","type":"limit_data","stream":"downstream","attributes":{"bytes":8388608}}`,
		} {
			if _, err := tp.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
				return fmt.Errorf("toxiproxy toxic %s: %w", toxic, err)
			}
		}
		rl, err := newRelay(addr)
		if err != nil {
			return err
		}
		defer rl.close()
		root := filepath.Join(b.work, impl+"-throttled")
		p, err := b.start(impl, "throttled", root, "http://"+rl.addr, 30*time.Second)
		if err != nil {
			return err
		}
		eps[impl].reset()
		wg.Go(func() {
			defer p.stop()
			ctx, cancel := context.WithTimeout(b.ctx, 3*time.Minute)
			defer cancel()
			r := pull(ctx, blobURL(p, "bench/big", dgst), time.Now(), true)
			tr := &throttledRun{n: r.n, took: r.done, upBytes: eps[impl].blobBytes.Load(), upGETs: eps[impl].blobGETs.Load(), received: rl.received.Load()}
			tr.completed = r.err == nil && r.n == bigSize && "sha256:"+r.digest == dgst
			if r.err != nil {
				tr.err = r.err.Error()
			} else if !tr.completed {
				tr.err = fmt.Sprintf("body of %d bytes, sha256:%s", r.n, r.digest)
			}
			b.mu.Lock()
			b.res.throttled[impl] = tr
			b.mu.Unlock()
			fmt.Fprintf(os.Stderr, "bench: throttled %s: completed=%v in %s\n", impl, tr.completed, tr.took.Round(time.Millisecond))
		})
	}
	wg.Wait()
	return nil
}

// metric reads one unlabelled sample from a nodecache's /metrics.
func metric(p *proc, name string) (float64, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("metrics of %s: %w", p.name, err)
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("metrics of %s: no %s", p.name, name)
}

// waitMetric polls name on p until ok says yes; the time since p was started.
func (b *bench) waitMetric(p *proc, name string, wait time.Duration, ok func(float64) bool) (time.Duration, error) {
	deadline := time.Now().Add(wait)
	for {
		v, err := metric(p, name)
		if err == nil && ok(v) {
			return time.Since(p.started), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s of %s: last %v (%v) after %s", name, p.name, v, err, wait)
		}
		select {
		case <-b.ctx.Done():
			return 0, b.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startup measures both proxies starting over a storage root holding 100,000 blobs (1,000
// images of a config, 98 layers and the manifest), written directly in distribution's layout.
// nodecache starts twice: without its index file (rebuilt from storage) and with the one its
// first run wrote at shutdown.
func (b *bench) startup() error {
	// Per blob a 4 KiB block, its directory and, for layers, a link directory and file.
	need := int64(3 * startBlob * 4096)
	dir := b.startupDir
	if dir == "" {
		dir = b.work
	}
	if freeBytes(dir) < need+gib {
		b.res.skips = append(b.res.skips, fmt.Sprintf("start-up with 100,000 blobs: skipped, needs %s free (+1 GiB spare) in %s, %s free",
			human(need), dir, human(freeBytes(dir))))
		return nil
	}
	root, err := os.MkdirTemp(dir, "nodecache-bench-startup-")
	if err != nil {
		return fmt.Errorf("start-up root: %w", err)
	}
	defer os.RemoveAll(root)
	t0 := time.Now()
	if err := writeLayout(root, "bench.test/start", startBlob/100, 98, func(i int) (int64, bool) { return 256, true }); err != nil {
		return err
	}
	st := &startupRun{dir: dir, layout: time.Since(t0)}
	b.res.startup = st
	fmt.Fprintf(os.Stderr, "bench: start-up layout written in %s\n", st.layout.Round(time.Millisecond))
	if p, err := b.start(stock, "startup", root, b.idleUp, 60*time.Second); err != nil {
		st.stockErr = err.Error()
	} else {
		st.stock = p.ready
		p.stop()
	}
	for i, pass := range []*time.Duration{&st.ncCold, &st.ncWarm} {
		p, err := b.start(nc, fmt.Sprintf("startup-%d", i), root, b.idleUp, 60*time.Second)
		if err != nil {
			return err
		}
		*pass = p.ready
		idx, err := b.waitMetric(p, "nodecache_cache_blobs", 120*time.Second, func(v float64) bool { return v >= startBlob })
		if err != nil {
			st.indexErr = err.Error()
		}
		if i == 0 {
			st.ncIndex = idx
		} else {
			st.ncIndexWarm = idx
		}
		p.stop()
	}
	return nil
}

// evict fills a nodecache root with 40 images of one 256 MiB layer (10 GiB, allocated with
// fallocate: their content does not match their digest, which eviction never reads) and starts
// nodecache with --max-size 64MiB, so every image is over the cap: the time until
// nodecache_evicted_bytes_total reaches 10 GiB.
func (b *bench) evict() error {
	if !b.fits("eviction of 10 GiB", evictSize+gib) {
		return nil
	}
	root := filepath.Join(b.work, "evict")
	const images = 40
	if err := writeLayout(root, "bench.test/evict", images, 1, func(int) (int64, bool) { return evictSize / images, false }); err != nil {
		return err
	}
	er := &evictRun{freeBefore: freeBytes(b.work)}
	b.res.evict = er
	p, err := b.start(nc, "evict", root, b.idleUp, 60*time.Second, "--max-size", "64MiB")
	if err != nil {
		return err
	}
	defer p.stop()
	er.took, err = b.waitMetric(p, "nodecache_evicted_bytes_total", 5*time.Minute, func(v float64) bool { return v >= float64(evictSize) })
	if err != nil {
		er.err = err.Error()
	}
	er.freeAfter = freeBytes(b.work)
	if er.hwm, err = p.hwm(); err != nil {
		return err
	}
	p.stop()
	return os.RemoveAll(root)
}
