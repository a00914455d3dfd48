package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/servetest"
	"github.com/nodecache/nodecache/pkg/bootstrap/activation"
	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirror/peer"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// peerGet sends GET path to a peer port with the proof of keys (none when keys is nil) and the
// Via header via (none when empty).
func peerGet(t *testing.T, addr, path string, keys *peer.Keys, via string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if via != "" {
		req.Header.Set("Via", via)
	}
	if keys != nil {
		keys.Sign(req, "integration-test", time.Now())
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// loadKeys reads a key file as the nodes do.
func loadKeys(t *testing.T, path string) *peer.Keys {
	t.Helper()
	k, err := peer.LoadKeys(path, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// nodeID asks a node's peer port for its instance id.
func nodeID(t *testing.T, addr string, keys *peer.Keys) string {
	t.Helper()
	resp, body := peerGet(t, addr, peer.IDPath, keys, "")
	var a struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &a) != nil || a.ID == "" {
		t.Fatalf("%s%s: %d %s", addr, peer.IDPath, resp.StatusCode, body)
	}
	return a.ID
}

// TestPeersKeyIsTheGate (issue 22): the peer port answers a blob only to a request signed with the
// cluster key: without a proof, or with another key, 401 and nothing is fetched from the upstream;
// with the key, the blob (filled for the member). A request that already passed through the node
// (its id in Via) gets 508.
func TestPeersKeyIsTheGate(t *testing.T) {
	t.Parallel()
	up, _, blobs := appImage(t, 4096, 1)
	c := startPeerCluster(t, up, 2, peerClusterOptions{})
	node := c.nodes[0]
	keys := loadKeys(t, c.keyFile)
	otherFile := filepath.Join(t.TempDir(), "other.key")
	writeFile(t, otherFile, []byte(strings.Repeat("k", 40)+"\n"))
	path := "/v2/team/app/blobs/" + blobs[1].String() + "?ns=" + up.Addr
	up.ResetRequests()

	for _, tc := range []struct {
		name string
		keys *peer.Keys
	}{{"no proof", nil}, {"another key", loadKeys(t, otherFile)}} {
		resp, body := peerGet(t, node.peerListen, path, tc.keys, "")
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", tc.name, resp.StatusCode, body)
		}
	}
	if n := len(up.Requests()); n != 0 {
		t.Fatalf("refused peer requests reached the upstream: %v", up.Requests())
	}
	// An id request with another key is refused, counted and logged too: once a member holds
	// another key, id requests are all it sends.
	if resp, body := peerGet(t, node.peerListen, peer.IDPath, loadKeys(t, otherFile), ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("id request with another key: %d %s, want 401", resp.StatusCode, body)
	}
	servetest.WaitMetric(t, node.URL+"/metrics", `nodecache_refused_total{reason="peer_key"} 3`, 10*time.Second)
	resp, body := peerGet(t, node.peerListen, path, keys, "")
	if resp.StatusCode != http.StatusOK || digest.FromBytes(body).String() != blobs[1].String() {
		t.Fatalf("signed request: %d, %d bytes of digest %s; want 200 with blob %s", resp.StatusCode, len(body), digest.FromBytes(body), blobs[1])
	}
	id := nodeID(t, node.peerListen, keys)
	resp, body = peerGet(t, node.peerListen, path, keys, "1.1 nodecache/"+id)
	if resp.StatusCode != http.StatusLoopDetected {
		t.Errorf("a request that already passed the node: %d %s, want 508", resp.StatusCode, body)
	}
	// A member's requests are not evidence of this node's runtime: no client was seen.
	resp, body = peerGet(t, node.Listen, mirrorapi.ClientsPath, nil, "")
	var ev mirrorapi.ClientEvidence
	if err := json.Unmarshal(body, &ev); err != nil || resp.StatusCode != http.StatusOK || len(ev.Clients) != 0 {
		t.Errorf("client evidence after peer requests only: %d %s; want no client", resp.StatusCode, body)
	}
	checkStatusPeers(t, node, id)
}

// checkStatusPeers runs `nodecache status --mirror` against node (on a host root without a
// runtime: the verdict is not applicable) and checks its peer summary: one live member, this
// node listed, its id.
func checkStatusPeers(t *testing.T, node peerNode, id string) {
	t.Helper()
	// The exit code is the verdict's (not applicable here).
	out := servetest.Run(t, "status", "--host-root", t.TempDir(), "--mirror", node.URL, "--output", "json").Stdout
	var rep activation.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("status output is not the JSON report: %v\n%s", err, out)
	}
	if p := rep.Peers; p == nil || p.Live != 1 || p.Failed != 0 || !p.SelfListed || p.Self != id {
		t.Errorf("status --mirror peers = %+v; want 1 live, 0 failed, this node (%s) listed\n%s", rep.Peers, id, out)
	}
}

// TestPeersMemberAdded (issue 22): two members pull an image; a third is added to the member
// file; once every node sees it, it pulls the same image without the upstream sending a blob or
// the manifest again: the digests it now owns come from the members that held them (its
// cache-only probe), the others from their owners.
func TestPeersMemberAdded(t *testing.T) {
	t.Parallel()
	up, _, _ := appImage(t, 256<<10, 5)
	c := startPeerCluster(t, up, 3, peerClusterOptions{listed: 2})
	pullEverywhere(t, c.nodes[:2], "team/app:v1")

	c.list(t, 3)
	c.waitLive(t, 3, 2)
	up.ResetRequests()
	pullEverywhere(t, c.nodes[2:], "team/app:v1")
	for _, q := range up.Requests() {
		if q.Method == http.MethodGet && (strings.Contains(q.Path, "/blobs/") || strings.Contains(q.Path, "/manifests/sha256:")) {
			t.Errorf("the added member made the upstream send %s %s again; the cluster held it", q.Method, q.Path)
		}
	}
}

// fakeMember listens on addr as a member that answers its id (id) to the cluster key and every
// other request with serve.
func fakeMember(t *testing.T, addr, id string, keys *peer.Keys, serve http.HandlerFunc) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ids := peer.IDHandler(id, keys, time.Now)
	srv := &http.Server{ReadHeaderTimeout: time.Minute, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == peer.IDPath {
			ids.ServeHTTP(w, r)
			return
		}
		serve(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// blackholeMember is a fakeMember that never answers anything but its id: the shape of a node
// that hangs.
func blackholeMember(t *testing.T, addr, id string, keys *peer.Keys) {
	t.Helper()
	fakeMember(t, addr, id, keys, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
}

// winningID returns an id that outranks every one of ids for every digest of ds.
func winningID(t *testing.T, ids []string, ds []digest.Digest) string {
	t.Helper()
	for i := range 1_000_000 {
		cand := fmt.Sprintf("hang%06d", i)
		wins := true
		for _, d := range ds {
			members := []peer.Member{{ID: cand}}
			for _, id := range ids {
				members = append(members, peer.Member{ID: id})
			}
			if peer.Rank(members, d)[0].ID != cand {
				wins = false
				break
			}
		}
		if wins {
			return cand
		}
	}
	t.Fatal("no id outranks the nodes for every digest")
	return ""
}

// TestPeersHangingMember (issue 22): a live member that owns every digest of an image and then
// never answers does not fail a pull, and costs it one header budget
// (upstream.PeerHeaderTimeout: 6 s with a 2 s upstream timeout and the 1 s dial timeout): the
// first request that waits it out opens the member's breaker (peer.Health.Hung), and the rest of
// the pull goes to the next member or the upstream at once. Bound: one budget and the fallback
// (26 s, for a loaded CI machine).
func TestPeersHangingMember(t *testing.T) {
	t.Parallel()
	up, manifest, blobs := appImage(t, 64<<10, 3)
	c := startPeerCluster(t, up, 2, peerClusterOptions{upstreamTimeout: "2s"})
	keys := loadKeys(t, c.keyFile)
	ids := []string{nodeID(t, c.nodes[0].peerListen, keys), nodeID(t, c.nodes[1].peerListen, keys)}
	ds := []digest.Digest{digest.Digest(manifest.String())}
	for _, b := range blobs {
		ds = append(ds, digest.Digest(b.String()))
	}
	hangAddr := servetest.FreeAddr(t, "127.0.0.20")
	blackholeMember(t, hangAddr, winningID(t, ids, ds), keys)
	c.list(t, 2, hangAddr)
	c.waitLive(t, 2, 2)

	start := time.Now()
	if err := pullValid(c.nodes[0].Listen + "/team/app:v1"); err != nil {
		t.Fatalf("pull with a hanging owner: %v", err)
	}
	took := time.Since(start)
	t.Logf("pull with a hanging owner took %s", took.Round(time.Millisecond))
	budget := upstream.PeerHeaderTimeout(2*time.Second, time.Second, false)
	if limit := budget + 20*time.Second; took > limit {
		t.Errorf("pull with a hanging owner took %s, want at most one peer header budget (%s) and the fallback (%s)", took.Round(time.Second), budget, limit)
	}
}

// lyingMember is a fakeMember that serves blobs and manifests from up, every blob GET with byte
// 10 flipped; it counts the blob GETs it answered.
func lyingMember(t *testing.T, addr, id string, keys *peer.Keys, up *mirrortest.Registry) *atomic.Int64 {
	t.Helper()
	var blobGets atomic.Int64
	fakeMember(t, addr, id, keys, func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, up.URL.String()+r.URL.Path, nil)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") && len(body) > 10 {
			blobGets.Add(1)
			body[10] ^= 0xff
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
	})
	return &blobGets
}

// TestPeersWrongBytesMember (issue 22): a member that owns every blob of an image and serves
// them with a flipped byte gets nothing stored: the client's pull fails as with a bad upstream
// (a cut body), the mismatch is counted under tier="peer", and the next pull is right, from
// the upstream, without asking that member again.
func TestPeersWrongBytesMember(t *testing.T) {
	t.Parallel()
	up, _, blobs := appImage(t, 64<<10, 2)
	c := startPeerCluster(t, up, 1, peerClusterOptions{})
	keys := loadKeys(t, c.keyFile)
	node := c.nodes[0]
	var ds []digest.Digest
	for _, b := range blobs {
		ds = append(ds, digest.Digest(b.String()))
	}
	liarAddr := servetest.FreeAddr(t, "127.0.0.21")
	lies := lyingMember(t, liarAddr, winningID(t, []string{nodeID(t, node.peerListen, keys)}, ds), keys, up)
	c.list(t, 1, liarAddr)
	c.waitLive(t, 1, 1)

	if err := pullValid(node.Listen + "/team/app:v1"); err == nil {
		t.Fatal("a pull through a member that flips bytes succeeded; want the broken transfer a bad upstream gives")
	}
	if lies.Load() == 0 {
		t.Fatal("the lying member served no blob: the test did not test it")
	}
	for _, b := range blobs {
		path := filepath.Join(node.Root, "docker/registry/v2/blobs/sha256", b.Hex[:2], b.Hex, "data")
		if _, err := os.Stat(path); err == nil {
			checkStored(t, node.Root, b) // stored only if right
		}
	}
	waitForMetricAtLeast(t, node.URL+"/metrics", `nodecache_digest_mismatches_total{kind="blob",tier="peer",upstream="`+up.Addr+`"}`, 1)
	served := lies.Load()
	if err := pullValid(node.Listen + "/team/app:v1"); err != nil {
		t.Fatalf("the pull after a member served wrong bytes: %v", err)
	}
	if n := lies.Load(); n != served {
		t.Errorf("the member that served wrong bytes was asked again (%d blob GETs, %d before)", n, served)
	}
	for _, b := range blobs {
		checkStored(t, node.Root, b)
	}
}

// waitForMetricAtLeast polls url (30 s at most) until series has a value of at least min.
func waitForMetricAtLeast(t *testing.T, url, series string, min float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if v, err := servetest.Metric(t.Context(), url, series); err == nil && v >= min {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: %s never reached %v", url, series, min)
}

// TestPeersOwnerKilledMidFill (issue 22): the owner of a 64 MiB layer is killed (SIGKILL) while
// it streams the layer from a slow upstream to two other members. Both members' clients still
// get the right bytes (their fills resume, with Range, from the next member or the upstream,
// never the dead owner), both store the layer, and the upstream sends the layer at most twice.
func TestPeersOwnerKilledMidFill(t *testing.T) {
	t.Parallel()
	up, _, blobs := appImage(t, 64<<20, 1)
	layer := blobs[1]
	c := startPeerCluster(t, up, 3, peerClusterOptions{})
	keys := loadKeys(t, c.keyFile)
	var members []peer.Member
	byID := map[string]int{}
	for i, nd := range c.nodes {
		id := nodeID(t, nd.peerListen, keys)
		members = append(members, peer.Member{ID: id})
		byID[id] = i
	}
	owner := byID[peer.Rank(members, digest.Digest(layer.String()))[0].ID]
	var others []peerNode
	for i, nd := range c.nodes {
		if i != owner {
			others = append(others, nd)
		}
	}
	up.SlowBlobs(5 * time.Millisecond) // 64 MiB in about ten seconds
	up.ResetRequests()

	done := make(chan error, len(others))
	for _, nd := range others {
		go func() { done <- pullValid(nd.Listen + "/team/app:v1") }()
	}
	for deadline := time.Now().Add(time.Minute); up.Count(http.MethodGet, "/blobs/"+layer.String()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the upstream was never asked for the layer")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if err := c.nodes[owner].Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for range others {
		if err := <-done; err != nil {
			t.Errorf("a pull whose owner died mid-fill: %v", err)
		}
	}
	n := up.Count(http.MethodGet, "/blobs/"+layer.String())
	t.Logf("the upstream sent the layer %d times", n)
	if n > 2 {
		t.Errorf("the upstream sent the layer %d times, want at most 2 (the dead owner's fill and one resume)", n)
	}
	for _, nd := range others {
		checkStored(t, nd.Root, layer)
	}
}
