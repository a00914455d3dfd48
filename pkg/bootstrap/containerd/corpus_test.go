package containerd_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// corpusCase is one shape of the repository's own corpus (bootstraptest.Corpus) under one
// containerd release.
type corpusCase struct {
	shape   string // "containerd/<shape>"
	daemon  string // "1.7" or "2.4"
	migrate bool
	want    outcome
}

const certsD = "/etc/containerd/certs.d"

var corpusCases = []corpusCase{
	{shape: "containerd/schema1-no-version", daemon: "1.7", want: outcome{refused: "reads it as the deprecated version 1: add `version = 2` as its first line"}},
	{shape: "containerd/schema1-no-version", daemon: "2.4", want: outcome{refused: "containerd config migrate"}},
	{shape: "containerd/schema2-no-registry", daemon: "1.7", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true}},
	{shape: "containerd/schema2-no-registry", daemon: "2.4", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true}},
	{shape: "containerd/schema3-no-registry", daemon: "1.7", want: outcome{refused: "loads at most version 2"}},
	{shape: "containerd/schema3-no-registry", daemon: "2.4", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true}},
	{shape: "containerd/schema4-config-path", daemon: "1.7", want: outcome{refused: "loads at most version 2"}},
	{shape: "containerd/schema4-config-path", daemon: "2.4", want: outcome{action: containerd.ConfigPathAdopted, hostsDir: certsD}},
	{shape: "containerd/import-overrides-registry", daemon: "1.7", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true, editedFile: "/etc/containerd/conf.d/50-registry.toml"}},
	{shape: "containerd/import-overrides-registry", daemon: "2.4", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true, editedFile: "/etc/containerd/conf.d/50-registry.toml"}},
	{shape: "containerd/config-path-single", daemon: "1.7", want: outcome{action: containerd.ConfigPathAdopted, hostsDir: certsD}},
	{shape: "containerd/config-path-single", daemon: "2.4", want: outcome{action: containerd.ConfigPathAdopted, hostsDir: certsD}},
	{shape: "containerd/config-path-list", daemon: "1.7", want: outcome{action: containerd.ConfigPathFirstOfList, hostsDir: certsD}},
	{shape: "containerd/config-path-list", daemon: "2.4", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true}},
	{shape: "containerd/config-path-empty", daemon: "1.7", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true}},
	{shape: "containerd/config-path-empty", daemon: "2.4", want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true}},
	{shape: "containerd/legacy-mirrors", daemon: "1.7", want: outcome{refused: `"io.containerd.grpc.v1.cri".registry.mirrors`}},
	{shape: "containerd/legacy-mirrors", daemon: "2.4", want: outcome{refused: "--migrate"}},
	{shape: "containerd/legacy-mirrors", daemon: "1.7", migrate: true, want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true, migrated: []string{"docker.io", "registry.local:5000"}, migratedHTTP: []string{"registry.local:5000"}}},
	{shape: "containerd/legacy-mirrors", daemon: "2.4", migrate: true, want: outcome{action: containerd.ConfigPathSet, hostsDir: certsD, edited: true, migrated: []string{"docker.io", "registry.local:5000"}, migratedHTTP: []string{"registry.local:5000"}}},
	{shape: "containerd/legacy-configs-tls", daemon: "1.7", want: outcome{refused: `configs."registry.local:5000".tls`}},
	{shape: "containerd/legacy-configs-tls", daemon: "1.7", migrate: true, want: outcome{action: containerd.ConfigPathAdopted, hostsDir: certsD, edited: true, migrated: []string{"registry.local:5000"}, migratedSkipVerify: []string{"registry.local:5000"}}},
	{shape: "containerd/legacy-configs-tls", daemon: "2.4", want: outcome{action: containerd.ConfigPathAdopted, hostsDir: certsD}},
	{shape: "containerd/k3s-template", daemon: "2.4", want: outcome{refused: "/etc/rancher/k3s/registries.yaml"}},
	{shape: "containerd/k3s-agent-path", daemon: "2.4", want: outcome{refused: "/etc/rancher/k3s/registries.yaml"}},
	{shape: "containerd/talos-marker", daemon: "2.4", want: outcome{refused: "nodecache gen talos"}},
}

// TestEveryCorpusShapeHasACase fails when a shape is added to the corpus without an expected
// outcome, or a case names a shape that is not there.
func TestEveryCorpusShapeHasACase(t *testing.T) {
	t.Parallel()
	shapes := bootstraptest.CorpusShapes(t, "containerd")
	for _, s := range shapes {
		if !slices.ContainsFunc(corpusCases, func(c corpusCase) bool { return c.shape == s }) {
			t.Errorf("corpus shape %s has no case in corpusCases", s)
		}
	}
	for _, c := range corpusCases {
		if !slices.Contains(shapes, c.shape) {
			t.Errorf("corpusCases names %s, which is not in the corpus", c.shape)
		}
	}
}

// TestPlanCorpus runs every corpus shape through Plan, the applier, containerd's loader and
// hosts parser, a second Plan and --remove: the same checks as TestPlanFixtures, on every clone.
func TestPlanCorpus(t *testing.T) {
	t.Parallel()
	cases := make([]planCase, 0, len(corpusCases))
	for _, c := range corpusCases {
		d := v24
		if c.daemon == "1.7" {
			d = v17
		}
		n := strings.TrimPrefix(c.shape, "containerd/") + "-" + c.daemon
		if c.migrate {
			n += "-migrate"
		}
		cases = append(cases, planCase{name: n, daemon: d, migrate: c.migrate, want: c.want,
			host: func(t *testing.T) map[string][]byte { return bootstraptest.Corpus(t, c.shape) }})
	}
	runPlanCases(t, cases)
}
