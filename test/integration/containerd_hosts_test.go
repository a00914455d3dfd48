package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestContainerdPullsThroughHandWrittenHostsToml proves the harness on every containerd version
// .ci/build-tools.sh builds: a daemon whose config_path holds a hand-written hosts.toml for
// upstream.test:<port> pulls through CRI from the mirror it names, with containerd's User-Agent
// and ?ns=<registry host> on every request, and never contacts the upstream. Removing the
// hosts.toml (containerd re-reads it on every pull) makes the next pull miss the mirror.
//
// containerd 2.3+ runs once more on a schema-4 config.toml, whose sockets live in server plugin
// tables, to show the harness keeps such a daemon off the host's /run/containerd sockets.
func TestContainerdPullsThroughHandWrittenHostsToml(t *testing.T) {
	t.Parallel()
	type daemonCase struct {
		name, env string
		schema    int // 0: the harness default (3 for 2.x, 2 for 1.7)
	}
	var cases []daemonCase
	for _, v := range runtimetest.Containerds() {
		cases = append(cases, daemonCase{name: "containerd-" + v.Name, env: v.Env})
		if v.Name != "1.7" {
			cases = append(cases, daemonCase{name: "containerd-" + v.Name + "-schema-4", env: v.Env, schema: 4})
		}
	}
	for _, v := range cases {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			bin := requireContainerd(t, v.env)

			// The upstream is reachable but holds nothing: any request to it is a bypass.
			upstream := mirrortest.NewRegistry(t)
			host := upstreamHost(t, upstream)
			mirror := mirrortest.NewRegistry(t)
			mirror.PushImage(t, "team/app", "v1", mirrortest.Image(t, 4096, 2, "linux/amd64"))
			mirror.PushImage(t, "team/app", "v2", mirrortest.Image(t, 4096, 1, "linux/amd64"))

			certs := t.TempDir()
			hostsToml := filepath.Join(certs, name.HostDir(host), "hosts.toml")
			writeHostsToml(t, hostsToml, "", host, "http://"+mirror.Addr)

			c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs, Schema: v.schema})
			mirror.ResetRequests()
			if v.schema != 0 && c.Schema() != v.schema {
				t.Fatalf("config schema %d, want %d", c.Schema(), v.schema)
			}

			ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
			defer cancel()
			ref := host + "/team/app:v1"
			id, err := c.PullImage(ctx, ref)
			if err != nil {
				t.Fatalf("containerd %s: %v", c.Version(), err)
			}
			if id == "" {
				t.Errorf("PullImage %s returned an empty image id", ref)
			}
			if ok, err := c.HasImage(ctx, ref); err != nil || !ok {
				t.Errorf("after pull, ImageStatus %s = %v, %v; want present", ref, ok, err)
			}
			t.Logf("containerd %s pulled %s as %s through the mirror in %d requests", c.Version(), ref, id, len(mirror.Requests()))
			checkRuntimeRequests(t, mirror.Requests(), c.UserAgent(), host)
			if n := len(upstream.Requests()); n != 0 {
				t.Errorf("upstream saw %d requests, want 0 (pull bypassed the mirror): %+v", n, upstream.Requests())
			}
			if err := c.RemoveImage(ctx, ref); err != nil {
				t.Errorf("containerd %s: %v", c.Version(), err)
			}

			// Negative control: without the hosts.toml the same daemon goes to the upstream
			// (https by default, which the plain-http upstream cannot answer) and the mirror sees
			// nothing.
			if err := os.Remove(hostsToml); err != nil {
				t.Fatal(err)
			}
			mirror.ResetRequests()
			_, err = c.PullImage(ctx, host+"/team/app:v2")
			if err == nil {
				t.Errorf("containerd %s pulled %s/team/app:v2 without a hosts.toml; want a failure", c.Version(), host)
			}
			t.Logf("without hosts.toml: %v", err)
			if n := len(mirror.Requests()); n != 0 {
				t.Errorf("mirror saw %d requests without a hosts.toml, want 0", n)
			}
		})
	}
}

// TestContainerdPullsThroughNodecache runs the whole data path with a hand-written hosts.toml:
// real containerd -> CRI PullImage -> nodecache (mirror.New on loopback) -> upstream registry. It
// separates mirror problems from config-generator problems (the gen tests use the same path).
func TestContainerdPullsThroughNodecache(t *testing.T) {
	t.Parallel()
	eachContainerd(t, func(t *testing.T, bin string) {
		nc := startAppNodecache(t, 64*1024, 2)
		upstream, host := nc.Upstream, nc.UpstreamHost

		certs := t.TempDir()
		writeHostsToml(t, filepath.Join(certs, name.HostDir(host), "hosts.toml"), "", host, nc.URL)
		c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: certs})
		upstream.ResetRequests()

		if err := criPull(t, c, host+"/team/app:v1"); err != nil {
			t.Fatalf("containerd %s: %v", c.Version(), err)
		}
		checkAccessLog(t, nc.Requests(t), c.UserAgent(), host)
		// The upstream was reached by nodecache only (its fill), never by containerd.
		for _, r := range upstream.Requests() {
			if strings.HasPrefix(r.UserAgent, "containerd/") {
				t.Errorf("upstream saw containerd itself: %s %s (%s)", r.Method, r.Path, r.UserAgent)
			}
		}
		if upstream.Count("GET", "/blobs/") == 0 {
			t.Errorf("upstream saw no blob GET: nodecache did not fill from it")
		}
	})
}

// TestContainerdReadsConfigPathOnlyAtStart shows, on each real daemon, why gen reports
// restart_required: a config_path written into config.toml of a running containerd changes
// nothing until the daemon restarts; after Restart the same pull goes through the mirror.
func TestContainerdReadsConfigPathOnlyAtStart(t *testing.T) {
	t.Parallel()
	eachContainerd(t, func(t *testing.T, bin string) {
		upstream := mirrortest.NewStoppedRegistry(t, "127.0.0.1:0") // refuses: only the mirror can serve
		host := upstreamHost(t, upstream)
		mirror := mirrortest.NewRegistry(t)
		mirror.PushImage(t, "team/app", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
		certs := t.TempDir()
		writeHostsToml(t, filepath.Join(certs, name.HostDir(host), "hosts.toml"), "", host, "http://"+mirror.Addr)

		c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{})
		mirror.ResetRequests() // forget the push
		ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
		defer cancel()
		ref := host + "/team/app:v1"
		pid := c.PID()

		c.WriteConfig(t, runtimetest.ContainerdConfig{ConfigPath: certs})
		if _, err := c.PullImage(ctx, ref); err == nil {
			t.Fatalf("containerd %s pulled %s before restart; config_path should be read only at start", c.Version(), ref)
		}
		if n := len(mirror.Requests()); n != 0 {
			t.Fatalf("mirror saw %d requests before restart, want 0", n)
		}

		c.Restart(t)
		if c.PID() == pid {
			t.Fatalf("Restart kept pid %d", pid)
		}
		if _, err := c.PullImage(ctx, ref); err != nil {
			t.Fatalf("containerd %s after restart: %v", c.Version(), err)
		}
		checkRuntimeRequests(t, mirror.Requests(), c.UserAgent(), host)
	})
}

// TestContainerdListConfigPath reproduces the silent bypass gen guards against (containerd issue
// #12415, https://github.com/containerd/containerd/issues/12415): with config_path "<a>:<b>" and a hosts.toml in <a>, containerd 2.x pulling
// through the transfer service reads the list as ONE directory, ignores the hosts.toml and dials
// the upstream itself; containerd 1.7 splits the list and uses the mirror. If a containerd
// release fixes this, the 2.x case fails here: then gen may keep lists on that release.
func TestContainerdListConfigPath(t *testing.T) {
	t.Parallel()
	eachContainerd(t, func(t *testing.T, bin string) {
		upstream := mirrortest.NewStoppedRegistry(t, "127.0.0.1:0")
		host := upstreamHost(t, upstream)
		mirror := mirrortest.NewRegistry(t)
		mirror.PushImage(t, "team/app", "v1", mirrortest.Image(t, 4096, 1, "linux/amd64"))
		scratch := t.TempDir()
		a, b := filepath.Join(scratch, "a"), filepath.Join(scratch, "b")
		writeHostsToml(t, filepath.Join(a, name.HostDir(host), "hosts.toml"), "", host, "http://"+mirror.Addr)
		if err := os.MkdirAll(b, 0o755); err != nil {
			t.Fatal(err)
		}
		c := runtimetest.StartContainerd(t, bin, runtimetest.ContainerdConfig{ConfigPath: a + ":" + b})
		mirror.ResetRequests()

		ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
		defer cancel()
		_, err := c.PullImage(ctx, host+"/team/app:v1")
		usedMirror := len(mirror.Requests()) > 0
		t.Logf("containerd %s with a list config_path: mirror used %v, pull error %v", c.Version(), usedMirror, err)
		if c.Major() >= 2 {
			if err == nil || usedMirror {
				t.Errorf("containerd %s used the hosts.toml of a list config_path (pull err %v, mirror requests %d); the transfer service was expected to ignore it",
					c.Version(), err, len(mirror.Requests()))
			}
			return
		}
		if err != nil || !usedMirror {
			t.Errorf("containerd %s: pull err %v, mirror used %v; want a pull through the first directory's hosts.toml", c.Version(), err, usedMirror)
		}
	})
}
