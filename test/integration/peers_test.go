package integration

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// peerNode is one `nodecache serve --peers` process on its own loopback address.
type peerNode struct {
	host, listen, peerListen, root, logPath string
	// cmd is the running process.
	cmd *exec.Cmd
}

// freePort returns a port free on host now.
func freePort(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listen on %s: %v", host, err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// peerCluster is the serve processes of startPeerNodes with their member list and key.
type peerCluster struct {
	nodes                []peerNode
	membersFile, keyFile string
}

// peerClusterOptions say what is special about a test's cluster.
type peerClusterOptions struct {
	// listed is how many of the nodes the member file lists at first (0: all).
	listed int
	// extra are more member addresses the file lists (members that are not serve processes).
	extra []string
	// upstreamTimeout is --upstream-timeout (default 30s: a loaded 2-core CI machine).
	upstreamTimeout string
}

// startPeerNodes starts n serve processes on 127.0.0.2 … 127.0.0.(n+1), each in front of up with
// the members file as --peers, and waits until every listed one is ready and sees the other
// listed ones live.
func startPeerNodes(t *testing.T, up *mirrortest.Registry, n int) []peerNode {
	t.Helper()
	return startPeerCluster(t, up, n, peerClusterOptions{}).nodes
}

func startPeerCluster(t *testing.T, up *mirrortest.Registry, n int, o peerClusterOptions) peerCluster {
	t.Helper()
	if o.listed == 0 {
		o.listed = n
	}
	if o.upstreamTimeout == "" {
		o.upstreamTimeout = "30s"
	}
	bin := nodecacheBinary(t)
	dir := t.TempDir()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	c := peerCluster{membersFile: filepath.Join(dir, "members"), keyFile: filepath.Join(dir, "peer.key")}
	writeFile(t, c.keyFile, []byte(hex.EncodeToString(key)+"\n"))
	c.nodes = make([]peerNode, n)
	for i := range c.nodes {
		host := fmt.Sprintf("127.0.0.%d", i+2)
		c.nodes[i] = peerNode{host: host, listen: net.JoinHostPort(host, freePort(t, host)),
			peerListen: net.JoinHostPort(host, freePort(t, host)), root: filepath.Join(dir, host),
			logPath: filepath.Join(dir, host+".log")}
	}
	c.list(t, o.listed, o.extra...)
	for i := range c.nodes {
		nd := &c.nodes[i]
		logFile, err := os.Create(nd.logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "serve", "--listen", nd.listen, "--root", nd.root,
			"--upstream", up.Addr+"="+up.URL.String(), "--default-upstream", up.Addr,
			"--peers", "file:"+c.membersFile, "--peer-listen", nd.peerListen, "--peer-key-file", c.keyFile,
			"--peers-refresh", "1s", "--upstream-timeout", o.upstreamTimeout)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		nd.cmd = cmd
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
			_ = logFile.Close()
			if t.Failed() {
				b, _ := os.ReadFile(nd.logPath)
				t.Logf("log of %s:\n%s", nd.host, tail(b, 60))
			}
		})
	}
	c.waitLive(t, o.listed, o.listed-1)
	return c
}

// list writes the member file: the peer ports of the first n nodes, then extra.
func (c peerCluster) list(t *testing.T, n int, extra ...string) {
	t.Helper()
	var members strings.Builder
	for _, nd := range c.nodes[:n] {
		fmt.Fprintln(&members, nd.peerListen)
	}
	for _, a := range extra {
		fmt.Fprintln(&members, a)
	}
	writeFile(t, c.membersFile, []byte(members.String()))
}

// waitLive waits until each of the first n nodes sees live members live.
func (c peerCluster) waitLive(t *testing.T, n, live int) {
	t.Helper()
	for _, nd := range c.nodes[:n] {
		waitForMetric(t, "http://"+nd.listen+"/metrics", fmt.Sprintf(`nodecache_peers{state="live"} %d`, live), 90*time.Second)
	}
}

// waitForMetric polls url until its body has the line want.
func waitForMetric(t *testing.T, url, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			for _, l := range strings.Split(string(b), "\n") {
				if l == want {
					return
				}
				if strings.HasPrefix(l, strings.SplitN(want, " ", 2)[0]) {
					last = l
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: no line %q within %s (last: %q)", url, want, within, last)
}

func tail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// pullAll pulls ref with go-containerregistry and validates the image (every blob fetched and
// its digest checked: validate.Image).
func pullAll(ref string) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	img, err := remote.Image(r)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	if err := validate.Image(img); err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	return nil
}

// pullEverywhere pulls ref (a repository and tag) from every node at the same moment.
func pullEverywhere(t *testing.T, nodes []peerNode, ref string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	start := make(chan struct{})
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = pullAll(nd.listen + "/" + ref)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("node %s: %v", nodes[i].host, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// imageDigests are the digests of img's manifest, config and layers.
func imageDigests(t *testing.T, img v1.Image) (manifest v1.Hash, blobs []v1.Hash) {
	t.Helper()
	manifest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	blobs = append(blobs, cfg)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, d)
	}
	return manifest, blobs
}

// checkStored checks that blob d's data file under root holds bytes of digest d.
func checkStored(t *testing.T, root string, d v1.Hash) {
	t.Helper()
	path := filepath.Join(root, "docker/registry/v2/blobs/sha256", d.Hex[:2], d.Hex, "data")
	// A fill stores its blob after its client has the last byte: give the commit 10 s.
	f, err := os.Open(path)
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); f, err = os.Open(path) {
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("%s: blob %s not stored within 10 s: %v", root, d, err)
		return
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, bufio.NewReader(f)); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.Hex {
		t.Errorf("%s: blob %s stored with sha256 %s", root, d, got)
	}
}

// checkOwnersAgree reads /nodecache/v1/peers?digest=d of every node: each lists the nine
// others live and itself listed, and all name the same owner for d.
func checkOwnersAgree(t *testing.T, nodes []peerNode, d string) {
	t.Helper()
	owners := map[string]int{}
	for _, nd := range nodes {
		resp, err := http.Get("http://" + nd.listen + mirrorapi.PeersPath + "?digest=" + d)
		if err != nil {
			t.Fatal(err)
		}
		var doc mirrorapi.Peers
		err = json.NewDecoder(resp.Body).Decode(&doc)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s%s: %d %v", nd.listen, mirrorapi.PeersPath, resp.StatusCode, err)
		}
		live := 0
		for _, m := range doc.Members {
			if m.State == mirrorapi.PeerLive {
				live++
			}
		}
		if live != len(nodes)-1 || !doc.SelfListed || doc.Self == "" || doc.Owner == "" {
			t.Errorf("%s: %+v; want %d live members, itself listed, an owner of %s", nd.host, doc, len(nodes)-1, d)
		}
		owners[doc.Owner]++
	}
	if len(owners) != 1 {
		t.Errorf("the nodes name different owners of %s: %v", d, owners)
	}
}

// TestPeersOneUpstreamFetch (issue 22): ten serve processes, each on its own loopback address
// with a file: member list, in front of one upstream registry; one client per node pulls the
// same 5-layer image at the same moment. The upstream sees exactly one GET per blob and one
// GET of the manifest by digest (each node still resolves the tag itself), every node stores
// every blob (checked on disk), and a second pull on every node takes nothing from the upstream.
func TestPeersOneUpstreamFetch(t *testing.T) {
	t.Parallel()
	up := mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, 1<<20, 5, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	manifest, blobs := imageDigests(t, img)
	nodes := startPeerNodes(t, up, 10)
	checkOwnersAgree(t, nodes, manifest.String())
	up.ResetRequests()

	pullEverywhere(t, nodes, "team/app:v1")
	for _, d := range blobs {
		if n := up.Count(http.MethodGet, "/blobs/"+d.String()); n != 1 {
			t.Errorf("the upstream saw %d GETs of blob %s, want 1 for the whole cluster", n, d)
		}
	}
	if n := up.Count(http.MethodGet, "/manifests/"+manifest.String()); n != 1 {
		t.Errorf("the upstream saw %d GETs of manifest %s, want 1 for the whole cluster", n, manifest)
	}
	for _, nd := range nodes {
		for _, d := range blobs {
			checkStored(t, nd.root, d)
		}
	}

	up.ResetRequests()
	pullEverywhere(t, nodes, "team/app:v1")
	for _, q := range up.Requests() {
		if q.Method == http.MethodGet && (strings.Contains(q.Path, "/blobs/") || strings.Contains(q.Path, "/manifests/sha256:")) {
			t.Errorf("second pull: the upstream saw %s %s; want every node to serve it from its own cache", q.Method, q.Path)
		}
	}
}
