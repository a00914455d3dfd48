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

// TestChartSchemaRefuses: values.schema.json refuses a wrong type, a value outside a closed set
// and a name the chart does not have, at render time, with a message naming the value; a
// setting the chart has no value for (S3 storage at the top level) is refused as unknown. The
// grammar of string values is the templates' (TestChartValueGrammar).
func TestChartSchemaRefuses(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	for _, tc := range []struct{ name, values, want string }{
		{"unknown mode", `mode: daemonset`, "mode"},
		{"port zero", `port: 0`, "port"},
		{"port as string", `port: "5000"`, "port"},
		{"upstreams as a string", `upstreams: docker.io`, "upstreams"},
		{"readiness", `agent: {readiness: always}`, "readiness"},
		{"runtime", `agent: {runtime: docker}`, "runtime"},
		{"pull policy", `image: {pullPolicy: Sometimes}`, "pullPolicy"},
		{"discovery", `metrics: {discovery: scrape}`, "discovery"},
		{"metrics port", `metrics: {port: 70000}`, "port"},
		{"max-size as a number", `maxSize: 30`, "maxSize"},
		{"service type", `shared: {service: {type: ExternalName}}`, "type"},
		{"typo", `agnet: {readiness: serving}`, "agnet"},
		{"storage is no chart value (regional S3 tier: issue 15)", `storage: s3`, "storage"},
		{"upstream credentials as a map", `upstreamAuth: {docker.io: regcred}`, "docker.io"},
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

// TestChartRefusesNameURLForCredentials: upstreamAuth.upstreams takes upstream NAMEs; a
// NAME=URL there (the upstreams form) is refused saying which is which.
func TestChartRefusesNameURLForCredentials(t *testing.T) {
	t.Parallel()
	_, _, err := renderValues(loadChart(t), "nodecache", "nodecache",
		vals(t, `upstreamAuth: {secretName: regcred, upstreams: ["docker.io=https://registry-1.docker.io"]}`), false)
	if err == nil || !strings.Contains(err.Error(), `upstreamAuth.upstreams: "docker.io=https://registry-1.docker.io" is no upstream NAME (the URL is upstreams' part: NAME=URL there, NAME here)`) {
		t.Errorf("NAME=URL in upstreamAuth.upstreams: %v", err)
	}
}

// TestChartMaxSizeAgreesWithServe (newuser F11): one table of maxSize values goes to the chart,
// as maxSize (mode=shared) and as agent.maxSize (mode=agent), and to the binary's --max-size
// parser (serve with a bad --listen, which is checked after --max-size, so nothing starts); all
// must accept or all refuse, or a value the chart lets through would crash-loop the pods.
func TestChartMaxSizeAgreesWithServe(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	for _, tc := range []struct {
		value  string
		accept bool
	}{
		{"", true}, {"0", true}, {"0B", true}, {"0GiB", true},
		{"1048576", true}, {"1048576B", true}, {"512KiB", true}, {"500MiB", true},
		{"30GiB", true}, {"1.5TiB", true}, {"1TiB", true},
		{"1%", true}, {"30%", true}, {"99.5%", true}, {"100%", true},
		{"100.0%", true}, {"0.5%", true}, {"05%", true},
		{"1PiB", false}, {"1EiB", false}, {"30GB", false}, {"30G", false},
		{"2Gi", false}, {"30gib", false}, {"30 GiB", false}, {" 30GiB", false},
		{"1e3GiB", false}, {"+1GiB", false}, {"-1GiB", false}, {".5GiB", false},
		{"1.GiB", false}, {"GiB", false}, {"0%", false}, {"0.0%", false},
		{"100.5%", false}, {"101%", false}, {"130%", false}, {"1e1%", false},
		{"30 %", false}, {"%", false}, {"-5%", false},
		{"8388608TiB", false},
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
				if accepted != tc.accept {
					t.Errorf("chart %s %q accepted=%v, want %v (serve: %v)", value, tc.value, accepted, tc.accept, serve)
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
