package test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

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
	raw, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(rel, raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if ds, ok := o.Typed.(*appsv1.DaemonSet); ok {
			return ds
		}
	}
	t.Fatalf("%s: no DaemonSet", rel)
	return nil
}
