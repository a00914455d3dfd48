package containerd_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"

	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// fullAcceptQueue returns host:port of a loopback listener that drops every SYN: its accept
// queue (backlog 0) is filled by one connection that is never accepted, and Linux drops SYNs to
// a listener whose accept queue is full (tcp_conn_request), so a client's connect waits for
// its SYN retries as it would for a firewalled or dead host (issue 25: "a full accept queue
// drops SYNs there too").
func fullAcceptQueue(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatalf("listen: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the queue: connect until one connect times out (the queue is full from then on).
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("filling the accept queue of %s: %v", addr, err)
			}
			return addr
		}
		t.Cleanup(func() { _ = c.Close() })
		if i == 8 {
			t.Fatalf("%s accepted %d connections with backlog 0: the kernel does not drop SYNs on a full accept queue here", addr, i+1)
		}
	}
}

// TestHostsDialTimeout (issue 25): every [host] gen writes carries dial_timeout (the mirror's,
// a migrated legacy mirror's), the server does not, and containerd's own hosts.toml loader and
// resolver read it: with the mirror dropping SYNs, a resolve falls back to the registry after
// --dial-timeout instead of containerd's 30 s. The same file without the key does not fall back
// within twice that bound (the control that the key is what does it). Fails before the change:
// no dial_timeout is written.
func TestHostsDialTimeout(t *testing.T) {
	t.Parallel()
	reg := mirrortest.NewRegistry(t)
	reg.PushImage(t, "library/alpine", "latest", mirrortest.Image(t, 1024, 1, "linux/amd64"))
	host := reg.Addr // a loopback registry, reached over http (the --upstream NAME=URL fallback)
	mirror := fullAcceptQueue(t)
	root := bootstraptest.HostRoot(t, map[string]string{containerd.DefaultConfig: siteConfig +
		"\n[plugins.'io.containerd.cri.v1.images'.registry.mirrors.'legacy.test']\n  endpoint = ['https://mirror.legacy.test']\n"})
	const dial = 300 * time.Millisecond
	opts := containerd.Options{Mirror: bootstraptest.Mirror(t, "http://"+mirror), Upstreams: []string{host, "legacy.test"},
		Fallbacks: map[string]string{host: "http://" + host}, Daemon: containerd.Release{Major: 2, Minor: 4, Patch: 2},
		Migrate: true, DialTimeout: dial}
	rep := planApply(t, root, opts, false)

	hostsDir := filepath.Join(root, rep.HostsDir)
	for h, want := range map[string]int{host: 1, "legacy.test": 2} {
		data, err := os.ReadFile(filepath.Join(hostsDir, name.HostDir(h), "hosts.toml"))
		if err != nil {
			t.Fatal(err)
		}
		tables, timeouts := strings.Count(string(data), "[host."), strings.Count(string(data), "\ndial_timeout = '300ms'\n")
		if tables != want || timeouts != want {
			t.Errorf("%s: %d [host] tables and %d dial_timeout = '300ms' lines, want %d each (the server none):\n%s", h, tables, timeouts, want, data)
		}
	}

	hosts := config.ConfigureHosts(t.Context(), config.HostOptions{HostDir: config.HostDirFromRoot(hostsDir)})
	resolve := func(limit time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(t.Context(), limit)
		defer cancel()
		start := time.Now()
		_, _, err := docker.NewResolver(docker.ResolverOptions{Hosts: hosts}).Resolve(ctx, host+"/library/alpine:latest")
		return time.Since(start), err
	}
	took, err := resolve(10 * time.Second)
	if err != nil {
		t.Fatalf("resolve with dial_timeout %s and the mirror dropping SYNs: %v", dial, err)
	}
	if took < dial || took > dial+2*time.Second {
		t.Errorf("resolve took %s, want the dial timeout %s and the registry's answer", took, dial)
	}
	if reg.Count("HEAD", "/manifests/latest") == 0 {
		t.Errorf("the registry saw no manifest HEAD: the resolve did not fall back to it: %+v", reg.Requests())
	}

	// Control: the same file without dial_timeout waits on the mirror past twice the bound.
	file := filepath.Join(hostsDir, name.HostDir(host), "hosts.toml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(string(data), "dial_timeout = '300ms'\n", "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if took, err := resolve(2 * dial); err == nil {
		t.Errorf("without dial_timeout the resolve answered in %s: the mirror's dropped SYNs did not hold it", took)
	}
}
