package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
)

// TestChartLint: helm.sh/helm/v3/pkg/lint reports nothing at all (no error, warning or info)
// for every value set.
func TestChartLint(t *testing.T) {
	t.Parallel()
	kube, err := chartutil.ParseKubeVersion("v1.34.0")
	if err != nil {
		t.Fatal(err)
	}
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			t.Parallel()
			l := lint.AllWithKubeVersion(chartDir, vals(t, vs.values), "nodecache", kube)
			for _, m := range l.Messages {
				t.Errorf("lint: %s", m)
			}
		})
	}
}

// TestChartSchemaRefuses: values.schema.json refuses bad values at render time with a message
// naming the value; a setting the chart has no value for (S3 storage) is refused as unknown.
func TestChartSchemaRefuses(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	for _, tc := range []struct{ name, values, want string }{
		{"unknown mode", `mode: daemonset`, "mode"},
		{"port zero", `port: 0`, "port"},
		{"port as string", `port: "5000"`, "port"},
		{"upstream without URL", `upstreams: [docker.io]`, "upstreams"},
		{"upstream with path", `upstreams: ["docker.io=https://registry-1.docker.io/v2"]`, "upstreams"},
		{"readiness", `agent: {readiness: always}`, "readiness"},
		{"interval without unit", `agent: {interval: "60"}`, "interval"},
		{"runtime", `agent: {runtime: docker}`, "runtime"},
		{"relative cache path", `agent: {cachePath: var/lib/nodecache}`, "cachePath"},
		{"pull policy", `image: {pullPolicy: Sometimes}`, "pullPolicy"},
		{"tag with space", `image: {tag: "v1 "}`, "tag"},
		{"warm image with space", `warm: {images: ["nginx latest"]}`, "images"},
		{"warm platform", `warm: {platform: amd64}`, "platform"},
		{"extra arg not a flag", `extraArgs: ["-x"]`, "extraArgs"},
		{"discovery", `metrics: {discovery: scrape}`, "discovery"},
		{"metrics port", `metrics: {port: 70000}`, "port"},
		{"pvc size", `mode: shared
shared: {persistence: {size: lots}}`, "size"},
		{"service type", `shared: {service: {type: ExternalName}}`, "type"},
		{"typo", `agnet: {readiness: serving}`, "agnet"},
		{"max-size in decimal units", `maxSize: 30GB`, "maxSize"},
		{"max-size over 100%", `maxSize: 130%`, "maxSize"},
		{"max-size in PiB (serve has no PiB)", `maxSize: 1PiB`, "maxSize"},
		{"max-size share of zero", `maxSize: "0%"`, "maxSize"},
		{"max-size with a space", `maxSize: 30 GiB`, "maxSize"},
		{"chain with a path", `chain: http://cache:5000/v2`, "chain"},
		{"chain without scheme", `chain: cache:5000`, "chain"},
		{"storage is no chart value (regional S3 tier: issue 15)", `storage: s3`, "storage"},
		{"upstream credentials as a map", `upstreamAuth: {docker.io: regcred}`, "docker.io"},
		{"upstream credentials for NAME=URL", `upstreamAuth: {secretName: regcred, upstreams: ["docker.io=https://registry-1.docker.io"]}`, "upstreams"},
		{"pull-allow without prefix length", `pullAllow: [10.0.0.1]`, "pullAllow"},
		{"pull-allow under agent", `agent: {pullAllow: [10.0.0.0/8]}`, "pullAllow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := renderValues(c, "nodecache", "nodecache", vals(t, tc.values), false)
			if err == nil {
				t.Fatalf("%s rendered", tc.values)
			}
			if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not name the schema and %q: %v", tc.want, err)
			}
		})
	}
}

// TestChartMaxSizeAgreesWithServe (newuser F11): one table of maxSize values goes to the chart's
// schema, as maxSize (mode=shared) and as agent.maxSize (mode=agent), and to the binary's
// --max-size parser (serve with a bad --listen, which is checked after --max-size, so nothing
// starts); all must accept or all refuse, or a value the schema lets through would crash-loop
// the pods. The one difference allowed is named: sizes of 8 EiB and more, which the pattern
// cannot bound and serve refuses.
func TestChartMaxSizeAgreesWithServe(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	for _, tc := range []struct {
		value    string
		accept   bool
		overflow bool
	}{
		{"", true, false}, {"0", true, false}, {"0B", true, false}, {"0GiB", true, false},
		{"1048576", true, false}, {"1048576B", true, false}, {"512KiB", true, false}, {"500MiB", true, false},
		{"30GiB", true, false}, {"1.5TiB", true, false}, {"1TiB", true, false},
		{"1%", true, false}, {"30%", true, false}, {"99.5%", true, false}, {"100%", true, false},
		{"100.0%", true, false}, {"0.5%", true, false}, {"05%", true, false},
		{"1PiB", false, false}, {"1EiB", false, false}, {"30GB", false, false}, {"30G", false, false},
		{"2Gi", false, false}, {"30gib", false, false}, {"30 GiB", false, false}, {" 30GiB", false, false},
		{"1e3GiB", false, false}, {"+1GiB", false, false}, {"-1GiB", false, false}, {".5GiB", false, false},
		{"1.GiB", false, false}, {"GiB", false, false}, {"0%", false, false}, {"0.0%", false, false},
		{"100.5%", false, false}, {"101%", false, false}, {"130%", false, false}, {"1e1%", false, false},
		{"30 %", false, false}, {"%", false, false}, {"-5%", false, false},
		{"8388608TiB", false, true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Parallel()
			schema := map[string]bool{}
			for value, vals := range map[string]map[string]any{
				"maxSize":       {"mode": "shared", "maxSize": tc.value},
				"agent.maxSize": {"agent": map[string]any{"maxSize": tc.value}},
			} {
				_, _, err := renderValues(c, "nodecache", "nodecache", vals, false)
				schema[value] = err == nil
				if err != nil && !strings.Contains(err.Error(), "maxSize") {
					t.Fatalf("render with %s %q failed for another reason: %v", value, tc.value, err)
				}
			}
			out, _ := exec.Command(binary, "serve", "--root", t.TempDir(), "--listen", "127.0.0.1:99999",
				"--max-size", tc.value).CombinedOutput()
			var serve bool
			switch {
			case strings.Contains(string(out), "--max-size"):
			case strings.Contains(string(out), "--listen"):
				serve = true
			default:
				t.Fatalf("serve --max-size %q: neither --max-size nor --listen refused:\n%s", tc.value, out)
			}
			if serve != tc.accept {
				t.Errorf("serve --max-size %q accepted=%v, want %v:\n%s", tc.value, serve, tc.accept, out)
			}
			for value, accepted := range schema {
				if want := tc.accept || tc.overflow; accepted != want {
					t.Errorf("chart schema %s %q accepted=%v, want %v (serve: %v)", value, tc.value, accepted, want, serve)
				}
			}
		})
	}
}

// TestCleanupRemovesAgentConfig runs the cleanup mode's init containers, exactly as rendered
// (only the host root moved to a temporary directory), over what the agent's gen pass writes on
// a containerd node and on a CRI-O node: afterwards no file of nodecache's is left and the
// edited config.toml is the site's again.
func TestCleanupRemovesAgentConfig(t *testing.T) {
	t.Parallel()
	objs := render(t, "nodecache", vals(t, `mode: cleanup`), false)
	var steps [][]string
	for _, c := range containers(objs) {
		if c.Args != nil && c.Args[0] == "gen" {
			steps = append(steps, c.Args)
		}
	}
	if len(steps) != 2 {
		t.Fatalf("want the crio and containerd removals, got %v", steps)
	}
	for _, runtime := range []string{"containerd", "crio"} {
		t.Run(runtime, func(t *testing.T) {
			t.Parallel()
			host := t.TempDir()
			site := map[string]string{}
			switch runtime {
			case "containerd":
				site["etc/containerd/config.toml"] = "version = 3\n"
			case "crio":
				site["etc/containers/registries.conf"] = "unqualified-search-registries = [\"docker.io\"]\n"
			}
			for p, body := range site {
				writeFile(t, filepath.Join(host, p), body)
			}
			gen := []string{"gen", runtime, "--mirror", "http://127.0.0.1:5000", "--host-root", host}
			if runtime == "containerd" {
				gen = append(gen, "--containerd-version", "2.4.2")
			} else {
				gen = append(gen, "--crio-version", "1.34.0", "--no-reload")
			}
			if out, err := exec.CommandContext(t.Context(), binary, gen...).CombinedOutput(); err != nil {
				t.Fatalf("agent's gen pass %v: %v\n%s", gen, err, out)
			}
			if n := len(managedFiles(t, host)); n == 0 {
				t.Fatal("gen wrote no file: nothing to clean up, the test would prove nothing")
			}
			for _, args := range steps {
				args = replaceHostRoot(args, host)
				if out, err := exec.CommandContext(t.Context(), binary, args...).CombinedOutput(); err != nil {
					t.Fatalf("cleanup %v: %v\n%s", args, err, out)
				}
			}
			if left := managedFiles(t, host); len(left) > 0 {
				t.Errorf("left after cleanup: %v", left)
			}
			for p, body := range site {
				if b, err := os.ReadFile(filepath.Join(host, p)); err != nil || string(b) != body {
					t.Errorf("%s after cleanup: %q, %v; want the site's %q", p, b, err, body)
				}
			}
		})
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// managedFiles lists files under root that carry nodecache's marker or are its backups.
func managedFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "managed by nodecache") || strings.HasSuffix(p, ".nodecache.bak") {
			out = append(out, strings.TrimPrefix(p, root))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func replaceHostRoot(args []string, host string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "--host-root=/host" {
			a = fmt.Sprintf("--host-root=%s", host)
		}
		out[i] = a
	}
	return out
}
