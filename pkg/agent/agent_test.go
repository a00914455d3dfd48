package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// config is a valid agent Config over hostRoot, listening on a free loopback port.
func config(t *testing.T, hostRoot string, log *mirrortest.LogBuffer) Config {
	t.Helper()
	return Config{
		Registry: mirror.Config{Listen: nodecachetest.FreeAddr(t), Root: t.TempDir(), Upstreams: []string{"docker.io=https://registry-1.docker.io"},
			UpstreamTimeout: 10 * time.Second, FillTimeout: 2 * time.Hour},
		Status:    activation.Flags{Runtime: activation.RuntimeContainerd, HostRoot: hostRoot, ContainerdSocket: "/run/containerd/containerd.sock"},
		Mirror:    "http://10.0.0.5:5000",
		Interval:  time.Minute,
		Readiness: activation.ReadinessServing,
		Configure: Configure{ContainerdVersion: "1.7.27", DialTimeout: containerd.DefaultDialTimeout},
		Logger:    zerolog.New(log),
		Stdout:    log,
	}
}

// legacyConfig is a containerd 1.7 config.toml with a legacy registry.mirrors table.
const legacyConfig = `version = 2
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
  endpoint = ["https://mirror.example.com"]
`

// writeConfig writes containerd's config.toml under root and returns its path.
func writeConfig(t *testing.T, root, content string) string {
	t.Helper()
	p := filepath.Join(root, "etc/containerd/config.toml")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigureMigrate: the agent refuses legacy registry.mirrors the way gen does, naming
// --migrate, which it accepts: with it the mirrors move into hosts.toml.
func TestConfigureMigrate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		migrate bool
		logged  string
		hosts   bool
		absent  bool // no config.toml, and the socket flag names one that does not exist
	}{
		{"refused without --migrate", false, "--migrate", false, false},
		{"migrated with --migrate", true, `"message":"gen containerd"`, true, false},
		// newuser2 item 17: nothing to configure is said, not silent.
		{"no containerd on the host", false, `"not_found":["containerd (neither its config /etc/containerd/config.toml nor its socket /run/nosock exists)"],` +
			`"remedy":"check --host-root (the host's / mounted there), --runtime, --containerd-config and --containerd-socket (host paths)",` +
			`"message":"configure: no runtime configuration found to configure; nothing was written"`, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			var log mirrortest.LogBuffer
			c := config(t, root, &log)
			cfgFile := filepath.Join(root, "etc/containerd/config.toml")
			if tc.absent {
				c.Status.ContainerdSocket = "/run/nosock"
			} else {
				writeConfig(t, root, legacyConfig)
			}
			c.Configure.Migrate = tc.migrate
			c.Configure.DialTimeout = 750 * time.Millisecond
			p, err := check(c)
			if err != nil {
				t.Fatal(err)
			}
			p.configure(t.Context())
			if !strings.Contains(log.String(), tc.logged) {
				t.Errorf("log does not say %q:\n%s", tc.logged, log.String())
			}
			hosts, err := os.ReadFile(filepath.Join(root, "etc/containerd/certs.d/docker.io/hosts.toml"))
			if got := err == nil; got != tc.hosts {
				t.Errorf("hosts.toml written: %v, want %v (log:\n%s)", got, tc.hosts, log.String())
			}
			// issue 25: every [host] the agent writes (the mirror's, the migrated mirror's) has
			// --dial-timeout as its dial_timeout.
			if n, d := strings.Count(string(hosts), "[host."), strings.Count(string(hosts), "dial_timeout = '750ms'"); tc.hosts && (n != 2 || d != n) {
				t.Errorf("hosts.toml has %d [host] tables and %d dial_timeout = '750ms', want 2 of each:\n%s", n, d, hosts)
			}
			data, _ := os.ReadFile(cfgFile)
			if migrated := !bytes.Equal(data, []byte(legacyConfig)); !tc.absent && migrated != tc.migrate {
				t.Errorf("config.toml changed: %v, want %v:\n%s", migrated, tc.migrate, data)
			}
		})
	}
}

// TestCheckRefusals: every refused setting is an error matching bootstrap.ErrRefused (exit 2)
// that names the flag and what it accepts; nothing is started.
func TestCheckRefusals(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"interval", func(c *Config) { c.Interval = 0 }, "--interval 0s: want a positive duration"},
		{"dial timeout", func(c *Config) { c.Configure.DialTimeout = -time.Second }, "--dial-timeout -1s: want a positive duration such as 2s, 500ms or 1m"},
		{"dial timeout zero", func(c *Config) { c.Configure.DialTimeout = 0 }, "--dial-timeout 0s: want a positive duration"},
		{"readiness", func(c *Config) { c.Readiness = "soon" }, `--readiness "soon": want serving`},
		{"runtime", func(c *Config) { c.Status.Runtime = "docker" }, `--runtime "docker": want auto, containerd, crio or talos`},
		{"host root", func(c *Config) { c.Status.HostRoot = filepath.Join(root, "missing") }, "does not exist"},
		{"listen", func(c *Config) { c.Registry.Listen = "nonsense" }, "--listen"},
		{"mirror", func(c *Config) { c.Mirror = "ftp://x" }, "--mirror"},
		{"warm", func(c *Config) { c.Warm = []string{"nginx@sha256:short"} }, "--warm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var log mirrortest.LogBuffer
			c := config(t, root, &log)
			tc.edit(&c)
			err := Run(t.Context(), c)
			if !errors.Is(err, bootstrap.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v; want a refusal saying %q", err, tc.want)
			}
		})
	}
}

// TestRunStopsWithContext: serve, configure, warm and monitor run in one group; when the context
// ends, Run returns nil after the configure pass ran once.
func TestRunStopsWithContext(t *testing.T) {
	t.Parallel()
	var log mirrortest.LogBuffer
	root := t.TempDir()
	writeConfig(t, root, legacyConfig)
	c := config(t, root, &log)
	c.Mirror = "" // http://<listen>: the monitor asks only this loopback mirror
	c.Configure.Migrate = true
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(log.String(), `"message":"gen containerd"`) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := nodecachetest.Within(t, 30*time.Second, "Run after the context ended", func() error { return <-done }); err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), `"message":"nodecache agent"`) {
		t.Errorf("no start line:\n%s", log.String())
	}
}

// TestWarmPins (issue 24): the agent's --warm images are pinned in its own cache once warm (the
// images a node needs before it can run anything must not be evicted before it asks): the pin
// is listed by the agent's serve and written to its pins file. Fails when the agent warms
// without pinning.
func TestWarmPins(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	up.PushImage(t, "team/app", "v1", mirrortest.Image(t, 4096, 1, "linux/"+runtime.GOARCH))
	var log mirrortest.LogBuffer
	root := t.TempDir()
	writeConfig(t, root, legacyConfig)
	c := config(t, root, &log)
	c.Mirror = ""
	c.Configure.Migrate = true
	c.Registry.Upstreams = []string{"upstream.test=" + up.URL.String()}
	c.Warm = []string{"upstream.test/team/app:v1"}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c) }()
	defer func() {
		cancel()
		if err := nodecachetest.Within(t, 30*time.Second, "Run after the context ended", func() error { return <-done }); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(log.String(), `"message":"warm finished"`) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(log.String(), `"warm":true,"pinned":1,"images":1,"message":"warm finished"`) {
		t.Fatalf("the --warm image was not warmed and pinned:\n%s", log.String())
	}
	resp, err := http.Get("http://" + c.Registry.Listen + mirrorapi.CachePinsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l mirrorapi.PinList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	if len(l.Pins) != 1 || l.Pins[0].Upstream != "upstream.test" || l.Pins[0].Repository != "team/app" || l.Pins[0].Tag != "v1" || l.PinnedBytes <= 0 {
		t.Errorf("pins of the agent's serve: %+v; want upstream.test/team/app:v1", l)
	}
	if b, err := os.ReadFile(cache.PinsPath(c.Registry.Root)); err != nil || !strings.Contains(string(b), `"tag": "v1"`) {
		t.Errorf("pins file: %v\n%s", err, b)
	}
}
