package peer

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/internal/inputfile"
)

// The headers of a peer request's proof (Keys.Sign, Keys.Verify).
const (
	// HeaderID is the sender's instance id.
	HeaderID = "X-Nodecache-Peer-Id"
	// HeaderTime is when the request was signed, in Unix seconds (decimal).
	HeaderTime = "X-Nodecache-Peer-Time"
	// HeaderSignature is the lower-case hex HMAC-SHA256 of the signed string (Keys.Sign).
	HeaderSignature = "X-Nodecache-Peer-Signature"
)

// Key file rules and the proof's window.
const (
	// MinKeyLen is the shortest key accepted, in bytes after trimming white space: 32, the
	// output size of SHA-256, which RFC 2104 section 3 recommends as the least key length.
	MinKeyLen = 32
	// MaxSkew is how far a proof's time may be from the verifier's clock, either way.
	MaxSkew = 60 * time.Second
	// KeysRecheck is how often, at most, Sign and Verify stat the key file for a change.
	KeysRecheck = time.Second
)

// ErrUnauthorized marks a peer request whose proof failed (Keys.Verify).
var ErrUnauthorized = errors.New("peer request not authorized")

// Keys holds the HMAC keys of --peer-key-file: the file holds one key, or two during a rotation,
// one a line (blank lines ignored); a key is the line's bytes after trimming white space, at
// least MinKeyLen of them. Sign uses the first key; Verify accepts either, so a rotation is: add
// the new key as the second line everywhere, then make it the first, then drop the old one.
//
// The file is read again when it changed (internal/filestamp: identity, size, mtime, so a
// Kubernetes Secret volume's symlink swap counts), checked at most every KeysRecheck, on use. A
// file that becomes unreadable or invalid keeps the last good keys and logs once (file name and
// reason, never a key). Safe for concurrent use.
type Keys struct {
	path  string
	log   zerolog.Logger
	clock func() time.Time // for KeysRecheck; tests in this package replace it

	mu      sync.Mutex
	keys    [][]byte
	stamp   filestamp.Stamp
	statAt  time.Time
	failing bool
}

// LoadKeys reads the key file at path.
//
// Errors: the file cannot be read (missing, not a regular file, more than 4 KiB); it holds no
// key, more than two, or a key shorter than MinKeyLen (by line number, never the key).
func LoadKeys(path string, log zerolog.Logger) (*Keys, error) {
	k := &Keys{path: path, log: log, clock: time.Now}
	st, keys, err := readKeys(path)
	if err != nil {
		return nil, err
	}
	k.stamp, k.keys, k.statAt = st, keys, k.clock()
	return k, nil
}

// readKeys stats and parses the key file. The stamp is taken before the read, so a change
// during the read is seen at the next check.
func readKeys(path string) (filestamp.Stamp, [][]byte, error) {
	st, err := filestamp.Of(path)
	if err != nil {
		return filestamp.Stamp{}, nil, fmt.Errorf("peer key file: %w", err)
	}
	b, err := inputfile.Read(path, inputfile.PeerKeys)
	if err != nil {
		return filestamp.Stamp{}, nil, fmt.Errorf("peer key file: %w", err)
	}
	var keys [][]byte
	for n, line := range bytes.Split(b, []byte("\n")) {
		key := bytes.TrimSpace(line)
		switch {
		case len(key) == 0:
			continue
		case len(key) < MinKeyLen:
			return filestamp.Stamp{}, nil, fmt.Errorf("peer key file %s, line %d: the key is %s; want at least %d", path, n+1, clitext.Count(len(key), "byte"), MinKeyLen)
		case len(keys) == 2:
			return filestamp.Stamp{}, nil, fmt.Errorf("peer key file %s, line %d: a third key; want one key, or two during a rotation (one a line)", path, n+1)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return filestamp.Stamp{}, nil, fmt.Errorf("peer key file %s holds no key; want one key of at least %d bytes, or two during a rotation (one a line)", path, MinKeyLen)
	}
	return st, keys, nil
}

// Path is the key file.
func (k *Keys) Path() string { return k.path }

// current returns the keys, reading the file again first when KeysRecheck passed and it
// changed.
func (k *Keys) current() [][]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.clock()
	if d := now.Sub(k.statAt); d >= 0 && d < KeysRecheck {
		return k.keys
	}
	k.statAt = now
	st, err := filestamp.Of(k.path)
	if err == nil && st == k.stamp && !k.failing {
		return k.keys
	}
	st, keys, err := readKeys(k.path)
	if err != nil {
		if !k.failing {
			k.log.Error().Str("file", k.path).Err(err).Msg("cannot re-read the peer key file; keeping the keys read before")
		}
		k.failing = true
		return k.keys
	}
	k.failing = false
	if st != k.stamp {
		k.stamp, k.keys = st, keys
		k.log.Info().Str("file", k.path).Int("keys", len(keys)).Msg("peer key file changed; read again")
	}
	return k.keys
}

// signedString is what the signature covers: method, escaped path, raw query, time and sender
// id, joined by "\n". No part can hold a "\n" of its own (net/http refuses one in a method,
// header or request target), so the joined string names its parts unambiguously. The host is not
// covered: a proof is good at any peer for MaxSkew, which is harmless for the content-addressed
// reads peers serve each other.
func signedString(req *http.Request, ts, senderID string) []byte {
	var b bytes.Buffer
	for i, part := range []string{req.Method, req.URL.EscapedPath(), req.URL.RawQuery, ts, senderID} {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(part)
	}
	return b.Bytes()
}

func mac(key, msg []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(msg)
	return h.Sum(nil)
}

// Sign adds the peer proof to req: HeaderID (senderID), HeaderTime (now in Unix seconds) and
// HeaderSignature (hex HMAC-SHA256 with the first key over method "\n" URL.EscapedPath() "\n"
// URL.RawQuery "\n" time "\n" senderID).
func (k *Keys) Sign(req *http.Request, senderID string, now time.Time) {
	ts := strconv.FormatInt(now.Unix(), 10)
	sig := mac(k.current()[0], signedString(req, ts, senderID))
	req.Header.Set(HeaderID, senderID)
	req.Header.Set(HeaderTime, ts)
	req.Header.Set(HeaderSignature, hex.EncodeToString(sig))
}

// Verify checks req's proof (Sign) against every key, each compared in constant time
// (hmac.Equal), with its time within MaxSkew of now either way, and returns the sender id.
//
// Errors: ErrUnauthorized, wrapped with the part that failed (a missing header, a malformed or
// stale time, a bad signature), never which key.
func (k *Keys) Verify(req *http.Request, now time.Time) (senderID string, err error) {
	senderID, ts, sigHex := req.Header.Get(HeaderID), req.Header.Get(HeaderTime), req.Header.Get(HeaderSignature)
	for _, h := range [][2]string{{HeaderID, senderID}, {HeaderTime, ts}, {HeaderSignature, sigHex}} {
		if h[1] == "" {
			return "", fmt.Errorf("%w: missing header %s", ErrUnauthorized, h[0])
		}
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: malformed %s %q", ErrUnauthorized, HeaderTime, ts)
	}
	// Compared without a subtraction of t, which could overflow.
	window := int64(MaxSkew / time.Second)
	if t < now.Unix()-window || t > now.Unix()+window {
		return "", fmt.Errorf("%w: stale time (%s is more than %d s off this node's clock, %d)", ErrUnauthorized, ts, window, now.Unix())
	}
	sig, err := hex.DecodeString(sigHex)
	if err != nil {
		return "", fmt.Errorf("%w: bad signature (not hex)", ErrUnauthorized)
	}
	msg := signedString(req, ts, senderID)
	ok := false
	for _, key := range k.current() {
		// Every key is tried, so the time taken does not tell which one matched.
		if hmac.Equal(sig, mac(key, msg)) {
			ok = true
		}
	}
	if !ok {
		return "", fmt.Errorf("%w: bad signature", ErrUnauthorized)
	}
	return senderID, nil
}
