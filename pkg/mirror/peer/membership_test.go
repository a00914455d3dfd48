package peer_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
	"github.com/nodecache/nodecache/pkg/mirror/peer"
)

const (
	testKey  = "0123456789abcdef0123456789abcdef-test-key"
	otherKey = "fedcba9876543210fedcba9876543210-other-key"
)

func newKeys(t *testing.T, content string) *peer.Keys {
	t.Helper()
	path := filepath.Join(t.TempDir(), "peer.key")
	if err := os.WriteFile(path, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := peer.LoadKeys(path, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// idServer is a real peer port on loopback announcing the id it holds (changeable), with keys.
type idServer struct {
	*httptest.Server
	id   atomic.Value // string
	down atomic.Bool  // answer 503 instead
}

func newIDServer(t *testing.T, id string, keys *peer.Keys, now func() time.Time) *idServer {
	t.Helper()
	s := &idServer{}
	s.id.Store(id)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		peer.IDHandler(s.id.Load().(string), keys, now).ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *idServer) addr() string { return strings.TrimPrefix(s.URL, "http://") }

func writePeers(t *testing.T, path string, addrs ...string) {
	t.Helper()
	writeFile(t, path, "# peers\n"+strings.Join(addrs, "\n")+"\n")
}

func TestIDHandler(t *testing.T) {
	t.Parallel()
	keys := newKeys(t, testKey)
	srv := newIDServer(t, "node-1", keys, time.Now)
	do := func(method, path string, k *peer.Keys) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if k != nil {
			k.Sign(req, "node-2", time.Now())
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}

	resp, body := do(http.MethodGet, peer.IDPath, keys)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" || strings.TrimSpace(body) != `{"id":"node-1"}` {
		t.Errorf("signed GET: %d %q %q; want 200 application/json {\"id\":\"node-1\"}", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}

	for _, tc := range []struct {
		name string
		keys *peer.Keys
		want string
	}{
		{"unsigned", nil, "missing header X-Nodecache-Peer-Id"},
		{"other key", newKeys(t, otherKey), "bad signature"},
	} {
		resp, body := do(http.MethodGet, peer.IDPath, tc.keys)
		var e struct {
			Errors []struct{ Code, Message string } `json:"errors"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != http.StatusUnauthorized ||
			len(e.Errors) != 1 || e.Errors[0].Code != "UNAUTHORIZED" || !strings.Contains(e.Errors[0].Message, tc.want) {
			t.Errorf("%s: %d %s; want 401 with an UNAUTHORIZED error saying %q", tc.name, resp.StatusCode, body, tc.want)
		}
	}
	if resp, body := do(http.MethodPost, peer.IDPath, keys); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" {
		t.Errorf("signed POST: %d %s; want 405 with Allow: GET", resp.StatusCode, body)
	}
	if resp, body := do(http.MethodPost, peer.IDPath, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned POST: %d %s; want 401 before anything else", resp.StatusCode, body)
	}
}

func TestMembership(t *testing.T) {
	t.Parallel()
	keys := newKeys(t, testKey)
	s1 := newIDServer(t, "node-1", keys, time.Now)
	self := newIDServer(t, "self-id", keys, time.Now)
	stranger := newIDServer(t, "node-3", newKeys(t, otherKey), time.Now)
	list := filepath.Join(t.TempDir(), "peers")
	writePeers(t, list, s1.addr(), self.addr(), stranger.addr())
	src, err := peer.ParseSource("file:" + list)
	if err != nil {
		t.Fatal(err)
	}
	m := peer.NewMembership(peer.MembershipOptions{Source: src, Self: "self-id", Keys: keys, Logger: zerolog.Nop()})
	if got := m.Members(); len(got) != 0 || m.Self() {
		t.Fatalf("before a refresh: Members() = %v, Self() = %v; want none, false", got, m.Self())
	}

	m.Refresh(t.Context())
	want := []peer.Member{{ID: "node-1", Addr: s1.addr()}}
	if got := m.Members(); !slices.Equal(got, want) {
		t.Errorf("Members() = %v; want %v (this node and the one with another key left out)", got, want)
	}
	if live, failed := m.Count(); live != 1 || failed != 1 {
		t.Errorf("Count() = %d live, %d failed; want 1, 1", live, failed)
	}
	if !m.Self() {
		t.Error("Self() = false; the list holds this node")
	}
	if err := m.Failures()[stranger.addr()]; err == nil || !strings.Contains(err.Error(), "status 401: peer request not authorized: bad signature") {
		t.Errorf("the failure of %s: %v; want the 401 and its message", stranger.addr(), err)
	}

	// The failed one answers once it has the key (a failed address is asked at every refresh).
	stranger2 := newIDServer(t, "node-3", keys, time.Now)
	writePeers(t, list, s1.addr(), self.addr(), stranger2.addr())
	m.Refresh(t.Context())
	want = []peer.Member{{ID: "node-1", Addr: s1.addr()}, {ID: "node-3", Addr: stranger2.addr()}}
	if got := m.Members(); !slices.Equal(got, want) {
		t.Errorf("Members() = %v; want %v", got, want)
	}

	// Removed from the file: gone after the next refresh, and so is this node.
	writePeers(t, list, stranger2.addr())
	m.Refresh(t.Context())
	want = []peer.Member{{ID: "node-3", Addr: stranger2.addr()}}
	if got := m.Members(); !slices.Equal(got, want) || m.Self() {
		t.Errorf("after removing two: Members() = %v, Self() = %v; want %v, false", got, m.Self(), want)
	}
	if live, failed := m.Count(); live != 1 || failed != 0 {
		t.Errorf("Count() = %d, %d; want 1, 0", live, failed)
	}

	// A file that turns invalid keeps the members.
	writeFile(t, list, "not an address\n")
	m.Refresh(t.Context())
	if got := m.Members(); !slices.Equal(got, want) {
		t.Errorf("after an invalid list: Members() = %v; want %v kept", got, want)
	}
}

func TestMembershipRecheck(t *testing.T) {
	t.Parallel()
	c := mirrortest.NewClock(time.Now())
	keys := newKeys(t, testKey)
	a := newIDServer(t, "node-a", keys, c.Now)
	b := newIDServer(t, "node-a", keys, c.Now) // the same node at a second address (A and AAAA)
	src, err := peer.ParseSource(a.addr() + "," + b.addr())
	if err != nil {
		t.Fatal(err)
	}
	m := peer.NewMembership(peer.MembershipOptions{Source: src, Self: "self", Keys: keys, Clock: c.Now, Recheck: time.Minute})
	m.Refresh(t.Context())
	lowest := min(a.addr(), b.addr())
	if got := m.Members(); !slices.Equal(got, []peer.Member{{ID: "node-a", Addr: lowest}}) {
		t.Fatalf("Members() = %v; want node-a once, at %s", got, lowest)
	}

	// Restarted with a new id: seen only once Recheck passed.
	a.id.Store("node-a2")
	b.id.Store("node-b")
	m.Refresh(t.Context())
	if got := m.Members(); len(got) != 1 || got[0].ID != "node-a" {
		t.Fatalf("before Recheck: Members() = %v; want the answers kept", got)
	}
	c.Advance(time.Minute)
	m.Refresh(t.Context())
	want := []peer.Member{{ID: "node-a2", Addr: a.addr()}, {ID: "node-b", Addr: b.addr()}}
	if got := m.Members(); !slices.Equal(got, want) {
		t.Fatalf("after Recheck: Members() = %v; want %v", got, want)
	}

	// Stops answering: live through one missed re-ask (a loaded node that answered late), dropped
	// at the second; back when it answers.
	b.down.Store(true)
	c.Advance(time.Minute)
	m.Refresh(t.Context())
	if got := m.Members(); !slices.Equal(got, want) {
		t.Fatalf("with %s down for one re-ask: Members() = %v; want %v kept", b.addr(), got, want)
	}
	c.Advance(time.Minute)
	m.Refresh(t.Context())
	if got := m.Members(); !slices.Equal(got, want[:1]) {
		t.Fatalf("with %s down: Members() = %v; want %v", b.addr(), got, want[:1])
	}
	if err := m.Failures()[b.addr()]; err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Errorf("the failure: %v; want status 503", err)
	}
	b.down.Store(false)
	m.Refresh(t.Context())
	if got := m.Members(); !slices.Equal(got, want) {
		t.Fatalf("with %s back: Members() = %v; want %v", b.addr(), got, want)
	}
}

// TestMembershipRestartSeenAtNextRefresh: with the default Recheck, a member that restarted at
// its address with a new id (a rollout of the DaemonSet) is seen at the next Refresh, so nodes
// do not disagree on owners for minutes.
func TestMembershipRestartSeenAtNextRefresh(t *testing.T) {
	t.Parallel()
	keys := newKeys(t, testKey)
	a := newIDServer(t, "before-restart", keys, time.Now)
	src, err := peer.ParseSource(a.addr())
	if err != nil {
		t.Fatal(err)
	}
	m := peer.NewMembership(peer.MembershipOptions{Source: src, Self: "self", Keys: keys})
	m.Refresh(t.Context())
	a.id.Store("after-restart")
	m.Refresh(t.Context())
	if got := m.Members(); len(got) != 1 || got[0].ID != "after-restart" {
		t.Fatalf("after a restart and one Refresh: Members() = %v; want the new id", got)
	}
}

func TestMembershipDialTimeout(t *testing.T) {
	t.Parallel()
	keys := newKeys(t, testKey)
	release := make(chan struct{})
	var once sync.Once
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { once.Do(func() { close(release) }); hang.Close() })
	src, err := peer.ParseSource(strings.TrimPrefix(hang.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	m := peer.NewMembership(peer.MembershipOptions{Source: src, Self: "self", Keys: keys, DialTimeout: 100 * time.Millisecond})
	start := time.Now()
	m.Refresh(t.Context())
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Refresh took %v against a peer that never answers; want about 2×100 ms + 1 s", d)
	}
	if live, failed := m.Count(); live != 0 || failed != 1 {
		t.Errorf("Count() = %d, %d; want 0, 1", live, failed)
	}
}

func TestMembershipRun(t *testing.T) {
	t.Parallel()
	keys := newKeys(t, testKey)
	s := newIDServer(t, "node-1", keys, time.Now)
	list := filepath.Join(t.TempDir(), "peers")
	writePeers(t, list)
	src, err := peer.ParseSource("file:" + list)
	if err != nil {
		t.Fatal(err)
	}
	m := peer.NewMembership(peer.MembershipOptions{Source: src, Self: "self", Keys: keys, Refresh: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	writePeers(t, list, s.addr())
	deadline := time.Now().Add(10 * time.Second)
	for len(m.Members()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not pick up the new member within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
