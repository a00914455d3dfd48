package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	bcontainerd "github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestGenContainerdRealDaemons is issue 3's integration test: real containerd daemons — 2.4.x and
// 2.3.x on schema 3, 1.7.x on schema 2 — already running on a node-like config.toml, are pointed
// at a running nodecache by `gen containerd` (pkg/bootstrap/containerd Plan + bootstrap.Applier,
// what the command runs), restarted only when gen says restart_required, and then pull an image
// through CRI PullImage. nodecache's access log must show those requests with the daemon's
// User-Agent and ?ns=, the upstream must never see the daemon itself, and a second gen run must
// change nothing.
func TestGenContainerdRealDaemons(t *testing.T) {
	t.Parallel()
	type genCase struct {
		name string
		env  string
		// configPath returns the config_path the node starts with ("" = unset), given a scratch
		// directory.
		configPath  func(scratch string) string
		wantAction  bcontainerd.ConfigPathAction
		wantRestart bool
		// wantHostsDir returns where hosts.toml must land, given scratch and gen's --certs-dir.
		wantHostsDir func(scratch, certs string) string
	}
	unset := func(string) string { return "" }
	certsDir := func(_, certs string) string { return certs }
	cases := []genCase{
		// No config_path: 2.x's default is a two-directory list, broken in transfer mode, so gen
		// sets --certs-dir; 1.7 has no default, gen sets it too.
		{name: "2.4 schema 3 no config_path", env: runtimetest.EnvContainerd24, configPath: unset,
			wantAction: bcontainerd.ConfigPathSet, wantRestart: true, wantHostsDir: certsDir},
		{name: "2.3 schema 3 no config_path", env: runtimetest.EnvContainerd23, configPath: unset,
			wantAction: bcontainerd.ConfigPathSet, wantRestart: true, wantHostsDir: certsDir},
		{name: "1.7 schema 2 no config_path", env: runtimetest.EnvContainerd17, configPath: unset,
			wantAction: bcontainerd.ConfigPathSet, wantRestart: true, wantHostsDir: certsDir},
		// A single directory is adopted: hosts.toml goes there and the running daemon uses it
		// at the next pull, without a restart.
		{name: "2.4 adopts a single-directory config_path", env: runtimetest.EnvContainerd24,
			configPath: func(s string) string { return filepath.Join(s, "existing") },
			wantAction: bcontainerd.ConfigPathAdopted, wantRestart: false,
			wantHostsDir: func(s, _ string) string { return filepath.Join(s, "existing") }},
		{name: "1.7 adopts a single-directory config_path", env: runtimetest.EnvContainerd17,
			configPath: func(s string) string { return filepath.Join(s, "existing") },
			wantAction: bcontainerd.ConfigPathAdopted, wantRestart: false,
			wantHostsDir: func(s, _ string) string { return filepath.Join(s, "existing") }},
		// A ':'-list: 2.4 in transfer mode reads it as one directory (containerd #12415), so gen
		// replaces it; 1.7 splits it, so hosts.toml goes into its first directory, no restart.
		{name: "2.4 replaces a list config_path", env: runtimetest.EnvContainerd24,
			configPath: func(s string) string { return filepath.Join(s, "a") + ":" + filepath.Join(s, "b") },
			wantAction: bcontainerd.ConfigPathSet, wantRestart: true, wantHostsDir: certsDir},
		{name: "1.7 uses the first directory of a list config_path", env: runtimetest.EnvContainerd17,
			configPath: func(s string) string { return filepath.Join(s, "a") + ":" + filepath.Join(s, "b") },
			wantAction: bcontainerd.ConfigPathFirstOfList, wantRestart: false,
			wantHostsDir: func(s, _ string) string { return filepath.Join(s, "a") }},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			bin := requireContainerd(t, tc.env)

			nc := startAppNodecache(t, 64*1024, 2)
			upstream, host := nc.Upstream, nc.UpstreamHost

			scratch := t.TempDir()
			certs := filepath.Join(scratch, "certs.d")
			initial := tc.configPath(scratch)
			for _, d := range filepath.SplitList(initial) {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			// The node's containerd is running before gen, as on a real node.
			c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: initial})
			opts := genOptions(t, c, nc.URL, host, certs)
			ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
			defer cancel()

			rep, err := bcontainerd.Plan(os.DirFS("/"), opts)
			if err != nil {
				t.Fatalf("gen containerd on %s (containerd %s):\n%s\n%v", c.ConfigFile(), c.Version(), readFile(t, c.ConfigFile()), err)
			}
			if rep.ConfigPathAction != tc.wantAction || rep.RestartRequired != tc.wantRestart {
				t.Errorf("gen: config_path action %q, restart_required %v; want %q, %v (report %+v)",
					rep.ConfigPathAction, rep.RestartRequired, tc.wantAction, tc.wantRestart, rep)
			}
			if want := tc.wantHostsDir(scratch, certs); rep.HostsDir != want {
				t.Errorf("gen: hosts dir %q, want %q", rep.HostsDir, want)
			}
			if err := (bootstrap.Applier{Root: "/"}).Apply(ctx, rep.Changes); err != nil {
				t.Fatalf("apply gen's changes: %v", err)
			}
			if _, err := os.Stat(filepath.Join(rep.HostsDir, name.HostDir(host), "hosts.toml")); err != nil {
				t.Fatalf("gen wrote no hosts.toml for %s: %v", host, err)
			}
			if rep.RestartRequired {
				c.Restart(t) // what the operator does when gen prints restart_required
			}

			upstream.ResetRequests()
			ref := host + "/team/app:v1"
			if _, err := c.PullImage(ctx, ref); err != nil {
				t.Fatalf("containerd %s after gen: %v\nconfig.toml:\n%s", c.Version(), err, readFile(t, c.ConfigFile()))
			}
			lines := nc.Requests(t)
			t.Logf("containerd %s pulled %s through nodecache: %d access-log lines", c.Version(), ref, len(lines))
			checkAccessLog(t, lines, c.UserAgent(), host)
			for _, r := range upstream.Requests() {
				if strings.HasPrefix(r.UserAgent, "containerd/") {
					t.Errorf("upstream saw containerd itself (bypass): %s %s", r.Method, r.Path)
				}
			}

			// Idempotent: a second run plans no write.
			again, err := bcontainerd.Plan(os.DirFS("/"), opts)
			if err != nil {
				t.Fatalf("second gen run: %v", err)
			}
			if bootstrap.AnyChanged(again.Changes) || again.RestartRequired {
				t.Errorf("second gen run changes %+v (restart_required %v), want nothing", again.Changes, again.RestartRequired)
			}
		})
	}
}

// readFile returns a file's contents for failure messages.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(b)
}

// TestGenContainerdCommandAndRemove drives the built binary as an operator would: `nodecache gen
// containerd … --output json` on a running daemon's config.toml, restart, a CRI pull through
// nodecache; then `gen containerd --remove`, which must restore config.toml byte for byte and
// ask for a restart, after which the daemon no longer reaches nodecache.
func TestGenContainerdCommandAndRemove(t *testing.T) {
	t.Parallel()
	for _, v := range []struct{ name, env string }{
		{"2.4", runtimetest.EnvContainerd24},
		{"1.7", runtimetest.EnvContainerd17},
	} {
		t.Run("containerd-"+v.name, func(t *testing.T) {
			t.Parallel()
			bin := requireContainerd(t, v.env)

			nc := startAppNodecache(t, 64*1024, 1)
			host := nc.UpstreamHost
			nc.Upstream.PushImage(t, "team/app", "v2", mirrortest.Image(t, 64*1024, 1, "linux/amd64"))

			c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{})
			original := readFile(t, c.ConfigFile())
			certs := filepath.Join(t.TempDir(), "certs.d")
			args := []string{"gen", "containerd", "--mirror", nc.URL, "--upstream", host,
				"--containerd-config", c.ConfigFile(), "--certs-dir", certs,
				"--containerd-version", c.Version(), "--output", "json"}

			var rep struct {
				RestartRequired bool   `json:"restart_required"`
				ConfigPath      string `json:"config_path"`
				HostsDir        string `json:"hosts_dir"`
			}
			runNodecacheJSON(t, args, &rep)
			if !rep.RestartRequired || rep.ConfigPath != certs || rep.HostsDir != certs {
				t.Fatalf("gen containerd: restart_required %v, config_path %q, hosts_dir %q; want true, %q, %q",
					rep.RestartRequired, rep.ConfigPath, rep.HostsDir, certs, certs)
			}
			c.Restart(t)
			ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
			defer cancel()
			if _, err := c.PullImage(ctx, host+"/team/app:v1"); err != nil {
				t.Fatalf("containerd %s after gen: %v", c.Version(), err)
			}
			checkAccessLog(t, nc.Requests(t), c.UserAgent(), host)

			runNodecacheJSON(t, append(args, "--remove"), &rep)
			if !rep.RestartRequired {
				t.Errorf("gen containerd --remove: restart_required false, want true (config.toml restored)")
			}
			if got := readFile(t, c.ConfigFile()); got != original {
				t.Errorf("after --remove config.toml =\n%s\nwant the original\n%s", got, original)
			}
			if _, err := os.Stat(filepath.Join(certs, name.HostDir(host), "hosts.toml")); !os.IsNotExist(err) {
				t.Errorf("after --remove hosts.toml still there (stat err %v)", err)
			}
			c.Restart(t)
			before := len(nc.Requests(t))
			if _, err := c.PullImage(ctx, host+"/team/app:v2"); err == nil {
				t.Errorf("containerd %s pulled v2 after --remove; want a failure (its default for upstream.test is https, the upstream speaks http)", c.Version())
			}
			if after := len(nc.Requests(t)); after != before {
				t.Errorf("nodecache saw %d requests after --remove, want 0", after-before)
			}
		})
	}
}

// runNodecacheJSON runs the nodecache binary with args (servetest.Run), requires exit 0 and decodes its stdout
// into out.
func runNodecacheJSON(t *testing.T, args []string, out any) {
	t.Helper()
	r := servetest.Run(t, args...)
	if r.Exit != 0 {
		t.Fatalf("nodecache %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.Exit, r.Stdout, r.Stderr)
	}
	if err := json.Unmarshal(r.Stdout, out); err != nil {
		t.Fatalf("nodecache %s: stdout is not JSON: %v\n%s", strings.Join(args, " "), err, r.Stdout)
	}
}

// TestGenContainerdNativeSchema (newuser2 items 10 and 11): the config.toml gen writes when
// there is none, or when it has no setting at all (empty: every containerd runs on its
// defaults), is one each real containerd loads without migrating: `containerd config dump` logs
// neither "Configuration migrated from version N" (2.x, whose version.ConfigVersion is 4 from
// 2.3) nor the 1.x deprecation of version 1, and reads config_path from it. Only the config is
// loaded; no daemon starts, so no root is needed.
func TestGenContainerdNativeSchema(t *testing.T) {
	t.Parallel()
	for _, v := range runtimetest.Containerds() {
		for _, existing := range []string{"none", "empty"} {
			t.Run("containerd-"+v.Name+"-"+existing, func(t *testing.T) {
				t.Parallel()
				bin := runtimetest.Binary(t, v.Env)
				out, err := exec.CommandContext(t.Context(), bin, "--version").Output()
				if err != nil {
					t.Fatalf("%s --version: %v", bin, err)
				}
				version := strings.Fields(string(out))[2] // "containerd <repo> v2.4.2 <commit>"
				root := t.TempDir()
				if existing == "empty" {
					if err := os.MkdirAll(filepath.Join(root, "etc/containerd"), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(root, "etc/containerd/config.toml"), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				var rep struct {
					Schema int `json:"schema"`
				}
				runNodecacheJSON(t, []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000",
					"--upstream", "docker.io", "--containerd-version", version, "--output", "json", "--log-level", "error"}, &rep)
				cfg := filepath.Join(root, "etc/containerd/config.toml")
				dump := exec.CommandContext(t.Context(), bin, "--config", cfg, "config", "dump")
				var stdout, stderr bytes.Buffer
				dump.Stdout, dump.Stderr = &stdout, &stderr
				if err := dump.Run(); err != nil {
					t.Fatalf("containerd %s config dump: %v\n%s", version, err, stderr.String())
				}
				if strings.Contains(stderr.String(), "level=warning") {
					t.Errorf("containerd %s warns on the config gen wrote (schema %d):\n%s\n%s", version, rep.Schema, stderr.String(), readFile(t, cfg))
				}
				if !strings.Contains(stdout.String(), "config_path = '/etc/containerd/certs.d'") && !strings.Contains(stdout.String(), `config_path = "/etc/containerd/certs.d"`) {
					t.Errorf("containerd %s does not read config_path /etc/containerd/certs.d from it:\n%s", version, stdout.String())
				}
			})
		}
	}
}
