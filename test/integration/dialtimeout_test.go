package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/name"
)

// TestContainerdDialTimeoutFallsBack is issue 25's "Shown by" for dial_timeout: a real
// containerd with the hosts.toml `nodecache gen containerd` writes, naming a mirror in a network
// namespace the test creates (a veth pair), where nftables (or iptables) drops every packet to
// the mirror's port, so the mirror's SYNs go unanswered. The registry is on loopback.
//
//   - Without dial_timeout (the generated file with that line taken out), the first request of a
//     pull reaches the registry only after containerd's default dialer gave up: at least 30 s.
//     This half runs once, on 2.4 only (it costs those 30 s).
//   - With the generated file (dial_timeout = '2s'), every request of the pull reaches the
//     registry within 5 s of the one before it (of the pull's start, for the first): the 2 s
//     dial_timeout and room for a loaded machine (3.1 s was seen in CI), well below 30 s; and the
//     pull succeeds: on 2.4, and on 2.3 (containerd reads the key from 2.1).
//
// Needs root (namespaces, veth, netfilter), ip and nft or iptables.
func TestContainerdDialTimeoutFallsBack(t *testing.T) {
	t.Parallel()
	bins := map[string]string{
		runtimetest.EnvContainerd24: requireContainerd(t, runtimetest.EnvContainerd24),
		runtimetest.EnvContainerd23: requireContainerd(t, runtimetest.EnvContainerd23),
	}
	ns := newDroppingNetns(t)

	// The registry, behind a front that notes when each request arrives.
	upstream := appUpstream(t, 64*1024, 3)
	front := newTimedFront(t, upstream)
	host := net.JoinHostPort(upstreamName, front.port)
	ref := host + "/team/app:v1"
	const key = "dial_timeout = '2s'\n"

	for _, env := range []string{runtimetest.EnvContainerd24, runtimetest.EnvContainerd23} {
		certs := t.TempDir()
		c := runtimetest.StartContainerd(t, bins[env], runtimetest.ContainerdConfig{ConfigPath: certs})
		mirror := "http://" + ns.mirror
		if r := servetest.Run(t, "gen", "containerd", "--mirror", mirror,
			"--upstream", host+"=http://"+host, "--containerd-config", c.ConfigFile(), "--certs-dir", certs,
			"--containerd-version", c.Version()); r.Exit != 0 {
			t.Fatalf("nodecache gen containerd for %s: exit %d\n%s%s", c.Version(), r.Exit, r.Stdout, r.Stderr)
		}
		file := filepath.Join(certs, name.HostDir(host), "hosts.toml")
		generated := []byte(readFile(t, file))
		if !bytes.Contains(generated, []byte(fmt.Sprintf("[host.'%s']\n", mirror))) || !bytes.Contains(generated, []byte(key)) {
			t.Fatalf("gen wrote no [host] for %s with %q:\n%s", mirror, key, generated)
		}
		if env == runtimetest.EnvContainerd24 {
			writeFile(t, file, bytes.Replace(generated, []byte(key), nil, 1))
			waitsOutDialer(t, c, front, ref)
			writeFile(t, file, generated)
		}
		fallsBackQuickly(t, c, front, ref)
	}
	if n := ns.accepted.Load(); n != 1 {
		t.Errorf("the mirror accepted %d connections, want 1 (the test's own check before the drop rule)", n)
	}
}

// waitsOutDialer checks a pull of ref through c without dial_timeout: its first request reaches
// the registry only after containerd's default dialer gave up on the mirror, at least 30 s. The
// pull is stopped once the registry saw it.
func waitsOutDialer(t *testing.T, c *runtimetest.Containerd, front *timedFront, ref string) {
	t.Helper()
	front.reset()
	ctx, cancel := context.WithTimeout(t.Context(), pullTimeout)
	start := time.Now()
	pulled := make(chan error, 1)
	go func() { _, err := c.PullImage(ctx, ref); pulled <- err }()
	first, ok := front.first(ctx)
	cancel()
	<-pulled
	if !ok {
		t.Fatalf("containerd %s without dial_timeout: the registry saw no request within %s", c.Version(), pullTimeout)
	}
	if waited := first.Sub(start); waited < 30*time.Second {
		t.Errorf("containerd %s without dial_timeout: the first request reached the registry after %s; want >= 30s (containerd's dialer waiting on the mirror)", c.Version(), waited.Round(time.Millisecond))
	} else {
		t.Logf("containerd %s without dial_timeout: the first request reached the registry after %s", c.Version(), waited.Round(time.Millisecond))
	}
}

// fallsBackQuickly checks a pull of ref through c with the generated hosts.toml: every request
// reaches the registry within 5 s of the one before it (of the pull's start, for the first, and
// not before containerd tried the mirror), and the pull succeeds.
func fallsBackQuickly(t *testing.T, c *runtimetest.Containerd, front *timedFront, ref string) {
	t.Helper()
	front.reset()
	start := time.Now()
	if err := criPull(t, c, ref); err != nil {
		t.Fatalf("containerd %s with dial_timeout: %v", c.Version(), err)
	}
	took := time.Since(start)
	arrivals := front.arrivals()
	if len(arrivals) < 3 {
		t.Fatalf("containerd %s: the registry saw %d requests for the pull, want the manifest and blobs: %v", c.Version(), len(arrivals), arrivals)
	}
	prev := start
	for i, a := range arrivals {
		if gap := a.at.Sub(prev); gap > 5*time.Second {
			t.Errorf("containerd %s: request %d (%s) reached the registry %s after the one before; want <= 5s (2s dial_timeout, then the registry)", c.Version(), i+1, a.what, gap.Round(time.Millisecond))
		}
		prev = a.at
	}
	if d := arrivals[0].at.Sub(start); d < 1500*time.Millisecond {
		t.Errorf("containerd %s: the first request reached the registry after %s: containerd did not try the mirror first", c.Version(), d.Round(time.Millisecond))
	}
	t.Logf("containerd %s with dial_timeout: %d requests, the pull took %s", c.Version(), len(arrivals), took.Round(time.Millisecond))
}

// droppingNetns is a network namespace reached over a veth pair, with a listener on port 5000
// (the mirror) whose packets its netfilter rule drops.
type droppingNetns struct {
	mirror   string       // host:port of the listener, reached from the host's namespace
	accepted atomic.Int64 // connections the listener accepted
}

// newDroppingNetns creates the namespace (removed when the test ends), checks that the host
// reaches the listener, then adds the drop rule and checks that a connect now times out.
func newDroppingNetns(t *testing.T) *droppingNetns {
	t.Helper()
	ip := runtimetest.Find(t, runtimetest.IP)
	nft, nftErr := exec.LookPath("nft")
	iptables, iptErr := exec.LookPath("iptables")
	if nftErr != nil && iptErr != nil {
		runtimetest.Unavailable(t, "neither nft nor iptables found: put one on $PATH (apt-get install nftables; .ci/build-tools.sh installs it)")
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(t.Context(), ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	id := fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
	nsName, hostIf, nsIf := "nodecache-dial-"+id, "ncdh"+id, "ncdn"+id
	// 198.18.0.0/15 is reserved for network tests (RFC 2544): a /30 of it for the pair.
	base := fmt.Sprintf("198.18.%d.%d", rand.IntN(256), 4*rand.IntN(64))
	hostIP, nsIP := offset(base, 1), offset(base, 2)
	run("netns", "add", nsName)
	t.Cleanup(func() {
		_ = exec.Command(ip, "netns", "del", nsName).Run()
		_ = exec.Command(ip, "link", "del", hostIf).Run()
	})
	run("link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	run("link", "set", nsIf, "netns", nsName)
	run("addr", "add", hostIP+"/30", "dev", hostIf)
	run("link", "set", hostIf, "up")
	run("-n", nsName, "addr", "add", nsIP+"/30", "dev", nsIf)
	run("-n", nsName, "link", "set", nsIf, "up")
	run("-n", nsName, "link", "set", "lo", "up")

	d := &droppingNetns{mirror: net.JoinHostPort(nsIP, "5000")}
	ln := listenInNetns(t, nsName, d.mirror)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.accepted.Add(1)
			_ = c.Close()
		}
	}()
	if c, err := net.DialTimeout("tcp", d.mirror, 5*time.Second); err != nil {
		t.Fatalf("the mirror %s in namespace %s is not reachable before the drop rule: %v", d.mirror, nsName, err)
	} else {
		_ = c.Close()
	}

	var rule *exec.Cmd
	if nftErr == nil {
		rule = exec.CommandContext(t.Context(), ip, "netns", "exec", nsName, nft, "-f", "-")
		rule.Stdin = strings.NewReader("table inet nodecache_dial {\n  chain input {\n    type filter hook input priority 0; policy accept;\n    tcp dport 5000 drop\n  }\n}\n")
	} else {
		rule = exec.CommandContext(t.Context(), ip, "netns", "exec", nsName, iptables, "-A", "INPUT", "-p", "tcp", "--dport", "5000", "-j", "DROP")
	}
	if out, err := rule.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(rule.Args, " "), err, out)
	}
	if c, err := net.DialTimeout("tcp", d.mirror, time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("the mirror %s still answers SYNs after the drop rule", d.mirror)
	}
	return d
}

// offset is the IPv4 address base+n.
func offset(base string, n int) string {
	a := net.ParseIP(base).To4()
	out := make(net.IP, 4)
	copy(out, a)
	out[3] += byte(n)
	return out.String()
}

// listenInNetns listens on addr inside the named network namespace: a goroutine locked to its
// thread joins the namespace, listens and ends, and the thread ends with it (never unlocked),
// so no other goroutine runs in that namespace. The socket stays in the namespace.
func listenInNetns(t *testing.T, nsName, addr string) net.Listener {
	t.Helper()
	var (
		ln  net.Listener
		err error
		wg  sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		f, oerr := os.Open(filepath.Join("/run/netns", nsName))
		if oerr != nil {
			err = oerr
			return
		}
		defer f.Close()
		if err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			err = fmt.Errorf("setns %s: %w", nsName, err)
			return
		}
		ln, err = net.Listen("tcp", addr)
	}()
	wg.Wait()
	if err != nil {
		t.Fatalf("listen on %s in namespace %s: %v", addr, nsName, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// timedFront is a reverse proxy on loopback in front of a registry that notes when each request
// arrives.
type timedFront struct {
	port string
	mu   sync.Mutex
	seen []arrival
	hit  chan struct{} // closed at the first request after reset
}

// arrival is one request at the front: when, and "METHOD path".
type arrival struct {
	at   time.Time
	what string
}

func newTimedFront(t *testing.T, upstream *mirrortest.Registry) *timedFront {
	t.Helper()
	f := &timedFront{hit: make(chan struct{})}
	proxy := httputil.NewSingleHostReverseProxy(upstream.URL)
	// A request whose client gave up (the pull stopped on purpose) is no failure to log.
	proxy.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, f.port, _ = net.SplitHostPort(ln.Addr().String())
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.seen = append(f.seen, arrival{at: time.Now(), what: r.Method + " " + r.URL.Path})
		if len(f.seen) == 1 {
			close(f.hit)
		}
		f.mu.Unlock()
		proxy.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
}

// reset forgets the requests seen so far.
func (f *timedFront) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen, f.hit = nil, make(chan struct{})
}

// first waits for the first request after reset and returns when it arrived; ok is false when
// ctx ended first.
func (f *timedFront) first(ctx context.Context) (time.Time, bool) {
	f.mu.Lock()
	hit := f.hit
	f.mu.Unlock()
	select {
	case <-hit:
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.seen[0].at, true
	case <-ctx.Done():
		return time.Time{}, false
	}
}

// arrivals are the requests seen since reset, in order.
func (f *timedFront) arrivals() []arrival {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]arrival(nil), f.seen...)
}
