package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

var chartDir = filepath.Join(repoRoot, "charts", "nodecache")

// object is one decoded manifest: the typed object (strictly decoded) and its canonical JSON
// form as a generic map, for comparisons.
type object struct {
	Kind, Name, Namespace string
	Source                string // template file or kustomization
	Typed                 any
	Map                   map[string]any
}

func (o object) key() string { return o.Kind + "/" + o.Name }

// newTyped returns the k8s.io/api (or Prometheus Operator) type for apiVersion and kind; the
// chart and the examples may hold no other kind.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "batch/v1 Job":
		return &batchv1.Job{}, nil
	case "monitoring.coreos.com/v1 PodMonitor":
		return &monv1.PodMonitor{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monv1.ServiceMonitor{}, nil
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &monv1.PrometheusRule{}, nil
	}
	return nil, fmt.Errorf("unexpected object %s %s", apiVersion, kind)
}

// repoObjects decodes (decodeAll) the Kubernetes objects of the YAML file at rel in the checkout.
func repoObjects(t *testing.T, rel string) []object {
	t.Helper()
	objs, err := decodeAll(rel, readRepoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// decodeAll splits a multi-document YAML stream and decodes every document strictly: an unknown
// or duplicated field fails, as `kubectl apply --validate=strict` would.
func decodeAll(source string, data []byte) ([]object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := sigsyaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if head.Kind == "" && len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue // an empty document (a template that rendered nothing)
		}
		typed, err := newTyped(head.APIVersion, head.Kind)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if err := sigsyaml.UnmarshalStrict(doc, typed); err != nil {
			return nil, fmt.Errorf("%s: %s %s does not decode strictly: %w\n%s", source, head.APIVersion, head.Kind, err, doc)
		}
		canon, err := json.Marshal(typed)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(canon, &m); err != nil {
			return nil, err
		}
		meta, _ := m["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		ns, _ := meta["namespace"].(string)
		out = append(out, object{Kind: head.Kind, Name: name, Namespace: ns, Source: source, Typed: typed, Map: m})
	}
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for line := range strings.SplitSeq(string(doc), "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// monitoringAPIs are what a cluster with the Prometheus Operator serves.
var monitoringAPIs = []string{
	"monitoring.coreos.com/v1",
	"monitoring.coreos.com/v1/PodMonitor",
	"monitoring.coreos.com/v1/ServiceMonitor",
	"monitoring.coreos.com/v1/PrometheusRule",
}

// renderValues renders the chart as `helm install RELEASE -n NAMESPACE` would, in-process,
// with or without the monitoring CRDs among .Capabilities.APIVersions. The error is the schema's
// or a template's.
func renderValues(c *chart.Chart, release, namespace string, vals map[string]any, monitoring bool) ([]object, string, error) {
	caps := chartutil.DefaultCapabilities.Copy()
	if monitoring {
		caps.APIVersions = append(slices.Clone(caps.APIVersions), monitoringAPIs...)
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, "", err
	}
	files, err := engine.Render(c, rv)
	if err != nil {
		return nil, "", err
	}
	var objs []object
	var notes string
	for _, name := range slices.Sorted(maps.Keys(files)) {
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			notes = files[name]
		case strings.HasSuffix(name, ".yaml"):
			o, err := decodeAll(name, []byte(files[name]))
			if err != nil {
				return nil, "", err
			}
			objs = append(objs, o...)
		}
	}
	return objs, notes, nil
}

func render(t *testing.T, release string, vals map[string]any, monitoring bool) []object {
	t.Helper()
	objs, _, err := renderValues(loadChart(t), release, "nodecache", vals, monitoring)
	if err != nil {
		t.Fatalf("render %v (monitoring CRDs %v): %v", vals, monitoring, err)
	}
	return objs
}

// kustomizeBuild builds dir; "DIR+COMPONENT" builds DIR with its commented
// `# components: [COMPONENT]` line uncommented (the step its comments tell the user to take), in
// memory.
func kustomizeBuild(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	fs := filesys.MakeFsOnDisk()
	root := filepath.Join(repoRoot, dir)
	if base, component, ok := strings.Cut(dir, "+"); ok {
		fs, root = withComponent(t, base, component), "/"+base
	}
	rm, err := k.Run(fs, root)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	y, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(dir, y)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// vals builds a values map from YAML.
func vals(t *testing.T, y string) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := sigsyaml.Unmarshal([]byte(y), &m); err != nil {
		t.Fatalf("values %q: %v", y, err)
	}
	return m
}

// valueSets are the chart configurations every chart test renders.
var valueSets = []struct {
	name, release, values string
}{
	{"agent default", "nodecache", ``},
	{"agent custom", "edge", `
image: {tag: v0.1.1, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
port: 5001
upstreams: ["docker.io=https://registry-1.docker.io", "registry.local:5000=http://10.0.0.9:5000"]
extraArgs: ["--tag-ttl=5m", "--upstream-timeout=20s", "--log-level=debug"]
upstreamAuth: {secretName: hub-pull, upstreams: [docker.io]}
pullAllow: [10.0.0.0/8]
chain: http://10.0.0.5:5000
warm: {images: ["registry.k8s.io/pause:3.10.1", "nginx"]}
metrics: {port: 9500, labels: {release: kube-prometheus-stack}, interval: 15s}
agent:
  readiness: serving
  interval: 30s
  maxSize: 30GiB
  runtime: containerd
  cachePath: /data/nodecache
  tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]
  nodeSelector: {kubernetes.io/os: linux}
  podAnnotations: {team: platform}
`},
	{"agent no metrics", "nodecache", `metrics: {enabled: false}`},
	{"agent annotations forced", "nodecache", `metrics: {discovery: annotations, dashboard: {enabled: true}}`},
	{"agent monitor forced", "nodecache", `metrics: {discovery: monitor}`},
	{"agent discovery none", "nodecache", `metrics: {discovery: none, rules: {enabled: false}}`},
	{"shared default", "nodecache-shared", `mode: shared`},
	{"shared custom", "cache", `
mode: shared
upstreams: ["ghcr.io=https://ghcr.io", "docker.io=https://registry-1.docker.io"]
upstreamAuth: {secretName: regcred, upstreams: [ghcr.io, docker.io]}
pullAllow: [10.0.0.0/8, "fd00::/8"]
allow: [10.244.0.0/16]
maxSize: 180GiB
warm: {images: ["ghcr.io/siderolabs/kubelet:v1.35.0"], platform: linux/arm64, talos: true}
metrics: {dashboard: {enabled: true}}
shared:
  persistence: {size: 200Gi, storageClassName: fast}
  service: {type: LoadBalancer, annotations: {metallb.universe.tf/loadBalancerIPs: 10.0.0.5}}
  priorityClassName: system-cluster-critical
`},
	{"shared s3 regional", "nodecache-regional", `
mode: shared
shared:
  replicas: 3
  storage:
    type: s3
    s3: {secretName: nodecache-s3, bucket: cache, endpoint: "https://minio.storage:9000", pathStyle: true, rootDirectory: nodecache}
`},
	{"agent chained", "nodecache", `chain: "http://nodecache-regional.nodecache.svc.cluster.local:5000"`},
	{"agent peers", "nodecache", `peers: {enabled: true, keySecret: nodecache-peer-key}`},
	{"agent peers custom", "edge", `
peers: {enabled: true, keySecret: peer-key, port: 5101, refresh: 30s, dialTimeout: 500ms, clusterDomain: k8s.example}
upstreamAuth: {secretName: hub-pull, upstreams: [docker.io]}
metrics: {enabled: false}
`},
	{"shared s3 peers", "nodecache-regional", `
mode: shared
peers: {enabled: true, keySecret: nodecache-peer-key}
metrics: {dashboard: {enabled: true}}
shared:
  replicas: 3
  storage: {type: s3, s3: {secretName: nodecache-s3}}
`},
	{"cleanup after peers", "nodecache", `{mode: cleanup, peers: {enabled: true, keySecret: nodecache-peer-key}}`},
	{"cleanup default", "nodecache", `mode: cleanup`},
	{"cleanup after custom agent", "edge", `
mode: cleanup
upstreams: ["docker.io=https://registry-1.docker.io"]
warm: {images: [nginx]}
agent: {tolerations: [{operator: Exists}], nodeSelector: {kubernetes.io/os: linux}}
`},
}

// wantKinds is what each mode renders, by whether the monitoring CRDs are served and the
// discovery value.
func wantKinds(v map[string]any, monitoring bool) []string {
	mode, _ := v["mode"].(string)
	metrics, _ := v["metrics"].(map[string]any)
	enabled := metrics == nil || metrics["enabled"] != false
	discovery, _ := metrics["discovery"].(string)
	rules := true
	if r, ok := metrics["rules"].(map[string]any); ok && r["enabled"] == false {
		rules = false
	}
	dashboard := false
	if d, ok := metrics["dashboard"].(map[string]any); ok && d["enabled"] == true {
		dashboard = true
	}
	warm, _ := v["warm"].(map[string]any)
	peers, _ := v["peers"].(map[string]any)
	var kinds []string
	switch mode {
	case "cleanup":
		return []string{"DaemonSet"}
	case "shared":
		kinds = []string{"Deployment", "PersistentVolumeClaim", "Service"}
		if sh, ok := v["shared"].(map[string]any); ok {
			if st, ok := sh["storage"].(map[string]any); ok && st["type"] == "s3" {
				kinds = []string{"Deployment", "Service"} // the cache is the bucket
			}
		}
		if warm != nil {
			kinds = append(kinds, "Job")
		}
	default:
		kinds = []string{"DaemonSet"}
	}
	if peers["enabled"] == true {
		kinds = append(kinds, "Service") // the headless Service listing the members
	}
	monitor := "PodMonitor"
	if mode == "shared" {
		monitor = "ServiceMonitor"
	}
	if enabled && (discovery == "monitor" || (discovery == "" || discovery == "auto") && monitoring) {
		kinds = append(kinds, monitor)
	}
	if enabled && rules && monitoring {
		kinds = append(kinds, "PrometheusRule")
	}
	if enabled && dashboard {
		kinds = append(kinds, "ConfigMap")
	}
	sort.Strings(kinds)
	return kinds
}

// TestChartRender renders every value set with and without the monitoring CRDs: every object
// decodes strictly into its k8s.io/api or Prometheus Operator type, the kinds are the mode's,
// every object is in the release namespace, selectors select the pods they are for, and the
// metrics are discoverable exactly one way.
func TestChartRender(t *testing.T) {
	t.Parallel()
	for _, vs := range valueSets {
		for _, monitoring := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/monitoring=%v", vs.name, monitoring), func(t *testing.T) {
				t.Parallel()
				v := vals(t, vs.values)
				objs := render(t, vs.release, v, monitoring)
				var kinds []string
				for _, o := range objs {
					kinds = append(kinds, o.Kind)
					if o.Namespace != "nodecache" {
						t.Errorf("%s: namespace %q, want the release's", o.key(), o.Namespace)
					}
				}
				sort.Strings(kinds)
				if want := wantKinds(v, monitoring); !slices.Equal(kinds, want) {
					t.Fatalf("kinds %v, want %v", kinds, want)
				}
				checkSelectors(t, objs)
				checkMetricsDiscovery(t, v, objs)
			})
		}
	}
}

// podTemplates returns the pod templates of the workloads.
func podTemplates(objs []object) map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch w := o.Typed.(type) {
		case *appsv1.DaemonSet:
			out[o.key()] = &w.Spec.Template
		case *appsv1.Deployment:
			out[o.key()] = &w.Spec.Template
		case *batchv1.Job:
			out[o.key()] = &w.Spec.Template
		}
	}
	return out
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func hasPort(tpl *corev1.PodTemplateSpec, name string) bool {
	for _, c := range tpl.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// checkSelectors: workload selectors match their own pods; Services and monitors select a
// workload's pods, and the ports they name exist there.
func checkSelectors(t *testing.T, objs []object) {
	t.Helper()
	tpls := podTemplates(objs)
	selecting := func(sel map[string]string) []*corev1.PodTemplateSpec {
		var out []*corev1.PodTemplateSpec
		for _, tpl := range tpls {
			if selects(sel, tpl.Labels) {
				out = append(out, tpl)
			}
		}
		return out
	}
	for _, o := range objs {
		switch w := o.Typed.(type) {
		case *appsv1.DaemonSet:
			if !selects(w.Spec.Selector.MatchLabels, w.Spec.Template.Labels) {
				t.Errorf("%s: selector %v does not match its pod labels %v", o.key(), w.Spec.Selector.MatchLabels, w.Spec.Template.Labels)
			}
		case *appsv1.Deployment:
			if !selects(w.Spec.Selector.MatchLabels, w.Spec.Template.Labels) {
				t.Errorf("%s: selector %v does not match its pod labels %v", o.key(), w.Spec.Selector.MatchLabels, w.Spec.Template.Labels)
			}
			if a := w.Spec.Template.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
				for _, term := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
					if sel := term.PodAffinityTerm.LabelSelector; sel == nil || !selects(sel.MatchLabels, w.Spec.Template.Labels) {
						t.Errorf("%s: pod anti-affinity %v does not select its own pods %v", o.key(), sel, w.Spec.Template.Labels)
					}
				}
			}
		case *corev1.Service:
			pods := selecting(w.Spec.Selector)
			if len(pods) != 1 {
				t.Errorf("%s: selector %v matches %d workloads, want 1", o.key(), w.Spec.Selector, len(pods))
				continue
			}
			for _, p := range w.Spec.Ports {
				if !hasPort(pods[0], p.TargetPort.String()) {
					t.Errorf("%s: targetPort %s is not a port of the pods", o.key(), p.TargetPort.String())
				}
			}
		case *monv1.PodMonitor:
			pods := selecting(w.Spec.Selector.MatchLabels)
			if len(pods) != 1 {
				t.Errorf("%s: selector matches %d workloads, want 1", o.key(), len(pods))
				continue
			}
			for _, e := range w.Spec.PodMetricsEndpoints {
				if e.Port == nil || !hasPort(pods[0], *e.Port) {
					t.Errorf("%s: endpoint port %v is not a port of the pods", o.key(), e.Port)
				}
			}
		case *monv1.ServiceMonitor:
			var svc *corev1.Service
			for _, s := range objs {
				if s2, ok := s.Typed.(*corev1.Service); ok && selects(w.Spec.Selector.MatchLabels, s2.Labels) {
					svc = s2
				}
			}
			if svc == nil {
				t.Errorf("%s: selects no Service", o.key())
				continue
			}
			for _, e := range w.Spec.Endpoints {
				if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port }) {
					t.Errorf("%s: endpoint port %q is not a port of Service %s", o.key(), e.Port, svc.Name)
				}
			}
		}
	}
}

// checkMetricsDiscovery: with metrics on, exactly one of a monitor object or prometheus.io pod
// annotations (unless discovery is none); the scrape port is the metrics listener.
func checkMetricsDiscovery(t *testing.T, v map[string]any, objs []object) {
	t.Helper()
	if v["mode"] == "cleanup" {
		return
	}
	monitors, annotated := 0, 0
	for _, o := range objs {
		switch o.Kind {
		case "PodMonitor", "ServiceMonitor":
			monitors++
		case "DaemonSet", "Deployment":
			tpl := podTemplates([]object{o})[o.key()]
			if tpl.Annotations["prometheus.io/scrape"] == "true" {
				annotated++
				port := tpl.Annotations["prometheus.io/port"]
				if !slices.ContainsFunc(tpl.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool {
					return p.Name == "metrics" && fmt.Sprint(p.ContainerPort) == port
				}) {
					t.Errorf("%s: prometheus.io/port %q is not the metrics port", o.key(), port)
				}
			}
		}
	}
	metrics, _ := v["metrics"].(map[string]any)
	switch {
	case metrics["enabled"] == false || metrics["discovery"] == "none":
		if monitors+annotated != 0 {
			t.Errorf("metrics off or discovery none: %d monitors, %d annotated workloads, want none", monitors, annotated)
		}
	case monitors+annotated != 1:
		t.Errorf("%d monitors and %d annotated workloads: want exactly one way to scrape", monitors, annotated)
	}
}

// helmLabels are Helm's own labels, absent from the kustomize examples.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// stripHelmLabels removes helmLabels from every labels, matchLabels and selector map.
func stripHelmLabels(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if m, ok := val.(map[string]any); ok && (k == "labels" || k == "matchLabels" || k == "selector") {
				for _, l := range helmLabels {
					delete(m, l)
				}
			}
			stripHelmLabels(val)
		}
	case []any:
		for _, e := range x {
			stripHelmLabels(e)
		}
	}
}

// TestChartEqualsKustomize: with default values, the chart's objects are the kustomize build's
// (sigs.k8s.io/kustomize/api krusty, in-process), ignoring Helm's own labels and the Namespace
// (`helm install --create-namespace` makes it): agent = examples/kubernetes, shared =
// examples/kubernetes/shared, cleanup = examples/kubernetes/cleanup; with peers.enabled and peers.keySecret=nodecache-peer-key,
// agent = examples/kubernetes with its component peers (issue 22).
func TestChartEqualsKustomize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dir, release, values string }{
		{"examples/kubernetes", "nodecache", ``},
		{"examples/kubernetes/shared", "nodecache-shared", `mode: shared`},
		{"examples/kubernetes/cleanup", "nodecache", `mode: cleanup`},
		{"examples/kubernetes+peers", "nodecache", `peers: {enabled: true, keySecret: nodecache-peer-key}`},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			t.Parallel()
			want := map[string]map[string]any{}
			for _, o := range kustomizeBuild(t, tc.dir) {
				if o.Kind == "Namespace" {
					if o.Name != "nodecache" {
						t.Errorf("namespace %q, want nodecache", o.Name)
					}
					continue
				}
				want[o.key()] = o.Map
			}
			got := map[string]map[string]any{}
			for _, o := range render(t, tc.release, vals(t, tc.values), false) {
				stripHelmLabels(o.Map)
				got[o.key()] = o.Map
			}
			if len(want) == 0 {
				t.Fatal("kustomize built no objects")
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("chart (+) differs from kustomize build (-):\n%s", d)
			}
		})
	}
}

// containers returns every container and init container of every workload.
func containers(objs []object) map[string]corev1.Container {
	out := map[string]corev1.Container{}
	for key, tpl := range podTemplates(objs) {
		for _, c := range tpl.Spec.InitContainers {
			out[key+"/init:"+c.Name] = c
		}
		for _, c := range tpl.Spec.Containers {
			out[key+"/"+c.Name] = c
		}
	}
	return out
}

// allManifests: every value set rendered both ways, the kustomize builds and the warm Job example.
func allManifests(t *testing.T) map[string][]object {
	t.Helper()
	out := map[string][]object{}
	for _, vs := range valueSets {
		for _, monitoring := range []bool{false, true} {
			out[fmt.Sprintf("chart %s monitoring=%v", vs.name, monitoring)] = render(t, vs.release, vals(t, vs.values), monitoring)
		}
	}
	for _, dir := range []string{"examples/kubernetes", "examples/kubernetes/shared", "examples/kubernetes/cleanup", "examples/kubernetes/regional", "examples/kubernetes+peers"} {
		out[dir] = kustomizeBuild(t, dir)
	}
	out["examples/kubernetes/warm-job.yaml"] = repoObjects(t, "examples/kubernetes/warm-job.yaml")
	return out
}

var (
	nodecacheImage = regexp.MustCompile(`^ghcr\.io/nodecache/nodecache:v[0-9]+\.[0-9]+\.[0-9]+$`)
	pauseImage     = regexp.MustCompile(`^registry\.k8s\.io/pause:[0-9.]+$`)
	// restartWords are what a container that restarts or signals the runtime would carry.
	restartWords = regexp.MustCompile(`(?i)restart|systemctl|service |nsenter|kill|crictl|ctr |reboot|/bin/sh|bash`)
)

// TestNoRuntimeRestart: no object anywhere restarts the node's runtime. Every container runs
// the nodecache image with its entrypoint (no command override, no shell, no lifecycle hook)
// as agent, serve, warm or gen … --remove, or the idle pause image; none is privileged; no
// argument names a restart or a signal; only the agent and cleanup may SIGHUP CRI-O (gen crio,
// KILL), never containerd.
func TestNoRuntimeRestart(t *testing.T) {
	t.Parallel()
	checked := 0
	for src, objs := range allManifests(t) {
		for name, c := range containers(objs) {
			checked++
			where := src + ": " + name
			if len(c.Command) > 0 {
				t.Errorf("%s: command %v overrides the image's entrypoint", where, c.Command)
			}
			if c.Lifecycle != nil {
				t.Errorf("%s: lifecycle hooks %+v", where, c.Lifecycle)
			}
			if sc := c.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
				t.Errorf("%s: privileged", where)
			}
			for _, a := range c.Args {
				if restartWords.MatchString(a) {
					t.Errorf("%s: argument %q", where, a)
				}
			}
			switch {
			case pauseImage.MatchString(c.Image):
				if len(c.Args) != 0 {
					t.Errorf("%s: pause with arguments %v", where, c.Args)
				}
			case nodecacheImage.MatchString(c.Image):
				if len(c.Args) == 0 {
					t.Errorf("%s: no nodecache command", where)
					continue
				}
				switch c.Args[0] {
				case "agent", "serve", "warm":
				case "gen":
					if !slices.Contains(c.Args, "--remove") {
						t.Errorf("%s: gen without --remove outside the agent: %v", where, c.Args)
					}
				default:
					t.Errorf("%s: nodecache %s", where, c.Args[0])
				}
			default:
				t.Errorf("%s: image %q is neither a pinned nodecache release nor pause", where, c.Image)
			}
		}
	}
	if checked < 30 {
		t.Fatalf("checked only %d containers", checked)
	}
}

// expandArgs substitutes $(VAR) in args as the kubelet does, from the container's env; a
// downward-API field gets a sample value.
func expandArgs(c corev1.Container) []string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP":
			env[e.Name] = "10.1.2.3"
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = "fd00:10:244::7"
		case e.ValueFrom != nil:
			env[e.Name] = "sample"
		default:
			env[e.Name] = e.Value
		}
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = ref.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	return out
}

// withHelp inserts --help after the command words (`agent`, `gen crio`) and drops the operands
// after the flags (warm's images: urfave/cli would read them as a help topic): the binary then
// parses every flag — an unknown flag, or a value its type refuses, exits 2 — and prints help
// instead of running.
func withHelp(args []string) []string {
	n := 1
	if len(args) > 1 && args[0] == "gen" {
		n = 2
	}
	out := append(slices.Clone(args[:n]), "--help")
	for _, a := range args[n:] {
		if !strings.HasPrefix(a, "-") {
			break
		}
		out = append(out, a)
	}
	return out
}

// TestRenderedArgsAccepted: every nodecache argument any manifest renders is accepted by the
// current binary's flag set (kubelet's $(VAR) expansion applied), so the chart never passes a
// flag that this nodecache refuses. It also checks the check: an unknown flag is refused.
func TestRenderedArgsAccepted(t *testing.T) {
	t.Parallel()
	if out, err := exec.Command(binary, withHelp([]string{"agent", "--max-size-not-a-flag=1"})...).CombinedOutput(); err == nil {
		t.Fatalf("an unknown flag was accepted with --help, so this check cannot fail:\n%s", out)
	}
	seen := map[string]bool{}
	for src, objs := range allManifests(t) {
		for name, c := range containers(objs) {
			if !nodecacheImage.MatchString(c.Image) {
				continue
			}
			args := expandArgs(c)
			key := strings.Join(args, "\x00")
			if seen[key] {
				continue
			}
			seen[key] = true
			for _, a := range args {
				if strings.Contains(a, "$(") {
					t.Errorf("%s: %s: %q refers to a variable the container does not define", src, name, a)
				}
			}
			out, err := exec.CommandContext(t.Context(), binary, withHelp(args)...).CombinedOutput()
			if err != nil {
				t.Errorf("%s: %s: nodecache %s refused: %v\n%s", src, name, strings.Join(args, " "), err, out)
			}
		}
	}
	if len(seen) < 8 {
		t.Fatalf("checked only %d distinct argument lists", len(seen))
	}
}

// TestWarmJobTargetsSharedService: the warm Job example and the chart's warm Job name, in
// --mirror, a Service that the shared cache's manifests define, on its registry port.
func TestWarmJobTargetsSharedService(t *testing.T) {
	t.Parallel()
	example := repoObjects(t, "examples/kubernetes/warm-job.yaml")
	chartShared := render(t, "cache", vals(t, `{mode: shared, allow: [10.244.0.0/16], warm: {images: [nginx]}}`), false)
	for name, tc := range map[string]struct{ jobs, services []object }{
		"examples":    {example, kustomizeBuild(t, "examples/kubernetes/shared")},
		"chart cache": {chartShared, chartShared},
	} {
		var mirror string
		for _, c := range containers(tc.jobs) {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--mirror="); ok {
					mirror = v
				}
			}
		}
		m := regexp.MustCompile(`^http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(\.cluster\.local)?:([0-9]+)$`).FindStringSubmatch(mirror)
		if m == nil {
			t.Errorf("%s: --mirror %q is not http://SERVICE.NAMESPACE.svc[.cluster.local]:PORT", name, mirror)
			continue
		}
		found := false
		for _, o := range tc.services {
			svc, ok := o.Typed.(*corev1.Service)
			if !ok || svc.Name != m[1] || svc.Namespace != m[2] {
				continue
			}
			for _, p := range svc.Spec.Ports {
				found = found || (fmt.Sprint(p.Port) == m[4] && p.Name == "registry")
			}
		}
		if !found {
			t.Errorf("%s: --mirror %s names no Service registry port of the shared cache", name, mirror)
		}
	}
}

// TestUpstreamAuthMounted: with upstreamAuth, every nodecache that serves (agent, serve) gets one
// --upstream-auth per named upstream, pointing at the .dockerconfigjson key of the Secret that
// is mounted read-only there; half a configuration is refused with a message. (The shared mode
// needs pullAllow with it: TestChartSharedCredentialsNeedPullAllow.)
func TestUpstreamAuthMounted(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"agent", "shared"} {
		objs := render(t, "nodecache", vals(t, "{mode: "+mode+", upstreamAuth: {secretName: regcred, upstreams: [docker.io, ghcr.io]}, pullAllow: [10.0.0.0/16]}"), false)
		for key, tpl := range podTemplates(objs) {
			var mountPath string
			for _, v := range tpl.Spec.Volumes {
				if v.Secret != nil && v.Secret.SecretName == "regcred" {
					for _, m := range tpl.Spec.Containers[0].VolumeMounts {
						if m.Name == v.Name && m.ReadOnly {
							mountPath = m.MountPath
						}
					}
				}
			}
			if mountPath == "" {
				t.Errorf("%s %s: Secret regcred not mounted read-only", mode, key)
				continue
			}
			var got []string
			for _, a := range tpl.Spec.Containers[0].Args {
				if v, ok := strings.CutPrefix(a, "--upstream-auth="); ok {
					got = append(got, v)
				}
			}
			want := []string{"docker.io=" + mountPath + "/.dockerconfigjson", "ghcr.io=" + mountPath + "/.dockerconfigjson"}
			if !slices.Equal(got, want) {
				t.Errorf("%s %s: --upstream-auth %v, want %v", mode, key, got, want)
			}
		}
	}
	c := loadChart(t)
	for _, half := range []string{`upstreamAuth: {secretName: regcred}`, `upstreamAuth: {upstreams: [docker.io]}`} {
		if _, _, err := renderValues(c, "nodecache", "nodecache", vals(t, half), false); err == nil || !strings.Contains(err.Error(), "upstreamAuth") {
			t.Errorf("%s: %v, want a refusal naming upstreamAuth", half, err)
		}
	}
}

// TestChartSharedCredentialsNeedPullAllow (issue 20, item 3): mode=shared with upstreamAuth and no
// pullAllow fails to render (helm's fail, so `helm install` stops before anything is created)
// with a message naming the risk — anyone who reaches the Service reads what the credentials
// can — and the fix, pullAllow with the nodes' CIDRs; with pullAllow it renders, serve gets
// --pull-allow. The agent (on the node's 127.0.0.1 only) and shared without credentials render
// without pullAllow.
func TestChartSharedCredentialsNeedPullAllow(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	const auth = "upstreamAuth: {secretName: regcred, upstreams: [docker.io]}"
	for _, values := range []string{"{mode: shared, " + auth + "}", "{mode: shared, " + auth + ", pullAllow: []}",
		"{mode: shared, " + auth + ", shared: {replicas: 2, storage: {type: s3}}}"} {
		_, _, err := renderValues(c, "cache", "nodecache", vals(t, values), false)
		if err == nil {
			t.Errorf("%s rendered; want a refusal", values)
			continue
		}
		for _, want := range []string{"mode=shared with upstreamAuth and an empty pullAllow is refused",
			"anyone who can reach the Service", "read every image the upstreamAuth credentials can read",
			"Set pullAllow to the CIDRs of the nodes"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v\nwant it to say %q", values, err, want)
			}
		}
	}
	for _, values := range []string{"{mode: shared, " + auth + ", pullAllow: [10.0.0.0/16, \"fd00::/8\"]}",
		"{mode: agent, " + auth + "}", "{mode: shared}"} {
		objs, _, err := renderValues(c, "cache", "nodecache", vals(t, values), false)
		if err != nil {
			t.Errorf("%s: %v; want it rendered", values, err)
			continue
		}
		if !strings.Contains(values, "pullAllow") {
			continue
		}
		var args []string
		for _, tpl := range podTemplates(objs) {
			args = append(args, tpl.Spec.Containers[0].Args...)
		}
		if !slices.Contains(args, "--pull-allow=10.0.0.0/16") || !slices.Contains(args, "--pull-allow=fd00::/8") {
			t.Errorf("%s: serve's args %q lack --pull-allow for both networks", values, args)
		}
	}
}

// TestChartWarmJobPins (issue 24): the shared mode's warm Job pins what it warms (warm --pin), and
// serve accepts pins from loopback and its --allow networks only, so warm.images without allow
// fails to render, naming allow and warm.pin=false; with allow serve gets --allow and the Job
// --pin; warm.pin=false renders a Job without --pin and needs no allow. allow reaches the
// agent's flags too. The shared cache's `helm install` of docs/deploy.md, as written, renders.
func TestChartWarmJobPins(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	const section = "## Kubernetes: a shared cache"
	for _, in := range docHelmInstalls(t, "docs/deploy.md", section) {
		if _, _, err := renderValues(c, in.release, in.namespace, in.values, false); err != nil {
			t.Errorf("docs/deploy.md %q: %q: %v", section, in.line, err)
		}
	}
	for _, values := range []string{"{mode: shared, warm: {images: [nginx]}}", "{mode: shared, allow: [], warm: {talos: true}}"} {
		_, _, err := renderValues(c, "cache", "nodecache", vals(t, values), false)
		if err == nil || !strings.Contains(err.Error(), "the warm Job pins what it warms (nodecache warm --pin)") ||
			!strings.Contains(err.Error(), "--set 'allow={10.244.0.0/16}'") || !strings.Contains(err.Error(), "--set warm.pin=false") {
			t.Errorf("%s: %v; want a refusal naming allow and warm.pin=false", values, err)
		}
	}
	for _, tc := range []struct {
		values       string
		pin, allowed bool
	}{
		{"{mode: shared, allow: [10.244.0.0/16, \"fd00::/8\"], warm: {images: [nginx]}}", true, true},
		{"{mode: shared, warm: {images: [nginx], pin: false}}", false, false},
		{"{mode: agent, allow: [10.244.0.0/16, \"fd00::/8\"], warm: {images: [nginx]}}", false, true},
	} {
		objs, _, err := renderValues(c, "cache", "nodecache", vals(t, tc.values), false)
		if err != nil {
			t.Errorf("%s: %v; want it rendered", tc.values, err)
			continue
		}
		var serveArgs, warmArgs []string
		for key, ctr := range containers(objs) {
			if strings.HasPrefix(key, "Job/") {
				warmArgs = append(warmArgs, ctr.Args...)
			} else {
				serveArgs = append(serveArgs, ctr.Args...)
			}
		}
		if got := slices.Contains(warmArgs, "--pin"); got != tc.pin {
			t.Errorf("%s: warm Job args %q: --pin %v, want %v", tc.values, warmArgs, got, tc.pin)
		}
		if got := slices.Contains(serveArgs, "--allow=10.244.0.0/16") && slices.Contains(serveArgs, "--allow=fd00::/8"); got != tc.allowed {
			t.Errorf("%s: serve's args %q: --allow for both networks %v, want %v", tc.values, serveArgs, got, tc.allowed)
		}
	}
}

// TestSharedS3Spread: a shared tier on s3 (replicas share the bucket) rolls out with no replica
// missing (maxUnavailable 0, maxSurge 1) and prefers one replica per node unless shared.affinity
// is given, which replaces that; a filesystem tier (one ReadWriteOnce owner) is recreated and
// gets no affinity of its own.
func TestSharedS3Spread(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, values, strategy, affinity string
	}{
		{"s3 default", `{mode: shared, shared: {replicas: 2, storage: {type: s3}}}`,
			`{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":0,"maxSurge":1}}`,
			`{"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":100,"podAffinityTerm":{"labelSelector":{"matchLabels":{"app.kubernetes.io/component":"shared","app.kubernetes.io/instance":"tier","app.kubernetes.io/name":"nodecache"}},"topologyKey":"kubernetes.io/hostname"}}]}}`},
		{"s3 affinity given", `{mode: shared, shared: {replicas: 3, storage: {type: s3}, affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}}}`,
			`{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":0,"maxSurge":1}}`,
			`{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}}`},
		{"filesystem", `{mode: shared}`, `{"type":"Recreate"}`, `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var dep *appsv1.Deployment
			for _, o := range render(t, "tier", vals(t, tc.values), false) {
				if d, ok := o.Typed.(*appsv1.Deployment); ok {
					dep = d
				}
			}
			if dep == nil {
				t.Fatal("no Deployment rendered")
			}
			for _, f := range []struct {
				what string
				got  any
				want string
			}{{"strategy", dep.Spec.Strategy, tc.strategy}, {"affinity", dep.Spec.Template.Spec.Affinity, tc.affinity}} {
				got, err := json.Marshal(f.got)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(jsonValue(t, f.want), jsonValue(t, string(got))); d != "" {
					t.Errorf("%s (-want +got):\n%s", f.what, d)
				}
			}
		})
	}
}

func jsonValue(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}
