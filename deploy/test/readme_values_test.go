package test

import (
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestReadmeChartValuesExist (newuser F21): every chart value named in the Kubernetes sections
// of docs/deploy.md and in README's Deploy section exists in charts/nodecache/values.yaml, so
// `helm install --set NAME=…` as written is not refused by the schema. A value name is a
// backticked camelCase path (agent.resources, upstreamAuth.secretName, mode=shared,
// shared.storage.s3.*); a single name resolves at the top level or under the nearest `PATH.*`
// named before it in the same paragraph (`shared.storage.s3.*` (`bucket`, …)).
func TestReadmeChartValuesExist(t *testing.T) {
	t.Parallel()
	raw := readRepoFile(t, "charts/nodecache/values.yaml")
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	exists := func(path string) bool {
		var cur any = values
		for _, k := range strings.Split(path, ".") {
			m, ok := cur.(map[string]any)
			if !ok {
				return false
			}
			if cur, ok = m[k]; !ok {
				return false
			}
		}
		return true
	}
	valueName := regexp.MustCompile("`([a-z][A-Za-z]*(?:\\.[a-z][A-Za-z0-9]*)*)(\\.\\*|=[^`]*)?`")
	for _, doc := range []struct {
		file, from, to string
		atLeast        int // value names the pattern must find there, so that a changed text fails
	}{
		{"docs/deploy.md", "\n## Kubernetes: agent on every node", "\n## Bare metal", 20},
		{"README.md", "\n## Deploy", "\n## Documentation", 1},
	} {
		text := readRepoFile(t, doc.file)
		start := strings.Index(string(text), doc.from)
		end := strings.Index(string(text), doc.to)
		if start < 0 || end < start {
			t.Fatalf("%s: the sections from %q to %q are gone; update this test", doc.file, doc.from[1:], doc.to[1:])
		}
		checked := 0
		for _, para := range strings.Split(string(text[start:end]), "\n\n") {
			prefix := ""
			for _, m := range valueName.FindAllStringSubmatch(para, -1) {
				path, suffix := m[1], m[2]
				if strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".json") {
					continue // values.yaml, values.schema.json
				}
				if !strings.Contains(path, ".") && suffix == "" && !exists(path) && !(prefix != "" && exists(prefix+"."+path)) {
					// A single lowercase word that is no value anywhere here (a command, a kind) is no
					// value name; one that is a value under a section is the page's mistake.
					if !existsNested(values, path) {
						continue
					}
					t.Errorf("%s names chart value %q, which is no top-level value (values.yaml has it only nested; write its full path)", doc.file, path)
					continue
				}
				if strings.Contains(path, ".") && !exists(path) {
					t.Errorf("%s names chart value %q, which values.yaml does not have", doc.file, path)
				}
				if suffix == ".*" {
					prefix = path
				}
				checked++
			}
		}
		if checked < doc.atLeast {
			t.Errorf("only %d chart value names found in %s from %q to %q; the pattern no longer matches", checked, doc.file, doc.from[1:], doc.to[1:])
		}
	}
}

// existsNested reports whether key is a key of any map below the top level of v.
func existsNested(v map[string]any, key string) bool {
	for _, child := range v {
		if m, ok := child.(map[string]any); ok {
			if _, ok := m[key]; ok || existsNested(m, key) {
				return true
			}
		}
	}
	return false
}
