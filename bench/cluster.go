package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The cluster scenario (issue 22): clusterNodes node caches, each on its own loopback address
// (127.0.0.2 …), in front of one upstream limited to clusterRate bytes a second in total.
const (
	clusterNodes  = 10
	clusterRate   = 20 * mib
	clusterLayers = 4
	clusterRepo   = "bench/cluster"
	clusterTag    = "v1"
)

// clusterVariant is one way to run a cache on every node.
type clusterVariant struct {
	name  string
	impl  string // stock or nc
	peers bool
}

var clusterVariants = []clusterVariant{
	{"stock proxy per node", stock, false},
	{"nodecache per node", nc, false},
	{"nodecache per node, --peers", nc, true},
}

// clusterImage is the image pushed to the upstream for the cluster scenario.
type clusterImage struct {
	size      int64 // config and layers: the blob bytes a node needs
	layerSize int64
}

// clusterPhase is one set of nodes pulling the image at the same moment on fresh nodes.
type clusterPhase struct {
	clients        int
	slowest        time.Duration // common start until every client has the whole image
	fastest        time.Duration
	upBytes        int64 // blob body bytes the upstream sent, counted after the nodes stopped
	upGETs         int64
	failures       int
	firstErr       string
	liveWait       time.Duration // start of the processes until every node saw its peers live
	startedThrough time.Duration // start of the first process until the last answered /v2/
}

type clusterRun struct {
	variant    clusterVariant
	alone, all *clusterPhase
	err        string
}

// clusterResults is the cluster scenario's part of the results, with its own run details: a run
// of this scenario alone replaces only its section of the results file.
type clusterResults struct {
	image                 clusterImage
	runs                  []*clusterRun
	started               time.Time
	elapsed               time.Duration
	loadBefore, loadAfter string
	notes                 []string
}

// pushClusterImage generates an image of clusterLayers random layers of layerSize bytes and a
// config, pushes its blobs and its manifest (tag clusterTag) to the upstream through e.
func pushClusterImage(ctx context.Context, e *endpoint, layerSize int64) (clusterImage, error) {
	img := clusterImage{layerSize: layerSize}
	rng := mrand.NewChaCha8([32]byte{22})
	type desc struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	}
	var layers []desc
	data := make([]byte, layerSize)
	for range clusterLayers {
		_, _ = rng.Read(data)
		d, err := pushBlob(ctx, e, clusterRepo, data)
		if err != nil {
			return img, err
		}
		layers = append(layers, desc{"application/vnd.oci.image.layer.v1.tar+gzip", d, layerSize})
		img.size += layerSize
	}
	cfg := []byte(`{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]},"bench":"cluster"}`)
	cd, err := pushBlob(ctx, e, clusterRepo, cfg)
	if err != nil {
		return img, err
	}
	img.size += int64(len(cfg))
	m, err := json.Marshal(struct {
		SchemaVersion int    `json:"schemaVersion"`
		MediaType     string `json:"mediaType"`
		Config        desc   `json:"config"`
		Layers        []desc `json:"layers"`
	}{2, "application/vnd.oci.image.manifest.v1+json", desc{"application/vnd.oci.image.config.v1+json", cd, int64(len(cfg))}, layers})
	if err != nil {
		return img, err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, e.URL+"/v2/"+clusterRepo+"/manifests/"+clusterTag, bytes.NewReader(m))
	req.Header.Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return img, fmt.Errorf("push the cluster manifest: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return img, fmt.Errorf("push the cluster manifest: %s", resp.Status)
	}
	return img, nil
}

// clusterNode is one node: its cache process and where it listens.
type clusterNode struct {
	host string
	p    *proc
}

// startCluster starts clusterNodes caches of variant v under dir, all pulling through upURL;
// with peers, it waits until every node sees the other nine live.
func (b *bench) startCluster(v clusterVariant, tag, dir, upURL string, ph *clusterPhase) ([]clusterNode, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster directory: %w", err)
	}
	nodes := make([]clusterNode, clusterNodes)
	addrs := make([]string, clusterNodes)
	peerAddrs := make([]string, clusterNodes)
	for i := range nodes {
		nodes[i].host = fmt.Sprintf("127.0.0.%d", i+2)
		var err error
		if addrs[i], err = freeAddrOn(nodes[i].host); err != nil {
			return nil, err
		}
		if peerAddrs[i], err = freeAddrOn(nodes[i].host); err != nil {
			return nil, err
		}
	}
	members, keyFile := filepath.Join(dir, "members"), filepath.Join(dir, "peer.key")
	if v.peers {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("peer key: %w", err)
		}
		if err := os.WriteFile(members, []byte(strings.Join(peerAddrs, "\n")+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("member list: %w", err)
		}
	}
	t0 := time.Now()
	for i := range nodes {
		root := filepath.Join(dir, nodes[i].host)
		name := fmt.Sprintf("%s-%d", tag, i)
		var p *proc
		var err error
		switch {
		case v.impl == stock:
			p, err = b.srv.startStockAt(b.ctx, name, addrs[i], root, upURL, 60*time.Second)
		case v.peers:
			p, err = b.srv.startNodecacheAt(b.ctx, name, addrs[i], root, upURL, 60*time.Second,
				"--peers", "file:"+members, "--peer-listen", peerAddrs[i], "--peer-key-file", keyFile, "--peers-refresh", "1s")
		default:
			p, err = b.srv.startNodecacheAt(b.ctx, name, addrs[i], root, upURL, 60*time.Second)
		}
		if err != nil {
			return nodes, err
		}
		nodes[i].p = b.track(p)
	}
	ph.startedThrough = time.Since(t0)
	if v.peers {
		want := float64(clusterNodes - 1)
		for _, n := range nodes {
			if _, err := b.waitMetric(n.p, `nodecache_peers{state="live"}`, 90*time.Second, func(f float64) bool { return f == want }); err != nil {
				return nodes, err
			}
		}
		ph.liveWait = time.Since(t0)
	}
	return nodes, nil
}

// stopCluster stops the nodes' processes and removes dir (their storage).
func stopCluster(nodes []clusterNode, dir string) error {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n.p != nil {
			wg.Go(n.p.stop)
		}
	}
	wg.Wait()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// pullImage pulls the cluster image from a node with go-containerregistry, reading the config and
// every layer to the end (go-containerregistry checks each digest as it reads), over its own
// connections.
func pullImage(ctx context.Context, addr string, img clusterImage) error {
	ref, err := name.ParseReference(addr+"/"+clusterRepo+":"+clusterTag, name.Insecure)
	if err != nil {
		return err
	}
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	im, err := remote.Image(ref, remote.WithContext(ctx), remote.WithTransport(tr))
	if err != nil {
		return err
	}
	cfg, err := im.RawConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	got := int64(len(cfg))
	layers, err := im.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, rc)
		_ = rc.Close()
		got += n
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
	}
	if got != img.size {
		return fmt.Errorf("read %d bytes of the image's %d", got, img.size)
	}
	return nil
}

// clusterPull has the first clients nodes pull the image at the same moment.
func clusterPull(ctx context.Context, nodes []clusterNode, clients int, img clusterImage, ph *clusterPhase) {
	done := make([]time.Duration, clients)
	errs := make([]error, clients)
	gate := make(chan struct{})
	var start time.Time
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			<-gate
			errs[i] = pullImage(ctx, nodes[i].p.addr, img)
			done[i] = time.Since(start)
		})
	}
	start = time.Now()
	close(gate)
	wg.Wait()
	ph.clients = clients
	for i := range clients {
		if errs[i] != nil {
			ph.failures++
			if ph.firstErr == "" {
				ph.firstErr = fmt.Sprintf("%s: %v", nodes[i].host, errs[i])
			}
		}
		ph.slowest = max(ph.slowest, done[i])
		if ph.fastest == 0 || done[i] < ph.fastest {
			ph.fastest = done[i]
		}
	}
}

// cluster runs the cluster scenario: per variant, one node pulls the image alone, then (on fresh
// nodes) every node pulls it at the same moment. Each phase's processes are stopped and their
// storage removed before the next starts.
func (b *bench) cluster(up *upstream, layerSize int64) error {
	cr := b.res.cluster
	cr.started = time.Now()
	cr.loadBefore = loadAvg()
	defer func() {
		cr.elapsed = time.Since(cr.started)
		cr.loadAfter = loadAvg()
	}()
	// Per phase: every node's copy of the image, and the stock proxy's upload staging.
	if !b.fits("cluster", 2*clusterNodes*(clusterLayers*layerSize+mib)) {
		cr.notes = append(cr.notes, b.res.skips[len(b.res.skips)-1])
		return nil
	}
	ep, err := up.listenLimited(newBucket(clusterRate))
	if err != nil {
		return err
	}
	defer ep.close()
	cr.image, err = pushClusterImage(b.ctx, ep, layerSize)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: cluster image of %s pushed\n", human(cr.image.size))
	// Bound for one phase: every node's copy through the shared limit, three times over.
	bound := 60*time.Second + 3*time.Duration(clusterNodes*cr.image.size/clusterRate)*time.Second
	for vi, v := range clusterVariants {
		run := &clusterRun{variant: v}
		cr.runs = append(cr.runs, run)
		for _, clients := range []int{1, clusterNodes} {
			ph := &clusterPhase{}
			phase := "all"
			if clients == 1 {
				run.alone, phase = ph, "alone"
			} else {
				run.all = ph
			}
			tag := fmt.Sprintf("cluster-%d-%s", vi, phase)
			dir := filepath.Join(b.work, tag)
			nodes, err := b.startCluster(v, tag, dir, ep.URL, ph)
			if err == nil {
				ep.reset()
				ctx, cancel := context.WithTimeout(b.ctx, bound)
				clusterPull(ctx, nodes, clients, cr.image, ph)
				cancel()
			}
			// Stopped first: the count includes anything a node was still fetching.
			stopErr := stopCluster(nodes, dir)
			ph.upBytes, ph.upGETs = ep.blobBytes.Load(), ep.blobGETs.Load()
			if err = errors.Join(err, stopErr); err != nil {
				run.err = err.Error()
				fmt.Fprintf(os.Stderr, "bench: cluster %s, %s: %v\n", v.name, phase, err)
				break
			}
			fmt.Fprintf(os.Stderr, "bench: cluster %s, %d pulling: every node done in %s, upstream %.3f× the image, %d failed\n",
				v.name, clients, ph.slowest.Round(time.Millisecond), float64(ph.upBytes)/float64(cr.image.size), ph.failures)
		}
		if b.ctx.Err() != nil {
			return b.ctx.Err()
		}
	}
	for _, t := range cr.targets() {
		fmt.Fprintf(os.Stderr, "bench: cluster target %s: %s: %s\n", t.name, t.measured, map[bool]string{true: "PASS", false: "MISS"}[t.ok])
	}
	return nil
}

// clusterTarget is one of the targets for the cluster scenario.
type clusterTarget struct {
	name, measured string
	ok             bool
}

func (c *clusterResults) run(peers bool, impl string) *clusterRun {
	for _, r := range c.runs {
		if r.variant.peers == peers && r.variant.impl == impl {
			return r
		}
	}
	return nil
}

func (c *clusterResults) upRatio(ph *clusterPhase) float64 {
	if ph == nil || c.image.size == 0 {
		return 0
	}
	return float64(ph.upBytes) / float64(c.image.size)
}

// timeRatio is the cluster's time ÷ one node's alone, 0 when either is missing or failed.
func timeRatio(r *clusterRun) float64 {
	if r == nil || r.alone == nil || r.all == nil || r.alone.failures+r.all.failures > 0 || r.alone.slowest == 0 {
		return 0
	}
	return float64(r.all.slowest) / float64(r.alone.slowest)
}

func (c *clusterResults) targets() []clusterTarget {
	var out []clusterTarget
	p := c.run(true, nc)
	complete := p != nil && p.all != nil && p.all.failures == 0 && p.err == ""
	up := 0.0
	measured := "not measured"
	if p != nil && p.all != nil {
		up = c.upRatio(p.all)
		measured = fmt.Sprintf("%.3f×", up)
	}
	out = append(out, clusterTarget{"with --peers, upstream bytes ≤ 1.02× the image (10 nodes at once)", measured, complete && up <= 1.02})
	for _, impl := range []string{nc, stock} {
		r := c.run(false, impl)
		measured, ok := "not measured", false
		if r != nil && r.all != nil {
			up := c.upRatio(r.all)
			measured = fmt.Sprintf("%.3f×", up)
			ok = r.all.failures == 0 && up >= 0.98*clusterNodes && up <= 1.02*clusterNodes
		}
		out = append(out, clusterTarget{fmt.Sprintf("without peers (%s per node), upstream bytes 10× the image", impl), measured, ok})
	}
	tr := timeRatio(p)
	measured = "not measured"
	if tr > 0 {
		measured = fmt.Sprintf("%.2f× (%s ÷ %s)", tr, ms(p.all.slowest), ms(p.alone.slowest))
	}
	out = append(out, clusterTarget{"with --peers, every node done within 1.5× the time one node takes alone", measured, tr > 0 && tr <= 1.5})
	return out
}

// markdown is the cluster section of the results file.
func (c *clusterResults) markdown(commit, machine string) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("## Cluster: %d nodes pull one image at once through an upstream limited to %d MiB/s in total", clusterNodes, clusterRate/mib)
	p("")
	if c.started.IsZero() {
		p("Not run.")
		return b.String()
	}
	p("- Run: commit %s, %s, took %s; %s", commit, c.started.UTC().Format(time.RFC3339), c.elapsed.Round(time.Second), machine)
	load := "not otherwise loaded"
	if loaded(c.loadBefore) || loaded(c.loadAfter) {
		load = "loaded"
	}
	p("- Load average (1/5/15 min): %s before, %s after: the times are from a %s %d-core machine, its cores shared", c.loadBefore, c.loadAfter, load, runtime.NumCPU())
	p("  with other work, by the bench process (upstream, throttle, ten clients) and by the ten node processes; they")
	p("  include waiting for CPU. The byte counts do not depend on it.")
	p("- Image: %d layers of %s and a config, %s in all (tag %s in %s), random bytes; the manifest is not counted.",
		clusterLayers, human(c.image.layerSize), human(c.image.size), clusterTag, clusterRepo)
	p("- Upstream: the bench's distribution v3.1.2 behind one listener whose response bodies all go through **one token")
	p("  bucket of %d MiB/s shared by all its connections** (not per connection). Upstream ÷ image: blob body bytes it sent,", clusterRate/mib)
	p("  counted after the phase's processes stopped (so a fetch still running counts), ÷ the image's blob bytes.")
	p("- Nodes: %d processes, node i listening on 127.0.0.(i+2), each with its own empty storage. Stock: distribution's", clusterNodes)
	p("  `registry` v3.1.2 in proxy mode. nodecache: `nodecache serve`; with peers also `--peers file:MEMBERS` (the ten peer")
	p("  ports) `--peer-listen 127.0.0.(i+2):PORT --peer-key-file KEY --peers-refresh 1s`, and the pull starts once every")
	p("  node reports `nodecache_peers{state=\"live\"} %d`.", clusterNodes-1)
	p("- Clients: one go-containerregistry client per node (in the bench process), resolving the tag and reading the config")
	p("  and every layer to the end, layers one after another; go-containerregistry checks each digest. All nodes: every")
	p("  client starts at the same moment; every node done is the time until the last client has the whole image. One node")
	p("  alone: the same variant started afresh (all ten processes, peers live), only node 127.0.0.2 pulls.")
	p("  Each phase's processes are stopped and their storage removed before the next phase starts.")
	for _, n := range c.notes {
		p("- Note: %s", n)
	}
	p("")
	p("| target | measured | |")
	p("|---|---|---|")
	for _, t := range c.targets() {
		p("| %s | %s | %s |", t.name, t.measured, verdict(t.ok))
	}
	p("")
	p("| variant | upstream ÷ image, all nodes | upstream blob GETs | every node done | first node done | one node alone | upstream ÷ image, alone | all ÷ alone | failed clients |")
	p("|---|---|---|---|---|---|---|---|---|")
	for _, r := range c.runs {
		cell := func(ph *clusterPhase, f func(*clusterPhase) string) string {
			if ph == nil {
				return "not run"
			}
			return f(ph)
		}
		fails := func(ph *clusterPhase) string {
			if ph == nil {
				return ""
			}
			s := fmt.Sprint(ph.failures)
			if ph.failures > 0 {
				s += ": " + strings.ReplaceAll(ph.firstErr, "|", "/")
			}
			return s
		}
		tr := "–"
		if x := timeRatio(r); x > 0 {
			tr = fmt.Sprintf("%.2f×", x)
		}
		failed := fails(r.all)
		if a := fails(r.alone); a != "" && a != "0" {
			failed += " (alone: " + a + ")"
		}
		if r.err != "" {
			failed += " error: " + strings.ReplaceAll(r.err, "|", "/")
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |", r.variant.name,
			cell(r.all, func(ph *clusterPhase) string { return fmt.Sprintf("%.3f×", c.upRatio(ph)) }),
			cell(r.all, func(ph *clusterPhase) string { return fmt.Sprint(ph.upGETs) }),
			cell(r.all, func(ph *clusterPhase) string { return ms(ph.slowest) }),
			cell(r.all, func(ph *clusterPhase) string { return ms(ph.fastest) }),
			cell(r.alone, func(ph *clusterPhase) string { return ms(ph.slowest) }),
			cell(r.alone, func(ph *clusterPhase) string { return fmt.Sprintf("%.3f×", c.upRatio(ph)) }),
			tr, failed)
	}
	if s, p2 := c.run(false, stock), c.run(true, nc); s != nil && p2 != nil && s.all != nil && p2.all != nil {
		p("| nodecache --peers ÷ stock | %s | | %s | | | | | |", ratio(float64(p2.all.upBytes), float64(s.all.upBytes)), ratio(float64(p2.all.slowest), float64(s.all.slowest)))
	}
	if r := c.run(true, nc); r != nil && r.all != nil && r.all.liveWait > 0 {
		p("")
		p("With peers, the ten processes answered `/v2/` %s after the first was started and all saw their nine members live", ms(r.all.startedThrough))
		p("after %s (not part of the times above).", ms(r.all.liveWait))
	}
	return b.String()
}

// loaded says whether a load average line's 1-minute figure is at least half the CPUs.
func loaded(loadAvg string) bool {
	f := strings.Fields(loadAvg)
	if len(f) == 0 {
		return false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return err == nil && v >= float64(runtime.NumCPU())/2
}

// splitCluster cuts doc's cluster section (from its "## Cluster:" heading to the next "## "
// heading or the end) out of doc; section is "" when doc has none.
func splitCluster(doc string) (rest, section string) {
	i := strings.Index("\n"+doc, "\n## Cluster:")
	if i < 0 {
		return doc, ""
	}
	section, after := doc[i:], ""
	if j := strings.Index(section, "\n## "); j >= 0 {
		section, after = section[:j+1], section[j+1:]
	}
	return doc[:i] + after, section
}
