package test

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestChartPeers (issue 22): with peers.enabled the chart renders a headless Service over the
// workload's pods (only Ready ones published) on the peer port, and the agent (node address,
// [$(HOST_IP)] as --metrics-listen) or serve (pod address, $(POD_IP) from status.podIP) gets
// --peers=dns:<that Service>:<port>, --peer-listen, and --peer-key-file in the key's Secret,
// mounted read-only; the container declares the peer port. Without peers.keySecret rendering
// fails saying how to create the Secret; with peers off nothing of it is rendered.
func TestChartPeers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, release, values                 string
		service, dns, listen, secret, envPath string
		port                                  int32
	}{
		{"agent", "nodecache", `peers: {enabled: true, keySecret: nodecache-peer-key}`,
			"nodecache-peers", "dns:nodecache-peers.nodecache.svc.cluster.local:5001", "[$(HOST_IP)]:5001", "nodecache-peer-key", "status.hostIP", 5001},
		{"agent custom", "edge", `peers: {enabled: true, keySecret: k, port: 5101, refresh: 30s, dialTimeout: 500ms, clusterDomain: k8s.example}`,
			"edge-nodecache-peers", "dns:edge-nodecache-peers.nodecache.svc.k8s.example:5101", "[$(HOST_IP)]:5101", "k", "status.hostIP", 5101},
		{"shared", "nodecache-regional", `{mode: shared, peers: {enabled: true, keySecret: nodecache-peer-key}, shared: {replicas: 3, storage: {type: s3}}}`,
			"nodecache-regional-peers", "dns:nodecache-regional-peers.nodecache.svc.cluster.local:5001", "[$(POD_IP)]:5001", "nodecache-peer-key", "status.podIP", 5001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, tc.release, vals(t, tc.values), true)
			var svc *corev1.Service
			for _, o := range objs {
				if s, ok := o.Typed.(*corev1.Service); ok && s.Name == tc.service {
					svc = s
				}
			}
			if svc == nil {
				t.Fatalf("no Service %s rendered", tc.service)
			}
			if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.PublishNotReadyAddresses {
				t.Errorf("Service %s: clusterIP %q, publishNotReadyAddresses %v; want a headless Service of the Ready pods", svc.Name, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
			}
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "peer" || svc.Spec.Ports[0].Port != tc.port || svc.Spec.Ports[0].TargetPort.String() != "peer" {
				t.Errorf("Service %s ports %+v, want peer %d → peer", svc.Name, svc.Spec.Ports, tc.port)
			}
			if svc.Labels["app.kubernetes.io/component"] != "peers" {
				t.Errorf("Service %s labels %v: want component peers (a ServiceMonitor of the shared mode must not select it)", svc.Name, svc.Labels)
			}
			tpls := podTemplates(objs)
			if len(tpls) != 1 {
				t.Fatalf("%d workloads, want 1", len(tpls))
			}
			for key, tpl := range tpls {
				if !selects(svc.Spec.Selector, tpl.Labels) {
					t.Errorf("Service %s selector %v does not select %s's pods %v", svc.Name, svc.Spec.Selector, key, tpl.Labels)
				}
				c := tpl.Spec.Containers[0]
				for _, want := range []string{"--peers=" + tc.dns, "--peer-listen=" + tc.listen, "--peer-key-file=/etc/nodecache/peer/key"} {
					if !slices.Contains(c.Args, want) {
						t.Errorf("%s: args %q lack %q", key, c.Args, want)
					}
				}
				variable := strings.TrimSuffix(strings.TrimPrefix(tc.listen, "[$("), fmt.Sprintf(")]:%d", tc.port))
				if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
					return e.Name == variable && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == tc.envPath
				}) {
					t.Errorf("%s: no env %s from %s for --peer-listen", key, variable, tc.envPath)
				}
				if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "peer" && p.ContainerPort == tc.port }) {
					t.Errorf("%s: ports %+v lack peer %d", key, c.Ports, tc.port)
				}
				var vol string
				for _, v := range tpl.Spec.Volumes {
					if v.Secret != nil && v.Secret.SecretName == tc.secret && slices.Equal(v.Secret.Items, []corev1.KeyToPath{{Key: "key", Path: "key"}}) {
						vol = v.Name
					}
				}
				if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
					return vol != "" && m.Name == vol && m.MountPath == "/etc/nodecache/peer" && m.ReadOnly && m.SubPath == ""
				}) {
					t.Errorf("%s: Secret %s (key `key`) not mounted read-only at /etc/nodecache/peer (without subPath, so that a rotation reaches the pod): volumes %+v, mounts %+v", key, tc.secret, tpl.Spec.Volumes, c.VolumeMounts)
				}
			}
		})
	}

	c := loadChart(t)
	_, notes, err := renderValues(c, "nodecache", "nodecache", vals(t, `peers: {enabled: true, keySecret: nodecache-peer-key}`), false)
	if err != nil || !strings.Contains(notes, "headless Service nodecache-peers") || !strings.Contains(notes, "Secret nodecache-peer-key") || !strings.Contains(notes, "firewall port 5001 to the node addresses") {
		t.Errorf("NOTES with peers (%v) name neither the Service, the Secret nor the firewall advice:\n%s", err, notes)
	}
	for _, values := range []string{`peers: {enabled: true}`, `{mode: shared, peers: {enabled: true, keySecret: ""}}`} {
		_, _, err := renderValues(c, "nodecache", "nodecache", vals(t, values), false)
		if err == nil || !strings.Contains(err.Error(), "peers.enabled needs peers.keySecret") || !strings.Contains(err.Error(), "kubectl -n <namespace> create secret generic nodecache-peer-key --from-literal=key=$(openssl rand -hex 32)") {
			t.Errorf("%s: %v; want a refusal naming peers.keySecret and how to create the Secret", values, err)
		}
	}
	for _, values := range []string{``, `mode: shared`, `{mode: cleanup, peers: {enabled: true}}`} {
		objs, _, err := renderValues(c, "nodecache", "nodecache", vals(t, values), false)
		if err != nil {
			t.Fatalf("%s: %v", values, err)
		}
		for key, tpl := range podTemplates(objs) {
			for _, ct := range tpl.Spec.Containers {
				if slices.ContainsFunc(ct.Args, func(a string) bool { return strings.HasPrefix(a, "--peer") }) || hasPort(tpl, "peer") {
					t.Errorf("%s: %s has peer arguments or a peer port without peers: %q", values, key, ct.Args)
				}
			}
		}
		for _, o := range objs {
			if s, ok := o.Typed.(*corev1.Service); ok && strings.HasSuffix(s.Name, "-peers") {
				t.Errorf("%s: Service %s rendered without peers", values, s.Name)
			}
		}
	}
}

// TestChartPeersListenLikeMetrics: the agent's --peer-listen names the node's address in the
// same bracketed form as --metrics-listen, so an IPv6 node works for both.
func TestChartPeersListenLikeMetrics(t *testing.T) {
	t.Parallel()
	for _, o := range render(t, "nodecache", vals(t, `peers: {enabled: true, keySecret: nodecache-peer-key}`), false) {
		ds, ok := o.Typed.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		var metrics, peer string
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--metrics-listen="); ok {
				metrics = v[:strings.LastIndex(v, ":")]
			}
			if v, ok := strings.CutPrefix(a, "--peer-listen="); ok {
				peer = v[:strings.LastIndex(v, ":")]
			}
		}
		if metrics == "" || metrics != peer {
			t.Errorf("--peer-listen host %q, --metrics-listen host %q: want the same", peer, metrics)
		}
	}
}

// withComponent copies the kustomize tree under base into memory with the kustomization's
// commented `# components: [component]` line uncommented: the one edit the examples' comments
// ask for to enable the component.
func withComponent(t *testing.T, base, component string) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	src := filepath.Join(repoRoot, filepath.FromSlash(base))
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == "kustomization.yaml" {
			line := "# components: [" + component + "]\n"
			if !strings.Contains(string(data), "\n"+line) {
				t.Fatalf("%s/kustomization.yaml has no line %q to uncomment", base, strings.TrimSpace(line))
			}
			data = []byte(strings.Replace(string(data), "\n"+line, "\n"+line[2:], 1))
		}
		return mem.WriteFile(path.Join("/", base, filepath.ToSlash(rel)), data)
	})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

// TestPeersDocEqualsExample: the `helm install` of docs/deploy.md's peers section, as written,
// renders the objects of examples/kubernetes with its component peers enabled (Helm's own labels
// and the Namespace ignored, as in TestChartEqualsKustomize), and the Secret both name is the one
// the page's `kubectl create secret` creates.
func TestPeersDocEqualsExample(t *testing.T) {
	t.Parallel()
	const section = "## Kubernetes: peers between the agents"
	installs := docHelmInstalls(t, "docs/deploy.md", section)
	if len(installs) != 1 {
		t.Fatalf("docs/deploy.md %q: %d `helm install` commands, want 1", section, len(installs))
	}
	objs, _, err := renderValues(loadChart(t), installs[0].release, installs[0].namespace, installs[0].values, false)
	if err != nil {
		t.Fatalf("%q: %v", installs[0].line, err)
	}
	got := map[string]map[string]any{}
	for _, o := range objs {
		stripHelmLabels(o.Map)
		got[o.key()] = o.Map
	}
	want := map[string]map[string]any{}
	for _, o := range kustomizeBuild(t, "examples/kubernetes+peers") {
		if o.Kind != "Namespace" {
			want[o.key()] = o.Map
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("chart for docs/deploy.md's peers install (+) differs from examples/kubernetes with peers (-):\n%s", d)
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	secret, _ := installs[0].values["peers"].(map[string]any)["keySecret"].(string)
	if secret == "" || !strings.Contains(string(raw), "create secret generic "+secret+" ") {
		t.Errorf("docs/deploy.md: peers.keySecret %q is not the Secret its `kubectl create secret generic` makes", secret)
	}
}
