package warm

import (
	"bytes"
	"context"
	_ "crypto/sha256" // digest algorithms for go-digest
	_ "crypto/sha512"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// blobResult is what fetching one blob through the mirror gave.
type blobResult struct {
	Bytes    int64
	Duration time.Duration
	Cache    string
	Attempts int
}

// getBlob streams blob desc of ref through the mirror, discarding the body while hashing it.
// Each attempt is bounded by timeout. A retried attempt after a broken stream asks for the rest
// with Range and keeps hashing when the mirror answers 206 from the right offset; a 200 starts
// over. The blob fails on a digest or size mismatch (not retried), on a status that is not 5xx,
// 429 or 408, or when the retries are used up. When sink is non-nil it receives the body as well
// (it is reset whenever the fetch starts over): the config, which warm reads, or the file of a
// bundle (warm --to). A sink that fails to take bytes fails the blob (not retried).
func (c *client) getBlob(ctx context.Context, ref Reference, desc v1.Descriptor, timeout time.Duration, prog progress, sink blobSink) (blobResult, error) {
	var res blobResult
	want, err := digest.Parse(desc.Digest.String())
	if err != nil {
		return res, permanent(fmt.Errorf("blob digest %q: %w", desc.Digest, err))
	}
	if !want.Algorithm().Available() {
		return res, permanent(fmt.Errorf("blob %s: digest algorithm not supported", want))
	}
	if desc.Size < 0 {
		return res, permanent(fmt.Errorf("blob %s: negative size %d in manifest", want, desc.Size))
	}
	target := c.endpoint(ref, "blobs", want.String())
	h := want.Algorithm().Hash()
	var have int64
	start := time.Now()
	reset := func() {
		prog.transferred(-have)
		have = 0
		h.Reset()
		if sink != nil {
			sink.Reset()
		}
	}
	err = c.retry(ctx, "blob "+want.String(), func(ctx context.Context, n int) error {
		res.Attempts = n + 1
		actx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, err := c.newRequest(actx, target)
		if err != nil {
			return permanent(err)
		}
		if have > 0 {
			req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
		}
		resp, err := c.do(req, ref)
		if err != nil {
			return c.attemptErr(ctx, actx, timeout, fmt.Errorf("GET %s: %w", target, err))
		}
		defer resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			if have > 0 {
				reset()
			}
		case http.StatusPartialContent:
			if from, ok := contentRangeStart(resp.Header.Get("Content-Range")); !ok || from != have {
				reset()
				return fmt.Errorf("GET %s: 206 from offset %q, asked for %d: %w", target, resp.Header.Get("Content-Range"), have, errBrokenStream)
			}
		default:
			return c.explain(newStatusError(resp))
		}
		if v := resp.Header.Get(mirrorapi.HeaderCache); v != "" {
			res.Cache = v
		}
		n64, err := io.Copy(&hashCounter{h: h, prog: prog, sink: sink}, io.LimitReader(resp.Body, desc.Size-have+1))
		have += n64
		if err != nil {
			return c.attemptErr(ctx, actx, timeout, readError(want, have, desc.Size, err))
		}
		switch {
		case have < desc.Size:
			return fmt.Errorf("read blob %s: body ended after %d of %s: %w", want, have, clitext.Count(desc.Size, "byte"), errBrokenStream)
		case have > desc.Size:
			reset()
			return permanent(fmt.Errorf("blob %s: body is longer than the manifest's size %d", want, desc.Size))
		}
		if got := digest.NewDigest(want.Algorithm(), h); got != want {
			reset()
			return permanent(fmt.Errorf("blob %s: digest mismatch: body is %s", want, got))
		}
		return nil
	})
	res.Bytes, res.Duration = have, time.Since(start)
	return res, err
}

// attemptErr names a per-attempt timeout as such; the attempt is retried while parent lives.
func (c *client) attemptErr(parent, attempt context.Context, timeout time.Duration, err error) error {
	if parent.Err() == nil && errors.Is(attempt.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("blob timeout %s: %w", clitext.Span(timeout), err)
	}
	return err
}

// readError names a body that failed mid-way: a broken stream (retried), but a sink that failed
// to take the bytes (a permanentError: a full disk) as itself.
func readError(want digest.Digest, have, size int64, err error) error {
	if pe := (*permanentError)(nil); errors.As(err, &pe) {
		return pe
	}
	return fmt.Errorf("read blob %s after %d of %s: %w: %w", want, have, clitext.Count(size, "byte"), errBrokenStream, err)
}

// contentRangeStart reads the first byte position of "bytes START-END/TOTAL".
func contentRangeStart(v string) (int64, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(v), "bytes ")
	if !ok {
		return 0, false
	}
	from, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(from, 10, 64)
	return n, err == nil && n >= 0
}

// blobSink receives a blob's bytes as they arrive; Reset discards them when a transfer starts
// over (a sink that cannot start over fails its next Write).
type blobSink interface {
	io.Writer
	Reset()
}

// bufferSink keeps a blob in memory (the config warm reads).
type bufferSink struct{ *bytes.Buffer }

func (b bufferSink) Reset() { b.Buffer.Reset() }

// teeSink writes to every sink.
type teeSink []blobSink

func (t teeSink) Write(p []byte) (int, error) {
	for _, s := range t {
		if _, err := s.Write(p); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (t teeSink) Reset() {
	for _, s := range t {
		s.Reset()
	}
}

// hashCounter feeds the sink (when set), the hash and the progress.
type hashCounter struct {
	h    hash.Hash
	prog progress
	sink blobSink
}

func (w *hashCounter) Write(p []byte) (int, error) {
	if w.sink != nil {
		if _, err := w.sink.Write(p); err != nil {
			return 0, permanent(err) // a full disk, not the stream: not retried
		}
	}
	w.h.Write(p)
	w.prog.transferred(int64(len(p)))
	return len(p), nil
}
