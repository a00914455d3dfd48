package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
)

// TestDocsHelmTemplateKubeVersion (issue 26): `helm template` without --kube-version renders for
// Helm's default Kubernetes version, which the chart's kubeVersion refuses (a `go install`ed helm
// fails so): every `helm template` in README.md, docs/, the chart and examples/ has
// --kube-version within its command or sentence, and each version given satisfies the chart's
// kubeVersion.
func TestDocsHelmTemplateKubeVersion(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	constraint := c.Metadata.KubeVersion
	if chartutil.IsCompatibleRange(constraint, chartutil.DefaultCapabilities.KubeVersion.Version) {
		t.Fatalf("Helm's default Kubernetes %s satisfies kubeVersion %q: the docs' --kube-version note is obsolete",
			chartutil.DefaultCapabilities.KubeVersion.Version, constraint)
	}
	var files []string
	for _, dir := range []string{"docs", "charts", "examples"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	files = append(files, filepath.Join(repoRoot, "README.md"))
	version := regexp.MustCompile(`--kube-version[ =]v?([0-9]+\.[0-9]+(\.[0-9]+)?)`)
	found := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for i := strings.Index(text, "helm template"); i >= 0; i = next(text, i) {
			found++
			end := min(len(text), i+160)
			if j := strings.Index(text[i+1:end], "helm "); j >= 0 {
				end = i + 1 + j
			}
			near := text[i:end]
			rel, _ := filepath.Rel(repoRoot, f)
			if !strings.Contains(near, "--kube-version") {
				t.Errorf("%s: %q has no --kube-version", rel, strings.SplitN(near, "\n", 2)[0])
				continue
			}
			if m := version.FindStringSubmatch(near); m != nil {
				if !chartutil.IsCompatibleRange(constraint, "v"+m[1]) {
					t.Errorf("%s: --kube-version %s does not satisfy the chart's kubeVersion %q", rel, m[1], constraint)
				}
			}
		}
	}
	if found < 3 {
		t.Errorf("found %d `helm template` in the docs, want at least 3 (docs/deploy.md, README.md, values.yaml)", found)
	}
}

func next(text string, i int) int {
	j := strings.Index(text[i+1:], "helm template")
	if j < 0 {
		return -1
	}
	return i + 1 + j
}

// TestDocsInstallWaitsForActivation (issue 26): next to the agent's install line, README's Deploy
// section and docs/deploy.md's agent section say that with the default agent.readiness=activation
// `helm install --wait` and GitOps health checks wait until containerd restarts, and name
// agent.readiness=serving for those tools.
func TestDocsInstallWaitsForActivation(t *testing.T) {
	t.Parallel()
	for _, doc := range []struct{ file, from, to string }{
		{"README.md", "\n## Deploy", "\n- **[Kubernetes: a shared cache]"},
		{"docs/deploy.md", "\n## Kubernetes: agent on every node", "\n### The agent trusts"},
	} {
		text := string(readRepoFile(t, doc.file))
		start, end := strings.Index(text, doc.from), strings.Index(text, doc.to)
		if start < 0 || end < start {
			t.Fatalf("%s: the section from %q to %q is gone; update this test", doc.file, doc.from[1:], doc.to[1:])
		}
		section := text[start:end]
		for _, want := range []string{"helm install nodecache charts/nodecache", "helm install --wait", "GitOps", "agent.readiness=serving", "restart"} {
			if !strings.Contains(section, want) {
				t.Errorf("%s, the agent's install: does not say %q", doc.file, want)
			}
		}
	}
}
