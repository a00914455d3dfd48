package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the upstream's storage
	"github.com/sirupsen/logrus"
)

// upstream is distribution's registry (the library, in this process) over filesystem storage.
// Each proxy under test reaches it on its own listener so the blob bytes it sent to that proxy
// are counted apart.
type upstream struct {
	app http.Handler
}

func newUpstream(ctx context.Context, root string) *upstream {
	logrus.SetOutput(io.Discard)
	logrus.SetLevel(logrus.ErrorLevel)
	cfg := &configuration.Configuration{}
	cfg.Storage = configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": root}}
	cfg.Storage["maintenance"] = configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}}
	cfg.Log.Level = "error"
	cfg.Log.AccessLog.Disabled = true
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.HTTP.RelativeURLs = true
	return &upstream{app: handlers.NewApp(ctx, cfg)}
}

// endpoint is one listener of the upstream with its own byte counter.
type endpoint struct {
	URL       string
	addr      string
	blobBytes atomic.Int64 // response body bytes of GET .../blobs/... written
	blobGETs  atomic.Int64
	srv       *http.Server
}

func (u *upstream) listen() (*endpoint, error) { return u.listenLimited(nil) }

// listenLimited is listen with every response body written through limit (nil: unlimited), one
// bucket shared by all the listener's connections.
func (u *upstream) listenLimited(limit *bucket) (*endpoint, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("upstream listener: %w", err)
	}
	e := &endpoint{addr: l.Addr().String(), URL: "http://" + l.Addr().String()}
	e.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if limit != nil {
			w = &limitedWriter{ResponseWriter: w, limit: limit, ctx: r.Context()}
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
			e.blobGETs.Add(1)
			w = &countingWriter{ResponseWriter: w, n: &e.blobBytes}
		}
		u.app.ServeHTTP(w, r)
	})}
	go func() { _ = e.srv.Serve(l) }()
	return e, nil
}

func (e *endpoint) reset() { e.blobBytes.Store(0); e.blobGETs.Store(0) }

func (e *endpoint) close() { _ = e.srv.Close() }

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// ReadFrom keeps io.Copy from bypassing the count through the connection's sendfile path.
func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.CopyBuffer(writerOnly{c}, r, make([]byte, 256<<10))
}

type writerOnly struct{ io.Writer }

func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// pushBlob uploads data to repo on the upstream (monolithic POST then PUT) and returns its digest.
func pushBlob(ctx context.Context, e *endpoint, repo string, data []byte) (string, error) {
	sum := sha256.Sum256(data)
	dgst := "sha256:" + hex.EncodeToString(sum[:])
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v2/"+repo+"/blobs/uploads/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("start upload to %s: %w", repo, err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusAccepted || loc == "" {
		return "", fmt.Errorf("start upload to %s: %s", repo, resp.Status)
	}
	if strings.HasPrefix(loc, "/") {
		loc = e.URL + loc
	}
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodPut, loc+sep+"digest="+dgst, bytes.NewReader(data))
	req.ContentLength = int64(len(data))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("upload %s to %s: %w", dgst, repo, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("upload %s to %s: %s", dgst, repo, resp.Status)
	}
	return dgst, nil
}

// relay forwards each TCP connection it accepts to target and counts the bytes that come back
// from target: what a proxy really received, as opposed to what the upstream wrote into its
// socket (part of which toxiproxy still holds when it cuts a connection).
type relay struct {
	addr     string
	l        net.Listener
	received atomic.Int64
}

func newRelay(target string) (*relay, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relay listener: %w", err)
	}
	r := &relay{addr: l.Addr().String(), l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go r.serve(c, target)
		}
	}()
	return r, nil
}

func (r *relay) serve(c net.Conn, target string) {
	defer c.Close()
	t, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer t.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(t, c); done <- struct{}{} }()
	go func() {
		n, _ := io.Copy(c, t)
		r.received.Add(n)
		done <- struct{}{}
	}()
	<-done // either side ending ends the connection, as a reset would
}

func (r *relay) close() { _ = r.l.Close() }
