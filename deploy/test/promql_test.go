package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	sigsyaml "sigs.k8s.io/yaml"
)

// targetLabels are added by Prometheus (or the chart's PodMonitor relabeling) at scrape time.
var targetLabels = []string{"instance", "job", "node", "namespace", "pod", "container", "service", "endpoint"}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeRunningNodecache starts the real nodecache agent (its registry serves the same metrics as
// serve, plus the activation gauge; --metrics-listen in the chart's [HOST]:PORT form) in front of a real registry on loopback
// (go-containerregistry's), pulls an image through it twice (a miss, then hits) and returns
// the label names of every series /metrics then exposes, by series name (histograms expanded
// to _bucket, _sum and _count).
func scrapeRunningNodecache(t *testing.T) map[string][]string {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	// Its manifest answers carry Docker Hub's rate limit header, so the rate limit gauge is
	// exposed too.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			w.Header().Set("RateLimit-Remaining", "97;w=21600")
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(upstream.Close)
	src, err := name.ParseReference(strings.TrimPrefix(upstream.URL, "http://")+"/team/app:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(256<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(src, img, remote.WithContext(t.Context())); err != nil {
		t.Fatalf("push to the upstream: %v", err)
	}

	listen, metricsListen := freePort(t), freePort(t)
	host := t.TempDir()
	writeFile(t, filepath.Join(host, "etc/containerd/config.toml"), "version = 3\n")
	// --peers names one member that does not answer (a closed port), so nodecache_peers is
	// exposed (failed 1, live 0) and every pull falls back to the upstream.
	keyFile := filepath.Join(t.TempDir(), "peer-key")
	writeFile(t, keyFile, strings.Repeat("0123456789abcdef", 4)+"\n")
	cmd := exec.CommandContext(t.Context(), binary, "agent",
		"--host-root", host, "--runtime", "containerd",
		"--root", t.TempDir(), "--listen", listen, "--metrics-listen", bracketed(t, metricsListen),
		"--interval", "1s", "--upstream", "registry.test="+upstream.URL,
		"--peers", freePort(t), "--peer-key-file", keyFile)
	cmd.Env = append(os.Environ(), "NODECACHE_LOG_FORMAT=json")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("nodecache agent log:\n%s", out.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + listen + "/v2/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodecache did not answer on %s: %v", listen, err)
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("nodecache agent exited: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	through, err := name.ParseReference(listen+"/registry.test/team/app:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		pulled, err := remote.Image(through, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatalf("pull through nodecache: %v", err)
		}
		layers, err := pulled.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, rc); err != nil {
				t.Fatalf("layer through nodecache: %v", err)
			}
			rc.Close()
		}
	}
	// A manifest the upstream does not have: a failed upstream fetch.
	missing, _ := name.ParseReference(listen+"/registry.test/team/missing:v1", name.Insecure)
	if _, err := remote.Head(missing, remote.WithContext(t.Context())); err == nil {
		t.Fatal("a missing image was found")
	}

	// Client evidence stays on the registry listener (loopback and --allow): the metrics
	// listener, which the chart puts on the node's address, does not serve it.
	if resp, err := http.Get("http://" + metricsListen + "/nodecache/v1/clients"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("metrics listener /nodecache/v1/clients: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}

	var families map[string]*dto.MetricFamily
	for {
		resp, err := http.Get("http://" + metricsListen + "/metrics")
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		families, err = p.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("parse /metrics: %v", err)
		}
		// The agent's first activation check runs once it listens.
		if _, ok := families["nodecache_runtime_config_active"]; ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	series := map[string][]string{}
	for fname, f := range families {
		var labelNames []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labelNames, l.GetName()) {
					labelNames = append(labelNames, l.GetName())
				}
			}
		}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			series[fname+"_bucket"] = append(slices.Clone(labelNames), "le")
			series[fname+"_sum"] = labelNames
			series[fname+"_count"] = labelNames
		case dto.MetricType_SUMMARY:
			series[fname] = append(slices.Clone(labelNames), "quantile")
			series[fname+"_sum"] = labelNames
			series[fname+"_count"] = labelNames
		default:
			series[fname] = labelNames
		}
	}
	return series
}

// grafanaVars are the dashboard's variables with values Grafana could give them.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "1m",
	"$__range", "6h",
	"${instance}", ".*",
	"$instance", ".*",
)

// queries returns every PromQL expression of the dashboard and the alert rules, by where it is.
func queries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	raw, err := os.ReadFile(filepath.Join(chartDir, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	for _, p := range dash.Panels {
		if p.Type != "text" && len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for i, q := range p.Targets {
			out[fmt.Sprintf("dashboard %q target %d", p.Title, i)] = grafanaVars.Replace(q.Expr)
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("dashboard variable %q: query %q is not label_values(metric, label)", v.Name, s)
			continue
		}
		// label_values(metric, label) asks for label on metric's series: the same as by (label).
		out[fmt.Sprintf("dashboard variable %q", v.Name)] = fmt.Sprintf("count by (%s) (%s)", m[2], m[1])
	}

	raw, err = os.ReadFile(filepath.Join(chartDir, "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := sigsyaml.UnmarshalStrict(raw, &rules); err != nil {
		t.Fatalf("alerts.yaml is not a Prometheus rule file: %v", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %q: want a name, a severity label and a summary", r.Alert)
			}
			if _, err := model.ParseDuration(r.For); err != nil {
				t.Errorf("alert %q: for %q: %v", r.Alert, r.For, err)
			}
			out[fmt.Sprintf("alert %q", r.Alert)] = r.Expr
		}
	}
	return out
}

// TestPromQL: every PromQL expression of the dashboard and the alerts parses
// (prometheus/promql/parser), and every metric it selects is one a running nodecache exposes,
// with the labels it filters and groups by.
func TestPromQL(t *testing.T) {
	t.Parallel()
	series := scrapeRunningNodecache(t)
	for _, must := range []string{"nodecache_requests_total", "nodecache_served_bytes_total", "nodecache_upstream_fetched_bytes_total", "nodecache_runtime_config_active", "nodecache_cache_size_bytes", "nodecache_evictions_total", "nodecache_upstream_resumes_total", "nodecache_digest_mismatches_total", "nodecache_peers",
		"nodecache_upstream_failures_total", "nodecache_upstream_last_success_timestamp_seconds", "nodecache_upstream_ratelimit_remaining"} {
		if _, ok := series[must]; !ok {
			t.Fatalf("the running nodecache exposes no %s after pulls: the check below would be too weak; exposed: %v", must, slices.Sorted(maps.Keys(series)))
		}
	}
	p := parser.NewParser(parser.Options{})
	qs := queries(t)
	if len(qs) < 10 {
		t.Fatalf("only %d expressions found", len(qs))
	}
	known := func(metric, label string) bool {
		return slices.Contains(series[metric], label) || slices.Contains(targetLabels, label)
	}
	for where, q := range qs {
		expr, err := p.ParseExpr(q)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, q, err)
			continue
		}
		var metrics []string
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				if vs.Name == "" {
					t.Errorf("%s: selector %s names no metric", where, vs)
					return nil
				}
				metrics = append(metrics, vs.Name)
				if _, ok := series[vs.Name]; !ok {
					t.Errorf("%s: %s is not exposed by nodecache (exposed: %v)", where, vs.Name, slices.Sorted(maps.Keys(series)))
					return nil
				}
				for _, m := range vs.LabelMatchers {
					if m.Name != model.MetricNameLabel && !known(vs.Name, m.Name) {
						t.Errorf("%s: %s has no label %q (has %v)", where, vs.Name, m.Name, series[vs.Name])
					}
				}
			}
			return nil
		})
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if ag, ok := n.(*parser.AggregateExpr); ok && !ag.Without {
				for _, l := range ag.Grouping {
					if !slices.ContainsFunc(metrics, func(m string) bool { return known(m, l) }) {
						t.Errorf("%s: groups by %q, a label none of %v has", where, l, metrics)
					}
				}
			}
			return nil
		})
	}
}

// bracketed writes a listen address as the chart does, [HOST]:PORT (so an IPv6 node address
// works too).
func bracketed(t *testing.T, addr string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return "[" + host + "]:" + port
}
