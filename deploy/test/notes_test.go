package test

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/jsonpath"
)

// TestChartSharedNotesNodeAddress (issue 26): mode=shared's NOTES give node runtimes an address
// they can use for the Service type chosen, never the cluster DNS name (which they cannot
// resolve): NodePort prints the kubectl command for the node port, LoadBalancer the one for the
// load balancer's address (each jsonpath is evaluated here, with client-go's jsonpath as kubectl
// does, on the rendered Service with the port or address Kubernetes would fill in), ClusterIP
// says it has none and how to change the type. Pods get the cluster DNS name.
func TestChartSharedNotesNodeAddress(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	mirror := regexp.MustCompile(`--mirror (\S+)`)
	query := regexp.MustCompile(`kubectl -n nodecache get svc nodecache-shared -o jsonpath='([^']*)'`)
	for _, tc := range []struct {
		typ   string
		fill  func(*corev1.Service) // what Kubernetes sets once the Service exists
		want  string                // the jsonpath's answer
		lines []string
	}{
		{"NodePort", func(s *corev1.Service) {
			for i := range s.Spec.Ports {
				s.Spec.Ports[i].NodePort = int32(31500 + i)
			}
		}, "31500", []string{"--mirror http://<the node's IP>:$NODE_PORT"}},
		{"LoadBalancer", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}
		}, "203.0.113.7", []string{"--mirror http://$LB:5000"}},
		{"LoadBalancer", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "lb.example.com"}}
		}, "lb.example.com", []string{"--mirror http://$LB:5000"}},
		{"ClusterIP", nil, "", []string{"a ClusterIP Service has no address for them",
			"helm upgrade nodecache-shared <chart> -n nodecache --reuse-values --set shared.service.type=NodePort"}},
	} {
		t.Run(tc.typ+" "+tc.want, func(t *testing.T) {
			t.Parallel()
			objs, notes, err := renderValues(c, "nodecache-shared", "nodecache", vals(t, "{mode: shared, shared: {service: {type: "+tc.typ+"}}}"), false)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range append(tc.lines, "Pods (the warm Job, agents' chain): http://nodecache-shared.nodecache.svc:5000",
				"Node runtimes resolve no cluster DNS") {
				if !strings.Contains(notes, want) {
					t.Errorf("NOTES do not say %q:\n%s", want, notes)
				}
			}
			for _, m := range mirror.FindAllStringSubmatch(notes, -1) {
				if strings.Contains(m[1], ".svc") {
					t.Errorf("NOTES give nodes the cluster DNS name: %s", m[0])
				}
			}
			q := query.FindStringSubmatch(notes)
			if tc.fill == nil {
				if q != nil || mirror.MatchString(notes) {
					t.Errorf("ClusterIP: NOTES print a node address:\n%s", notes)
				}
				return
			}
			if q == nil {
				t.Fatalf("NOTES hold no kubectl jsonpath for the Service nodecache-shared:\n%s", notes)
			}
			var svc *corev1.Service
			for _, o := range objs {
				if s, ok := o.Typed.(*corev1.Service); ok && s.Name == "nodecache-shared" {
					svc = s.DeepCopy()
				}
			}
			if svc == nil {
				t.Fatal("no Service nodecache-shared rendered")
			}
			tc.fill(svc)
			b, err := json.Marshal(svc)
			if err != nil {
				t.Fatal(err)
			}
			var obj any
			if err := json.Unmarshal(b, &obj); err != nil {
				t.Fatal(err)
			}
			jp := jsonpath.New("notes")
			jp.AllowMissingKeys(true) // kubectl's --allow-missing-template-keys, true by default
			if err := jp.Parse(q[1]); err != nil {
				t.Fatalf("jsonpath %s: %v", q[1], err)
			}
			var out bytes.Buffer
			if err := jp.Execute(&out, obj); err != nil || out.String() != tc.want {
				t.Errorf("jsonpath %s on the Service: %q, %v; want %q", q[1], out.String(), err, tc.want)
			}
		})
	}
}
