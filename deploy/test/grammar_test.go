package test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// grammarCase is one chart value: at path (dotted; a list value gets the string as its only
// item), value is rendered; want is "" when it renders, else a text both the chart's refusal
// and the deciding side's answer contain — for values that reach nodecache the binary's own
// message, for the rest what the Kubernetes or Prometheus library says ("" there: it must
// refuse too).
type grammarCase struct {
	path, value, want string
}

// grammarCases: every value values.schema.json once matched with a pattern (issue 26: the
// schema refused `upstreams={docker.io=https://…,ghcr.io}`, `maxSize=30GB`,
// `chain=nodecache-regional:5000` with raw regular expressions).
var grammarCases = []grammarCase{
	// --upstream NAME[=URL], repeatable or comma-separated (pkg/name ParseUpstream).
	{"upstreams", "ghcr.io", ""},
	{"upstreams", "docker.io=https://registry-1.docker.io,ghcr.io", ""},
	{"upstreams", "Docker.IO", ""},
	{"upstreams", "registry.local:5000=http://10.0.0.9:5000", ""},
	{"upstreams", "[::1]:5000=http://[::1]:5000", ""},
	{"upstreams", "a=HTTPS://X:443/", ""},
	{"upstreams", "a= https://x ", ""},
	{"upstreams", "a=https://[fd00::1.2.3.4]", ""},
	{"upstreams", "docker.io=offline", ""},
	{"upstreams", "ghcr.io= OFFLINE ", ""},
	{"upstreams", "ghcr.io=ofline", `--upstream ghcr.io: URL "ofline": did you mean offline? want http://HOST[:PORT], https://HOST[:PORT], or offline (serve what the cache holds, never ask the upstream)`},
	{"upstreams", "ghcr.io=Off-Line", `--upstream ghcr.io: URL "Off-Line": did you mean offline?`},
	{"upstreams", "ghcr.io=offlines://", `--upstream ghcr.io: URL "offlines://": did you mean offline?`},
	{"upstreams", "ghcr.io=offlien", `--upstream ghcr.io: URL "offlien": did you mean offline?`},
	{"upstreams", "ghcr.io=airgapped", `--upstream ghcr.io: URL "airgapped": did you mean offline?`},
	{"upstreams", "ghcr.io=online", `--upstream ghcr.io: URL "online": no scheme: did you mean http://online?`},
	{"upstreams", "ghcr.io=oxxxxxx", `--upstream ghcr.io: URL "oxxxxxx": no scheme: did you mean http://oxxxxxx?`},
	{"upstreams", "docker.io=registry-1.docker.io", `--upstream docker.io: URL "registry-1.docker.io": no scheme: did you mean http://registry-1.docker.io?`},
	{"upstreams", "docker.io=ftp://x", `--upstream docker.io: URL "ftp://x": scheme "ftp": want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"upstreams", "ghcr.io/x", `--upstream: registry name "ghcr.io/x": want a host such as ghcr.io, registry.local:5000 or [::1]:5000 (no scheme, path or credentials)`},
	{"upstreams", "=https://x", `--upstream: empty registry name: want a host such as ghcr.io or registry.local:5000`},
	{"upstreams", "a:0", `--upstream: registry name "a:0": port 0 is out of range: want 1 to 65535`},
	{"upstreams", "a:99999999999", `--upstream: registry name "a:99999999999": port "99999999999" is not a number: want 1 to 65535`},
	{"upstreams", "[::ffff:102:304]", `--upstream: registry name "[::ffff:102:304]": [::ffff:102:304] is not an IPv6 address`},
	{"upstreams", "[1::2::3]", `--upstream: registry name "[1::2::3]": [1::2::3] is not an IPv6 address`},
	{"upstreams", "docker.io=https://u:p@x", `--upstream docker.io: URL "https://u:xxxxx@x": credentials (user:password@) are not accepted: want http://HOST[:PORT] or https://HOST[:PORT]; nodecache pulls anonymously`},
	{"upstreams", "a=https://x/v2", `--upstream a: URL "https://x/v2": path "/v2" is not accepted: want http://HOST[:PORT] or https://HOST[:PORT] (the registry API is at /v2/ of the host)`},
	{"upstreams", "a=https://x:99999", `--upstream a: URL "https://x:99999": port 99999 is out of range: want 1 to 65535`},
	{"upstreams", "a=https://x:", `--upstream a: URL "https://x:": empty port: want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"upstreams", "a=https://x:ab", `--upstream a: URL "https://x:ab": not a URL (invalid port ":ab" after host): want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"upstreams", "a=https://x?y", `--upstream a: URL "https://x?y": a query is not accepted: want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"upstreams", "a=https://x#", `--upstream a: URL "https://x#": a fragment is not accepted: want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"upstreams", "a=", `--upstream a: URL: required: want http://HOST[:PORT] or https://HOST[:PORT], e.g. http://10.0.0.5:5000`},
	{"upstreams", "a=https://x y", `--upstream a: URL "https://x y": character ' ' at byte 9: want http://HOST[:PORT] or https://HOST[:PORT] (ASCII, no spaces)`},
	{"upstreams", "a=https://x_y", `--upstream a: URL "https://x_y": host "x_y" is not a DNS name or IP address: want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"upstreams", "a=https://[fe80::1%25eth0]", `host [fe80::1%eth0] is not an IPv6 address without zone`},
	{"upstreams", "a=http://", `--upstream a: URL "http://": no host: want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"upstreams", "docker.io,docker.io", `--upstream: "docker.io" is configured twice`},
	{"upstreams", "docker.io,index.docker.io", `--upstream: "index.docker.io" is configured twice (as "docker.io": the same registry)`},
	{"upstreams", ",", `--upstream is empty (an empty --upstream or NODECACHE_UPSTREAM= gives none)`},
	// --upstream-auth NAME=FILE, NAME among the upstreams (the default set here).
	{"upstreamAuth.upstreams", "docker.io", ""},
	{"upstreamAuth.upstreams", "index.docker.io", ""},
	{"upstreamAuth.upstreams", "GHCR.io", ""},
	{"upstreamAuth.upstreams", "registry.local:5000", `registry.local:5000 is not among the --upstream names docker.io, ghcr.io, registry.k8s.io, quay.io, gcr.io`},
	{"upstreamAuth.upstreams", "ghcr.io/x", `registry name "ghcr.io/x": want a host such as ghcr.io, registry.local:5000 or [::1]:5000`},
	// --pull-allow CIDRs (netip.ParsePrefix).
	{"pullAllow", "10.0.0.0/8", ""},
	{"pullAllow", "10.0.0.1/8", ""},
	{"pullAllow", "10.0.0.0/8,fd00::/8", ""},
	{"pullAllow", " 10.0.0.0/8", ""},
	{"pullAllow", "::ffff:10.0.0.0/104", ""},
	{"pullAllow", "0.0.0.0/0", ""},
	{"pullAllow", "10.0.0.1", `--pull-allow "10.0.0.1": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"pullAllow", "10.0.0.0/33", `--pull-allow "10.0.0.0/33": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"pullAllow", "010.0.0.0/8", `--pull-allow "010.0.0.0/8": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"pullAllow", "10.0.0.0/08", `--pull-allow "10.0.0.0/08": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"pullAllow", "256.0.0.0/8", `--pull-allow "256.0.0.0/8": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"pullAllow", "fd00::/129", `--pull-allow "fd00::/129": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"pullAllow", "fe80::1%eth0/64", `--pull-allow "fe80::1%eth0/64": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"pullAllow", "nodes", `--pull-allow "nodes": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"allow", "10.244.0.0/16", ""},
	{"allow", "10.244.0.0/16,fd00::/8", ""},
	{"allow", "10.244.0.1", `--allow "10.244.0.1": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	{"allow", "pods", `--allow "pods": want a CIDR such as 10.0.0.0/8 or fd00::/8`},
	// --max-size, the shared cache's and the agent's (pkg/mirror ParseMaxSize).
	{"maxSize", "30GiB", ""},
	{"maxSize", "1.5TiB", ""},
	{"maxSize", "1048576", ""},
	{"maxSize", "0", ""},
	{"maxSize", "0B", ""},
	{"maxSize", "30%", ""},
	{"maxSize", "100.0%", ""},
	{"maxSize", "30GB", `--max-size "30GB": decimal and short units are not accepted; did you mean 30GiB? (want a size in binary units such as 500MiB, 30GiB or 1TiB, or a share of the filesystem holding --root such as 30%)`},
	{"maxSize", "2Gi", `--max-size "2Gi": decimal and short units are not accepted; did you mean 2GiB?`},
	{"maxSize", "1PiB", `--max-size "1PiB": unknown unit "PiB": want a size in binary units`},
	{"maxSize", "30 GiB", `--max-size "30 GiB": unknown unit " GiB"`},
	{"maxSize", "130%", `--max-size "130%": a share must be more than 0% and at most 100%`},
	{"maxSize", "0%", `--max-size "0%": a share must be more than 0% and at most 100%`},
	{"maxSize", "1e1%", `--max-size "1e1%": not a share`},
	{"maxSize", "1e3GiB", `--max-size "1e3GiB": not a size`},
	{"maxSize", ".5GiB", `--max-size ".5GiB": not a size`},
	{"maxSize", "8388608TiB", `--max-size "8388608TiB": not a size`},
	{"maxSize", "0.5", `--max-size "0.5": less than one byte (a cap of 0 would mean no cap; 0 says so)`},
	{"agent.maxSize", "20%", ""},
	{"agent.maxSize", "", ""},
	{"agent.maxSize", "30GB", `--max-size "30GB": decimal and short units are not accepted; did you mean 30GiB?`},
	// --chain (pkg/name ParseURL).
	{"chain", "http://nodecache-regional.nodecache.svc.cluster.local:5000", ""},
	{"chain", "https://10.0.0.5/", ""},
	{"chain", "nodecache-regional:5000", `--chain "nodecache-regional:5000": no scheme: did you mean http://nodecache-regional:5000?`},
	{"chain", "http://cache:5000/v2", `--chain "http://cache:5000/v2": path "/v2" is not accepted`},
	{"chain", "cache:5000/v2", `--chain "cache:5000/v2": no scheme: want http://HOST[:PORT] or https://HOST[:PORT]`},
	{"chain", "1http://x", `--chain "1http://x": not a URL (first path segment in URL cannot contain colon)`},
	// Durations of nodecache's flags (Go's time.ParseDuration), positive.
	{"agent.interval", "1m30s", ""},
	{"agent.interval", "1.5h", ""},
	{"agent.interval", "60", `--interval "60": want a duration such as 500ms, 30s, 5m or 1h30m`},
	{"agent.interval", "1 m", `--interval "1 m": want a duration such as 500ms, 30s, 5m or 1h30m`},
	{"agent.interval", "0s", `want a positive duration such as 30s or 1m (default 1m0s)`},
	{"agent.interval", "-1m", `want a positive duration such as 30s or 1m (default 1m0s)`},
	{"agent.dialTimeout", "2s", ""},
	{"agent.dialTimeout", "750ms", ""},
	{"agent.dialTimeout", "2", `--dial-timeout "2": want a duration such as 500ms, 30s, 5m or 1h30m`},
	{"agent.dialTimeout", "0", `want a positive duration such as 2s, 500ms or 1m (default 2s)`},
	{"agent.dialTimeout", "-2s", `want a positive duration such as 2s, 500ms or 1m (default 2s)`},
	{"peers.refresh", "500ms", ""},
	{"peers.refresh", "10", `--peers-refresh "10": want a duration such as 500ms, 30s, 5m or 1h30m`},
	{"peers.refresh", "0s", `--peers-refresh 0s and --peer-dial-timeout 1s: want positive durations such as 10s and 1s`},
	{"peers.dialTimeout", "250ms", ""},
	{"peers.dialTimeout", "1sec", `--peer-dial-timeout "1sec": want a duration such as 500ms, 30s, 5m or 1h30m`},
	// The scrape interval (the Prometheus Operator's Duration, Prometheus' model.ParseDuration).
	{"metrics.interval", "1d", ""},
	{"metrics.interval", "1h30m", ""},
	{"metrics.interval", "30", `metrics.interval "30": want a Prometheus duration`},
	{"metrics.interval", "30m1h", `metrics.interval "30m1h": want a Prometheus duration`},
	{"metrics.interval", "1.5m", `metrics.interval "1.5m": want a Prometheus duration`},
	// Image references: warm's (the binary), the pause image and the nodecache image's (the
	// kubelet's: the same distribution grammar; checked with warm's parser here).
	{"warm.images", "nginx", ""},
	{"warm.images", "Registry.Example.com:5000/team/app:v1", ""},
	{"warm.images", "[::1]:5000/app", `image reference "[::1]:5000/app" refused: shell metacharacter '[' at byte 0`},
	{"warm.images", "nginx\t", `image reference "nginx\t" refused: control character '\t' at byte 5`},
	{"warm.images", "nginx\u00a0", `image reference "nginx\u00a0" refused: whitespace '\u00a0' at byte 5`},
	{"warm.images", "nginxé", `image reference "nginxé" refused: non-ASCII character 'é' at byte 5`},
	{"warm.images", "ghcr.io/x/y@sha512:" + strings.Repeat("ab", 64), ""},
	{"warm.images", "nginx:1.27@sha256:" + strings.Repeat("0", 64), ""},
	{"warm.images", "nginx latest", `image reference "nginx latest" refused: whitespace ' ' at byte 5; a reference is name[:tag][@digest] made of letters, digits and . _ - : / @`},
	{"warm.images", "NGINX", `image reference "NGINX" refused: not a reference by the distribution grammar (name[:tag][@digest])`},
	{"warm.images", "nginx:", `image reference "nginx:" refused: not a reference by the distribution grammar (name[:tag][@digest])`},
	{"warm.images", "ghcr.io/a/b@sha256:abc", `image reference "ghcr.io/a/b@sha256:abc" refused: not a reference by the distribution grammar`},
	{"warm.images", "ghcr.io/a/b@sha256:" + strings.Repeat("A", 64), `refused: not a reference by the distribution grammar`},
	{"warm.images", strings.Repeat("0", 64), `refused: not a reference by the distribution grammar`},
	{"warm.images", "x/" + strings.Repeat("a", 253), ""},
	{"warm.images", "x/" + strings.Repeat("a", 254), `refused: not a reference by the distribution grammar`},
	{"warm.images", strings.Repeat("a", 247), ""}, // library/ counts: 255 characters
	{"warm.images", strings.Repeat("a", 248), `refused: not a reference by the distribution grammar`},
	{"cleanup.pauseImage", "registry.k8s.io/pause:3.10.1", ""},
	{"cleanup.pauseImage", "registry.k8s.io/pause:3.10.1@sha256:" + strings.Repeat("1", 64), ""},
	{"cleanup.pauseImage", "registry.k8s.io/Pause:3.10", `image reference "registry.k8s.io/Pause:3.10" refused: not a reference by the distribution grammar`},
	{"image.repository", "registry.example.com/you/nodecache", ""},
	{"image.repository", "localhost:5000/nodecache", ""},
	{"image.repository", "Registry.Example.com/You/nodecache", `image reference "Registry.Example.com/You/nodecache:v0.1.0" refused: not a reference by the distribution grammar`},
	{"image.tag", "e131d2f-dirty", ""},
	{"image.tag", "v1 ", `image reference "ghcr.io/nodecache/nodecache:v1 " refused: `},
	{"image.tag", "-v1", `image reference "ghcr.io/nodecache/nodecache:-v1" refused: not a reference by the distribution grammar`},
	// warm --platform (pkg/warm ParsePlatform).
	{"warm.platform", "linux/arm64", ""},
	{"warm.platform", "linux/arm/v7", ""},
	{"warm.platform", "Linux/AMD64", ""},
	{"warm.platform", "amd64", `--platform "amd64" refused: want os/arch[/variant], e.g. linux/amd64`},
	{"warm.platform", "linux/arm/v7/x", `--platform "linux/arm/v7/x" refused: want os/arch[/variant], e.g. linux/amd64`},
	// Kubernetes names (RFC 1123 subdomains).
	{"upstreamAuth.secretName", "hub-pull.v2", ""},
	{"upstreamAuth.secretName", "Hub_Pull", `upstreamAuth.secretName "Hub_Pull": want the name of a Secret`},
	{"peers.keySecret", "nodecache-peer-key", ""},
	{"peers.keySecret", "-key", `peers.keySecret "-key": want the name of a Secret`},
	{"shared.storage.s3.secretName", "nodecache-s3", ""},
	{"shared.storage.s3.secretName", "s3 creds", `shared.storage.s3.secretName "s3 creds": want the name of a Secret`},
	{"peers.clusterDomain", "k8s.example", ""},
	{"peers.clusterDomain", "cluster.local.", `peers.clusterDomain "cluster.local.": want the cluster's DNS domain`},
	// The node's cache directory (a hostPath) and the PVC's size (a quantity).
	{"agent.cachePath", "/data/nodecache", ""},
	{"agent.cachePath", "var/lib/nodecache", `agent.cachePath "var/lib/nodecache": want an absolute host path`},
	{"agent.cachePath", "/var/lib/../nodecache", `agent.cachePath "/var/lib/../nodecache": want an absolute host path without '..'`},
	{"shared.persistence.size", "200G", ""},
	{"shared.persistence.size", "1e11", ""},
	{"shared.persistence.size", "0.5Ti", ""},
	{"shared.persistence.size", "lots", `shared.persistence.size "lots": want a Kubernetes quantity`},
	{"shared.persistence.size", "50GB", `shared.persistence.size "50GB": want a Kubernetes quantity`},
	// --s3-endpoint (pkg/mirror S3Storage.validate).
	{"shared.storage.s3.endpoint", "https://minio.storage:9000", ""},
	{"shared.storage.s3.endpoint", "HTTP://minio/", ""},
	{"shared.storage.s3.endpoint", "minio.storage:9000", `--s3-endpoint "minio.storage:9000": want http(s)://HOST[:PORT], e.g. https://minio.storage:9000`},
	{"shared.storage.s3.endpoint", "https://minio/bucket", `--s3-endpoint "https://minio/bucket": want http(s)://HOST[:PORT]`},
	// extraArgs: flags only.
	{"extraArgs", "--tag-ttl=5m", ""},
	{"extraArgs", "-log-level=debug", ""},
	{"extraArgs", "foo", `takes no arguments, got "foo"`},
}

// TestChartValueGrammar (issue 26): each value of grammarCases is rendered, and decided by what
// the value feeds — the nodecache binary for its flags (exit 2 naming the flag, or a later
// refusal showing the value passed), Kubernetes' and Prometheus' parsers for the rest. Both
// accept, or both refuse and both say want; the chart's refusal also names the value's path
// and is a template failure (a sentence), never the schema's regular expression.
func TestChartValueGrammar(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	dir := t.TempDir()
	creds := filepath.Join(dir, "config.json")
	writeFile(t, creds, `{"auths":{"https://index.docker.io/v1/":{"auth":"dTpw"},"ghcr.io":{"auth":"dTpw"}}}`)
	paths := map[string]bool{}
	for _, tc := range grammarCases {
		paths[tc.path] = true
		t.Run(tc.path+"="+tc.value, func(t *testing.T) {
			t.Parallel()
			_, _, err := renderValues(c, "nodecache", "nodecache", grammarValues(tc.path, tc.value), false)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("chart refused it: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("chart rendered it; want a refusal saying %q", tc.want)
			case tc.want != "" && (!strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path)):
				t.Errorf("chart's refusal does not name %s and say %q:\n%v", tc.path, tc.want, err)
			case tc.want != "" && strings.Contains(err.Error(), "values don't meet the specifications of the schema"):
				t.Errorf("the schema refused it, not a template sentence: %v", err)
			}
			accepted, answer := decide(t, dir, creds, tc.path, tc.value)
			switch {
			case tc.want == "" && !accepted:
				t.Errorf("the chart accepts what %s refuses:\n%s", tc.path, answer)
			case tc.want != "" && accepted:
				t.Errorf("the chart refuses what %s accepts:\n%s", tc.path, answer)
			case tc.want != "" && !strings.Contains(answer, tc.want) && !strings.HasPrefix(answer, "library:"):
				t.Errorf("the binary does not say %q:\n%s", tc.want, answer)
			}
		})
	}
	schema := string(readRepoFile(t, "charts/nodecache/values.schema.json"))
	if strings.Contains(schema, `"pattern"`) {
		t.Errorf("values.schema.json has a pattern again: Helm prints it as a raw regular expression; check the value in _validate.tpl")
	}
	if len(paths) < 24 {
		t.Errorf("grammarCases cover %d values, want the 22 the schema once matched with a pattern, agent.maxSize and agent.dialTimeout", len(paths))
	}
}

// grammarValues are chart values with value at path, a list item where the value is a list;
// the mode the value applies in, and what it needs (upstreamAuth a Secret, s3 the type).
func grammarValues(path, value string) map[string]any {
	v := map[string]any{}
	var item any = value
	switch path {
	case "upstreams", "upstreamAuth.upstreams", "pullAllow", "allow", "warm.images", "extraArgs":
		item = []any{value}
	}
	keys := strings.Split(path, ".")
	m := v
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = item
	switch {
	case path == "maxSize" || strings.HasPrefix(path, "shared."):
		v["mode"] = "shared"
	case path == "upstreamAuth.upstreams":
		v["upstreamAuth"].(map[string]any)["secretName"] = "regcred"
	case path == "upstreamAuth.secretName":
		v["upstreamAuth"].(map[string]any)["upstreams"] = []any{"docker.io"}
	}
	return v
}

// decide asks what the value feeds whether it accepts it: the binary for nodecache's flags
// (a refusal of a flag checked after it, --listen or --host-root or the key file, shows that
// the value passed), a library for Kubernetes' and Prometheus' values (answer "library: …").
func decide(t *testing.T, dir, creds, path, value string) (bool, string) {
	t.Helper()
	root := filepath.Join(dir, "root")
	serve := func(after string, args ...string) (bool, string) {
		args = append([]string{"serve", "--root", root, "--listen", "127.0.0.1:99999"}, args...)
		out, err := exec.CommandContext(t.Context(), binary, args...).CombinedOutput()
		if err == nil {
			t.Fatalf("nodecache %v started", args)
		}
		return strings.Contains(string(out), after) && strings.Count(string(out), "\n") == 1, string(out)
	}
	warm := func(args ...string) (bool, string) {
		args = append([]string{"warm", "--mirror", "http://127.0.0.1:1", "--wait", "1ms", "--deadline", "2s"}, args...)
		out, err := exec.CommandContext(t.Context(), binary, args...).CombinedOutput()
		code := -1
		if e, ok := err.(*exec.ExitError); ok {
			code = e.ExitCode()
		}
		return code == 1 && strings.Contains(string(out), "mirror not ready"), string(out)
	}
	library := func(ok bool, what string) (bool, string) { return ok, "library: " + what }
	switch path {
	case "upstreams":
		return serve(`--listen "127.0.0.1:99999"`, "--upstream", value)
	case "upstreamAuth.upstreams":
		return serve(`--listen "127.0.0.1:99999"`, "--upstream-auth", value+"="+creds)
	case "pullAllow":
		return serve(`--listen "127.0.0.1:99999"`, "--pull-allow", value)
	case "allow":
		return serve(`--listen "127.0.0.1:99999"`, "--allow", value)
	case "maxSize", "agent.maxSize":
		return serve(`--listen "127.0.0.1:99999"`, "--max-size", value)
	case "chain":
		return serve(`--listen "127.0.0.1:99999"`, "--chain", value)
	case "shared.storage.s3.endpoint":
		return serve(`--listen "127.0.0.1:99999"`, "--storage", "s3", "--s3-bucket", "b", "--s3-endpoint", value)
	case "extraArgs":
		return serve(`--listen "127.0.0.1:99999"`, value)
	case "agent.interval", "agent.dialTimeout":
		flag := map[string]string{"agent.interval": "--interval", "agent.dialTimeout": "--dial-timeout"}[path]
		out, _ := exec.CommandContext(t.Context(), binary, "agent", "--root", root, "--host-root", filepath.Join(dir, "missing"), flag, value).CombinedOutput()
		return strings.Contains(string(out), "--host-root"), string(out)
	case "peers.refresh", "peers.dialTimeout":
		flag := map[string]string{"peers.refresh": "--peers-refresh", "peers.dialTimeout": "--peer-dial-timeout"}[path]
		out, err := exec.CommandContext(t.Context(), binary, "serve", "--root", root, "--listen", "127.0.0.1:0", "--peers", "dns:nodecache-peers.nodecache.svc:5001",
			"--peer-key-file", filepath.Join(dir, "missing"), flag, value).CombinedOutput()
		if err == nil {
			t.Fatalf("serve with a missing peer key started:\n%s", out)
		}
		return strings.Contains(string(out), "--peer-key-file"), string(out)
	case "warm.images", "cleanup.pauseImage":
		return warm(value)
	case "image.repository":
		return warm(value + ":v0.1.0")
	case "image.tag":
		return warm("ghcr.io/nodecache/nodecache:" + value)
	case "warm.platform":
		return warm("--platform", value, "nginx")
	case "metrics.interval":
		_, err := model.ParseDuration(value)
		return library(err == nil, fmt.Sprint(err))
	case "upstreamAuth.secretName", "peers.keySecret", "shared.storage.s3.secretName", "peers.clusterDomain":
		errs := validation.IsDNS1123Subdomain(value)
		return library(len(errs) == 0 && !strings.HasSuffix(value, "."), strings.Join(errs, "; "))
	case "shared.persistence.size":
		_, err := resource.ParseQuantity(value)
		return library(err == nil, fmt.Sprint(err))
	case "agent.cachePath":
		return library(filepath.IsAbs(value) && !slices.Contains(strings.Split(value, "/"), ".."), "an absolute path without ..")
	}
	t.Fatalf("no decider for %s", path)
	return false, ""
}
