package peer

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/pkg/mirror/mirrortest"
)

const (
	keyA = "0123456789abcdef0123456789abcdef-key-a"
	keyB = "fedcba9876543210fedcba9876543210-key-b"
)

// keyFile writes content to a new key file (a new file renamed over path, as a Secret volume
// update replaces it) and returns path.
func keyFile(t *testing.T, path, content string) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "peer.key")
	}
	if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	return path
}

func loadKeys(t *testing.T, content string) *Keys {
	t.Helper()
	k, err := LoadKeys(keyFile(t, "", content), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestLoadKeysRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, content, wantErr string }{
		{"empty", "\n \n", "holds no key; want one key of at least 32 bytes"},
		{"short", keyA + "\nshort-key\n", "line 2: the key is 9 bytes; want at least 32"},
		{"three", keyA + "\n" + keyB + "\n\n" + keyA + "x\n", "line 4: a third key; want one key, or two during a rotation"},
		{"missing", "", "no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "peer.key")
			if tc.name != "missing" {
				keyFile(t, path, tc.content)
			}
			k, err := LoadKeys(path, zerolog.Nop())
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("LoadKeys = %v, %v; want an error containing %q", k, err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "key-a") {
				t.Errorf("the error %q shows a key", err)
			}
		})
	}
}

func signedRequest(t *testing.T, k *Keys, method, target, id string, at time.Time) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, "http://10.0.0.1:5001"+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	k.Sign(req, id, at)
	return req
}

func TestSignVerify(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_800_000_000, 0)
	a := loadKeys(t, "  "+keyA+"  \n")
	b := loadKeys(t, keyB+"\n")
	rotating := loadKeys(t, keyB+"\n"+keyA+"\n") // signs with B, accepts A and B

	req := signedRequest(t, a, http.MethodGet, "/v2/library/alpine/blobs/sha256:ab?ns=docker.io", "node-a", at)
	if got := req.Header.Get(HeaderTime); got != "1800000000" {
		t.Errorf("%s = %q; want Unix seconds", HeaderTime, got)
	}
	if sig := req.Header.Get(HeaderSignature); len(sig) != 64 || strings.ToLower(sig) != sig {
		t.Errorf("%s = %q; want 64 lower-case hex digits", HeaderSignature, sig)
	}
	if id, err := a.Verify(req, at); err != nil || id != "node-a" {
		t.Fatalf("Verify with the same key = %q, %v", id, err)
	}
	if id, err := rotating.Verify(req, at); err != nil || id != "node-a" {
		t.Errorf("Verify with the key second in the file = %q, %v", id, err)
	}
	if _, err := b.Verify(req, at); !errors.Is(err, ErrUnauthorized) || !strings.HasSuffix(err.Error(), ": bad signature") {
		t.Errorf("Verify with another key: %v; want ErrUnauthorized: bad signature", err)
	}
	fromRotating := signedRequest(t, rotating, http.MethodGet, "/x", "node-r", at)
	if _, err := b.Verify(fromRotating, at); err != nil {
		t.Errorf("a rotating node signs with its first key: %v", err)
	}
	if _, err := a.Verify(fromRotating, at); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("a rotating node signed with its second key: %v", err)
	}
}

func TestVerifyWindow(t *testing.T) {
	t.Parallel()
	k := loadKeys(t, keyA)
	at := time.Unix(1_800_000_000, 0)
	req := signedRequest(t, k, http.MethodHead, "/v2/a/blobs/sha256:ab", "node-a", at)
	for _, tc := range []struct {
		off time.Duration
		ok  bool
	}{
		{0, true}, {60 * time.Second, true}, {-60 * time.Second, true},
		{60*time.Second + 999*time.Millisecond, true}, // the same Unix second as +60 s
		{61 * time.Second, false}, {-61 * time.Second, false}, {-60*time.Second - time.Millisecond, false},
	} {
		_, err := k.Verify(req, at.Add(tc.off))
		if tc.ok && err != nil {
			t.Errorf("verified %v after signing: %v; want accepted", tc.off, err)
		}
		if !tc.ok && (!errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "stale time")) {
			t.Errorf("verified %v after signing: %v; want ErrUnauthorized: stale time", tc.off, err)
		}
	}
	// A time far from any clock cannot overflow the check into acceptance.
	for _, ts := range []int64{-1 << 63, 1<<63 - 1} {
		r := req.Clone(t.Context())
		r.Header.Set(HeaderTime, strconv.FormatInt(ts, 10))
		if _, err := k.Verify(r, at); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "stale time") {
			t.Errorf("time %d: %v; want stale", ts, err)
		}
	}
}

func TestVerifyTampered(t *testing.T) {
	t.Parallel()
	k := loadKeys(t, keyA)
	at := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name    string
		tamper  func(r *http.Request)
		wantErr string
	}{
		{"path", func(r *http.Request) { r.URL.Path = "/v2/a/blobs/sha256:cd" }, "bad signature"},
		{"escaped path", func(r *http.Request) { r.URL.Path, r.URL.RawPath = "/v2/a/blobs/sha256:ab", "/v2/a/blobs/sha256%3Aab" }, "bad signature"},
		{"query", func(r *http.Request) { r.URL.RawQuery = "ns=ghcr.io" }, "bad signature"},
		{"query dropped", func(r *http.Request) { r.URL.RawQuery = "" }, "bad signature"},
		{"method", func(r *http.Request) { r.Method = http.MethodHead }, "bad signature"},
		{"id", func(r *http.Request) { r.Header.Set(HeaderID, "node-b") }, "bad signature"},
		{"time", func(r *http.Request) { r.Header.Set(HeaderTime, "1800000001") }, "bad signature"},
		{"signature", func(r *http.Request) { r.Header.Set(HeaderSignature, strings.Repeat("0", 64)) }, "bad signature"},
		{"not hex", func(r *http.Request) { r.Header.Set(HeaderSignature, "zz") }, "bad signature (not hex)"},
		{"time not a number", func(r *http.Request) { r.Header.Set(HeaderTime, "1.8e9") }, `malformed X-Nodecache-Peer-Time "1.8e9"`},
		{"no id", func(r *http.Request) { r.Header.Del(HeaderID) }, "missing header X-Nodecache-Peer-Id"},
		{"no time", func(r *http.Request) { r.Header.Del(HeaderTime) }, "missing header X-Nodecache-Peer-Time"},
		{"no signature", func(r *http.Request) { r.Header.Del(HeaderSignature) }, "missing header X-Nodecache-Peer-Signature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := signedRequest(t, k, http.MethodGet, "/v2/a/blobs/sha256:ab?ns=docker.io", "node-a", at)
			if _, err := k.Verify(req, at); err != nil {
				t.Fatalf("untouched: %v", err)
			}
			tc.tamper(req)
			_, err := k.Verify(req, at)
			if !errors.Is(err, ErrUnauthorized) || !strings.HasSuffix(err.Error(), ": "+tc.wantErr) {
				t.Errorf("Verify = %v; want ErrUnauthorized ending %q", err, tc.wantErr)
			}
		})
	}
}

func TestKeysRotation(t *testing.T) {
	t.Parallel()
	clock := mirrortest.NewClock(time.Unix(1_800_000_000, 0))
	var logs strings.Builder
	var mu sync.Mutex
	path := keyFile(t, "", keyA+"\n")
	k, err := LoadKeys(path, zerolog.New(zerolog.SyncWriter(&lockedWriter{mu: &mu, w: &logs})))
	if err != nil {
		t.Fatal(err)
	}
	k.clock, k.statAt = clock.Now, clock.Now() // as if loaded at the fake clock's time
	verifier := loadKeys(t, keyA)
	newKey := loadKeys(t, keyB)
	at := time.Unix(1_800_000_000, 0)
	signedWith := func(want *Keys) bool {
		t.Helper()
		req := signedRequest(t, k, http.MethodGet, "/x", "n", at)
		_, err := want.Verify(req, at)
		return err == nil
	}

	// Step 1 of a rotation: the new key second. Within KeysRecheck the file is not looked at.
	keyFile(t, path, keyA+"\n"+keyB+"\n")
	clock.Advance(KeysRecheck / 2)
	if _, err := k.Verify(signedRequest(t, newKey, http.MethodGet, "/x", "n", at), at); err == nil {
		t.Fatal("the new key was accepted before KeysRecheck passed")
	}
	clock.Advance(KeysRecheck / 2)
	if _, err := k.Verify(signedRequest(t, newKey, http.MethodGet, "/x", "n", at), at); err != nil {
		t.Fatalf("the new key (second line) is not accepted after the change: %v", err)
	}
	if !signedWith(verifier) {
		t.Fatal("still signs with the first key")
	}

	// Step 2: the new key first.
	keyFile(t, path, keyB+"\n"+keyA+"\n")
	clock.Advance(KeysRecheck)
	if !signedWith(newKey) {
		t.Fatal("does not sign with the new first key")
	}

	// A broken file keeps the keys (logged once); a good one is read again.
	keyFile(t, path, "short\n")
	for range 3 {
		clock.Advance(KeysRecheck)
		if !signedWith(newKey) {
			t.Fatal("an invalid key file changed the keys")
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	clock.Advance(KeysRecheck)
	if !signedWith(newKey) {
		t.Fatal("a missing key file changed the keys")
	}
	keyFile(t, path, keyA+"\n")
	clock.Advance(KeysRecheck)
	if !signedWith(verifier) {
		t.Fatal("the key file is not read again once it is good")
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "cannot re-read the peer key file"); n != 1 {
		t.Errorf("the failure was logged %d times; want once:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "key-a") || strings.Contains(logs.String(), "key-b") {
		t.Errorf("a key is in the logs:\n%s", logs.String())
	}
}

// lockedWriter serializes writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
