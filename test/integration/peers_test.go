package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nodecache/nodecache/internal/nodecachetest"
	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// peerNode is one `nodecache serve --peers` process on its own loopback address.
type peerNode struct {
	*servetest.Serve
	host, peerListen string
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
	dir := t.TempDir()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	c := peerCluster{membersFile: filepath.Join(dir, "members"), keyFile: filepath.Join(dir, "peer.key")}
	writeFile(t, c.keyFile, []byte(hex.EncodeToString(key)+"\n"))
	c.nodes = make([]peerNode, n)
	for i := range c.nodes {
		host := fmt.Sprintf("127.0.0.%d", i+2)
		c.nodes[i] = peerNode{host: host, peerListen: servetest.FreeAddr(t, host)}
	}
	c.list(t, o.listed, o.extra...)
	for i := range c.nodes {
		nd := &c.nodes[i]
		nd.Serve = servetest.StartServe(t, servetest.ServeOptions{Upstream: up, Listen: servetest.FreeAddr(t, nd.host),
			Root: filepath.Join(dir, nd.host), Args: []string{"--peers", "file:" + c.membersFile,
				"--peer-listen", nd.peerListen, "--peer-key-file", c.keyFile,
				"--peers-refresh", "1s", "--upstream-timeout", o.upstreamTimeout}})
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
		servetest.WaitMetric(t, nd.URL+"/metrics", fmt.Sprintf(`nodecache_peers{state="live"} %d`, live), 90*time.Second)
	}
}

// pullValid pulls ref through a node and checks every blob (nodecachetest.PullValid).
func pullValid(ref string) error {
	_, err := nodecachetest.PullValid(context.Background(), ref)
	return err
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
			errs[i] = pullValid(nd.Listen + "/" + ref)
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

// appImage starts an upstream that holds team/app:v1, a linux/amd64 image of layers layers of
// layerSize bytes; it returns the upstream and the digests of the image's manifest and of its
// blobs (the config, then the layers).
func appImage(t *testing.T, layerSize int64, layers int) (up *mirrortest.Registry, manifest v1.Hash, blobs []v1.Hash) {
	t.Helper()
	up = mirrortest.NewRegistry(t)
	img := mirrortest.Image(t, layerSize, layers, "linux/amd64")
	up.PushImage(t, "team/app", "v1", img)
	manifest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return up, manifest, append([]v1.Hash{cfg}, mirrortest.LayerDigests(t, img)...)
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
		resp, err := http.Get("http://" + nd.Listen + mirrorapi.PeersPath + "?digest=" + d)
		if err != nil {
			t.Fatal(err)
		}
		var doc mirrorapi.Peers
		err = json.NewDecoder(resp.Body).Decode(&doc)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s%s: %d %v", nd.Listen, mirrorapi.PeersPath, resp.StatusCode, err)
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
	up, manifest, blobs := appImage(t, 1<<20, 5)
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
			checkStored(t, nd.Root, d)
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
