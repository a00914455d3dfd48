package test

import (
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// regionalPage and regionalSection are the page and section whose `helm install` lines
// TestRegionalEqualsChart renders.
const (
	regionalPage    = "docs/deploy.md"
	regionalSection = "## Kubernetes: a regional tier"
)

// TestRegionalEqualsChart: examples/kubernetes/regional builds (krusty) to exactly the objects
// the chart renders for the `helm install` commands docs/deploy.md's regional tier section shows, as
// written (their release, -n and --set values, parsed by Helm's own strvals): the S3 shared tier
// and the node agents chained to it; Helm's own labels and the Namespace are ignored, as in
// TestChartEqualsKustomize. The agents' --chain must name the example's own Service.
func TestRegionalEqualsChart(t *testing.T) {
	t.Parallel()
	installs := docHelmInstalls(t, regionalPage, regionalSection)
	if len(installs) != 2 {
		t.Fatalf("%s %q: %d `helm install` commands, want 2 (the shared tier and the agents)", regionalPage, regionalSection, len(installs))
	}
	got := map[string]map[string]any{}
	for _, in := range installs {
		objs, _, err := renderValues(loadChart(t), in.release, in.namespace, in.values, false)
		if err != nil {
			t.Fatalf("%s's %q: render: %v", regionalPage, in.line, err)
		}
		for _, o := range objs {
			stripHelmLabels(o.Map)
			if _, dup := got[o.key()]; dup {
				t.Fatalf("%s's helm installs both render %s", regionalPage, o.key())
			}
			got[o.key()] = o.Map
		}
	}

	built := kustomizeBuild(t, "examples/kubernetes/regional")
	want := map[string]map[string]any{}
	for _, o := range built {
		if o.Kind == "Namespace" {
			if o.Name != "nodecache" {
				t.Errorf("namespace %q, want nodecache", o.Name)
			}
			continue
		}
		want[o.key()] = o.Map
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("chart for %s's regional values (+) differs from kustomize build of examples/kubernetes/regional (-):\n%s", regionalPage, d)
	}
	checkChainNamesService(t, built)
}

// checkChainNamesService: the DaemonSet's --chain URL is http://<Service>.<namespace>.svc.cluster.local:<registry port>
// of a Service among objs.
func checkChainNamesService(t *testing.T, objs []object) {
	t.Helper()
	services := map[string]bool{}
	var chains []string
	for _, o := range objs {
		switch x := o.Typed.(type) {
		case *corev1.Service:
			for _, p := range x.Spec.Ports {
				if p.Name == "registry" {
					services[fmt.Sprintf("http://%s.%s.svc.cluster.local:%d", x.Name, x.Namespace, p.Port)] = true
				}
			}
		case *appsv1.DaemonSet:
			for _, c := range x.Spec.Template.Spec.Containers {
				for _, a := range c.Args {
					if v, ok := strings.CutPrefix(a, "--chain="); ok {
						chains = append(chains, v)
					}
				}
			}
		}
	}
	if len(chains) != 1 {
		t.Fatalf("regional DaemonSet: --chain arguments %q, want one", chains)
	}
	if u, err := url.Parse(chains[0]); err != nil || !services[u.Scheme+"://"+u.Host] || strings.Trim(u.Path, "/") != "" {
		t.Errorf("--chain=%s names no registry port of the example's Services %v", chains[0], slices.Sorted(maps.Keys(services)))
	}
}

// helmInstall is one `helm install RELEASE CHART -n NAMESPACE --set …` command from a page.
type helmInstall struct {
	line, release, namespace string
	values                   map[string]any
}

// docHelmInstalls returns the `helm install` commands of section heading of the Markdown page
// file (up to the next heading), with `\` continuations joined and a trailing `# comment`
// dropped. Only the forms the page uses are accepted: -n/--namespace, --create-namespace, --set
// (repeatable, comma lists, Helm's strvals syntax); anything else, or a quote, fails the test so
// that this reader is extended rather than silently rendering something the page does not say.
func docHelmInstalls(t *testing.T, file, heading string) []helmInstall {
	t.Helper()
	raw := readRepoFile(t, file)
	text := string(raw)
	start := strings.Index(text, "\n"+heading)
	if start < 0 {
		t.Fatalf("%s: section %q is gone; update this test", file, heading)
	}
	section := text[start+1:]
	if end := strings.Index(section[len(heading):], "\n#"); end >= 0 {
		section = section[:len(heading)+end]
	}
	var cmds []string
	var cur strings.Builder
	for line := range strings.SplitSeq(section, "\n") {
		line = strings.TrimSpace(line)
		if cur.Len() == 0 && !strings.HasPrefix(line, "helm install ") {
			continue
		}
		more := strings.HasSuffix(line, `\`)
		cur.WriteString(strings.TrimSuffix(line, `\`) + " ")
		if !more {
			cmds = append(cmds, cur.String())
			cur.Reset()
		}
	}
	var out []helmInstall
	for _, cmd := range cmds {
		in, err := parseHelmInstall(cmd)
		if err != nil {
			t.Fatalf("%s %q: %q: %v", file, heading, cmd, err)
		}
		out = append(out, in)
	}
	return out
}

func parseHelmInstall(cmd string) (helmInstall, error) {
	words := strings.Fields(cmd)
	if i := slices.IndexFunc(words, func(w string) bool { return strings.HasPrefix(w, "#") }); i >= 0 {
		words = words[:i]
	}
	in := helmInstall{line: strings.Join(words, " "), values: map[string]any{}}
	var pos []string
	for i := 2; i < len(words); i++ { // after "helm install"
		w := words[i]
		if strings.ContainsAny(w, `'"`) {
			return in, fmt.Errorf("quoted word %s: this reader splits on spaces only", w)
		}
		next := func() (string, error) {
			if i+1 >= len(words) {
				return "", fmt.Errorf("%s without a value", w)
			}
			i++
			return words[i], nil
		}
		switch {
		case w == "-n" || w == "--namespace":
			ns, err := next()
			if err != nil {
				return in, err
			}
			in.namespace = ns
		case w == "--create-namespace":
		case w == "--set":
			s, err := next()
			if err != nil {
				return in, err
			}
			// A value in single quotes (braces kept from the shell), as the pages write lists.
			if len(s) > 1 && strings.HasPrefix(s, "'") && strings.HasSuffix(s, "'") {
				s = s[1 : len(s)-1]
			}
			if err := strvals.ParseInto(s, in.values); err != nil {
				return in, fmt.Errorf("--set %s: %w", s, err)
			}
		case strings.HasPrefix(w, "-"):
			return in, fmt.Errorf("flag %s: not read by this test", w)
		default:
			pos = append(pos, w)
		}
	}
	if len(pos) != 2 || pos[1] != "charts/nodecache" {
		return in, fmt.Errorf("arguments %q: want RELEASE charts/nodecache", pos)
	}
	if in.namespace == "" {
		return in, fmt.Errorf("no -n NAMESPACE")
	}
	in.release = pos[0]
	return in, nil
}

// TestRegionalAgentIsTheAgent: examples/kubernetes/regional/daemonset.yaml is the agent
// DaemonSet of examples/kubernetes/daemonset.yaml plus one --chain argument (kustomize refuses a
// parent directory as a base, so the file is a copy); any other difference is drift.
func TestRegionalAgentIsTheAgent(t *testing.T) {
	t.Parallel()
	agent := readDaemonSet(t, filepath.Join("examples", "kubernetes", "daemonset.yaml"))
	regional := readDaemonSet(t, filepath.Join("examples", "kubernetes", "regional", "daemonset.yaml"))
	if len(regional.Spec.Template.Spec.Containers) == 0 {
		t.Fatal("regional DaemonSet has no container")
	}
	c := &regional.Spec.Template.Spec.Containers[0]
	chain := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--chain=") })
	if chain < 0 {
		t.Fatalf("regional DaemonSet args %q: want a --chain=URL argument", c.Args)
	}
	c.Args = slices.Delete(c.Args, chain, chain+1)
	if !reflect.DeepEqual(agent, regional) {
		t.Errorf("regional/daemonset.yaml differs from daemonset.yaml by more than --chain:\nagent:    %+v\nregional: %+v", agent.Spec, regional.Spec)
	}
}

func readDaemonSet(t *testing.T, rel string) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range repoObjects(t, rel) {
		if ds, ok := o.Typed.(*appsv1.DaemonSet); ok {
			return ds
		}
	}
	t.Fatalf("%s: no DaemonSet", rel)
	return nil
}
