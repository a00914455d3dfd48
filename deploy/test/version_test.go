package test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// versionRefs are the ways a file names a nodecache release: the image tag, a release binary's
// file name, the Dockerfile's build argument, the chart's appVersion.
var versionRefs = []*regexp.Regexp{
	regexp.MustCompile(`ghcr\.io/nodecache/nodecache:(v[0-9][0-9A-Za-z.+-]*)`),
	regexp.MustCompile(`nodecache-(v[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+]*)-(?:linux|darwin)`),
	regexp.MustCompile(`VERSION=(v[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*)`),
	regexp.MustCompile(`(?m)^appVersion: *"?(v[^"\s]+)"?`),
}

// TestOneVersion (issue 26): README, docs, the chart, the kustomize and example manifests, the
// systemd example and the Dockerfile name one release, the chart's appVersion, which is
// CHANGELOG.md's newest heading (and the chart's own version without the v). A file naming
// another version (a forgotten bump) fails, as does a place that should name it and does not.
func TestOneVersion(t *testing.T) {
	t.Parallel()
	chart := string(readRepoFile(t, "charts/nodecache/Chart.yaml"))
	m := versionRefs[3].FindStringSubmatch(chart)
	if m == nil {
		t.Fatal("charts/nodecache/Chart.yaml has no appVersion")
	}
	want := m[1]
	if !regexp.MustCompile(`(?m)^version: *"?` + regexp.QuoteMeta(strings.TrimPrefix(want, "v")) + `"?$`).MatchString(chart) {
		t.Errorf("charts/nodecache/Chart.yaml: version is not appVersion %s without the v", want)
	}
	changelog := string(readRepoFile(t, "CHANGELOG.md"))
	if h := regexp.MustCompile(`(?m)^## (v\S+)`).FindStringSubmatch(changelog); h == nil || h[1] != want {
		t.Errorf("CHANGELOG.md's newest heading %v is not the chart's appVersion %s", h, want)
	}

	files := []string{"README.md", "Dockerfile", "charts/nodecache/Chart.yaml"}
	for _, dir := range []string{"docs", "examples", "charts"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(repoRoot, p)
			// docs/cli.md is generated from --help, which names no release.
			if rel != filepath.FromSlash("docs/cli.md") && !slices.Contains(files, filepath.ToSlash(rel)) {
				files = append(files, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	named := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		for _, re := range versionRefs {
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				named[f] = true
				if m[1] != want {
					t.Errorf("%s names %q (%s); the release is %s (the chart's appVersion)", f, m[0], m[1], want)
				}
			}
		}
	}
	for _, f := range []string{"README.md", "docs/deploy.md", "charts/nodecache/Chart.yaml", "examples/kubernetes/daemonset.yaml", "Dockerfile"} {
		if !named[f] {
			t.Errorf("%s names no release; want %s there", f, want)
		}
	}
}
