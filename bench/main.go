// Command bench measures nodecache against distribution's stock pull-through proxy (v3.1.2) on
// loopback and writes a Markdown table (bench/RESULTS.md via `make bench`).
//
// The upstream is distribution's registry (the library, in this process, filesystem storage);
// nodecache, the stock proxy and a plain Go file server run as separate processes. Scenarios:
// 20/50/200 concurrent cold pulls of one 64 MiB blob, warm GET throughput, a 200 MiB blob through
// an upstream throttled to 4 MiB/s that resets every connection after 8 MiB (toxiproxy), start-up
// over 100,000 cached blobs, eviction of 10 GiB with --max-size, and a cluster of 10 nodes (each on
// its own loopback address) pulling a 200 MiB image at once through an upstream limited to 20 MiB/s
// in total: stock proxies, nodecache, nodecache with --peers. A scenario that does not fit on the
// free disk is skipped with the reason in the table.
//
// -only cluster (make bench BENCH_ONLY=cluster) runs the cluster scenario alone and rewrites only its
// section of the results file; -cluster-mib shrinks its image for a quick try.
//
// It is not run in CI (minutes, GiBs of loopback traffic); `make lint` vets it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if len(os.Args) == 4 && os.Args[1] == "fileserve" {
		if err := fileServe(os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, "fileserve:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.nodecache, "nodecache", "bin/nodecache", "built nodecache binary")
	flag.StringVar(&o.registry, "registry", "", "distribution registry v3.1.2 binary (the stock proxy)")
	flag.StringVar(&o.out, "out", "bench/RESULTS.md", "Markdown results file")
	flag.StringVar(&o.work, "work", "", "work directory (default: a new one in $TMPDIR, removed at the end)")
	flag.StringVar(&o.startupDir, "startup-dir", defaultStartupDir(), "directory for the 100,000-blob start-up layout (default: /dev/shm when it is a directory, else the work directory)")
	flag.StringVar(&o.commit, "commit", "unknown", "commit measured")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "bound on the whole run")
	only := flag.String("only", "cold,restart,throttled,startup,evict,cluster", "comma-separated scenarios to run, of cold (which includes warm), warm (warm throughput alone), restart (first serve after a restart), throttled, startup, evict, cluster (for trying one out; the committed table runs all). The results file keeps the cluster section of an earlier run when cluster is not run, and only the cluster section is rewritten when it alone runs")
	clusterMiB := flag.Int64("cluster-mib", 200, "size of the cluster scenario's image in MiB, in 4 equal layers (shrink it for a quick try)")
	flag.StringVar(&o.before, "before", "", "an earlier nodecache binary the restart scenario measures too (make bench BENCH_BEFORE=<git ref> builds one)")
	flag.StringVar(&o.beforeLabel, "before-label", "", "what -before was built from, for the table (default: its file name)")
	flag.Parse()
	if o.registry == "" || flag.NArg() != 0 || *clusterMiB < 4 {
		fmt.Fprintln(os.Stderr, "usage: bench -registry PATH [-nodecache PATH] [-out FILE] [-commit SHA] [-only cold,warm,restart,throttled,startup,evict,cluster] [-before PATH [-before-label REF]] [-cluster-mib 200]")
		os.Exit(2)
	}
	o.clusterLayer = *clusterMiB * mib / clusterLayers
	o.only = map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		o.only[strings.TrimSpace(s)] = true
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	nodecache, registry, out, work, commit string
	before, beforeLabel                    string
	startupDir                             string
	timeout                                time.Duration
	only                                   map[string]bool
	clusterLayer                           int64
}

func run(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("own executable: %w", err)
	}
	if o.before != "" && o.beforeLabel == "" {
		o.beforeLabel = filepath.Base(o.before)
	}
	for _, p := range []*string{&o.nodecache, &o.registry, &o.out} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if o.before != "" {
		if o.before, err = filepath.Abs(o.before); err != nil {
			return err
		}
	}
	for _, b := range []string{o.nodecache, o.registry, o.before} {
		if b == "" {
			continue
		}
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("binary: %w", err)
		}
	}
	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "nodecache-bench-"); err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
		defer os.RemoveAll(work)
	}
	logDir := filepath.Join(work, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return fmt.Errorf("log directory: %w", err)
	}
	b := &bench{
		ctx: ctx, work: work, only: o.only, startupDir: o.startupDir, clusterLayer: o.clusterLayer,
		before: o.before, beforeLabel: o.beforeLabel,
		srv: servers{nodecache: o.nodecache, registry: o.registry, self: self, logDir: logDir},
		res: &results{commit: o.commit, started: time.Now(), machine: machineInfo(),
			cold: map[string][]*coldRun{}, warm: map[string]float64{}, throttled: map[string]*throttledRun{},
			cluster: &clusterResults{}},
	}
	defer b.stopAll()
	b.res.loadBefore = loadAvg()
	runErr := b.all()
	b.res.loadAfter = loadAvg()
	b.res.elapsed = time.Since(b.res.started)
	if runErr != nil {
		b.res.notes = append(b.res.notes, "run stopped early: "+runErr.Error())
	}
	md := compose(o.out, b.res.markdown(), b.res.cluster.markdown(o.commit, b.res.machine), o.only)
	if err := writeAtomic(o.out, []byte(md)); err != nil {
		return err
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "bench: wrote %s in %s\n", o.out, b.res.elapsed.Round(time.Second))
	return runErr
}

// compose is the results file: the main sections (everything but the cluster scenario) and the
// cluster section, each from this run when one of its scenarios ran, else kept from the file
// already at path (so `-only cluster` does not wipe the other tables, nor the others the cluster's).
func compose(path, main, cluster string, only map[string]bool) string {
	old, _ := os.ReadFile(path)
	oldMain, oldCluster := splitCluster(string(old))
	ranMain := only["cold"] || only["warm"] || only["restart"] || only["throttled"] || only["startup"] || only["evict"]
	if !ranMain && strings.TrimSpace(oldMain) != "" {
		main = oldMain
	}
	if !only["cluster"] && oldCluster != "" {
		cluster = oldCluster
	}
	return strings.TrimRight(main, "\n") + "\n\n" + strings.TrimRight(cluster, "\n") + "\n"
}

// writeAtomic writes data to path through a temporary file in the same directory.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".results-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func defaultStartupDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}
