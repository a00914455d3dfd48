package upstream

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/rs/zerolog"

	"github.com/nodecache/nodecache/internal/clitext"
)

// Fill tuning.
const (
	// maxStalledAttempts is how many upstream requests in a row may add no byte before a fill
	// gives up. Requests that add bytes never count: a stream that keeps breaking is resumed
	// with Range for as long as it progresses (bounded by the fill timeout).
	maxStalledAttempts = 5
	// resumeDelay is the pause before resuming a stream that broke after adding bytes.
	resumeDelay = 50 * time.Millisecond
	// statusAttempts is how many upstream requests a fill makes while the upstream answers
	// with an error status (5xx, 429) before any byte arrived.
	statusAttempts = 3
	// fillChunk is the copy buffer size (bytes).
	fillChunk = 256 << 10
)

// ErrManifestTooLarge marks a manifest body past MaxManifestBytes (distribution's own limit).
var ErrManifestTooLarge = errors.New("manifest larger than the limit")

// ErrDigestMismatch marks a fill, or a manifest, whose bytes do not hash to the requested digest.
var ErrDigestMismatch = errors.New("content does not match its digest")

// ErrBadRange marks an upstream's partial answer (206) for a range other than the one asked for:
// a Content-Range that is missing, does not start where the request's Range did (byte 0 when
// none was sent), or names another total size than the blob's (RFC 9110 section 15.3.7). Its
// bytes are not used: the fill fails at once.
var ErrBadRange = errors.New("a partial answer (206) for another range than the one asked for")

// ErrShortBody marks an upstream whose blob bodies keep ending before their stated length (a
// clean end of stream, or a connection closed early) without adding a byte: statusAttempts
// answers in a row before the fill's first byte, maxStalledAttempts once bytes arrived. A body
// that ends early but adds bytes is resumed, as a reset is.
var ErrShortBody = errors.New("the upstream's body keeps ending before its stated length")

// errEarlyEnd marks one attempt whose body ended before its stated length.
var errEarlyEnd = errors.New("body ended early")

// ErrBroken is returned by (*Fill).Serve when the response was cut short after its headers
// went out (the fill failed or the client went away): the caller must abort the connection
// (panic(http.ErrAbortHandler)) so the client sees a broken transfer.
var ErrBroken = errors.New("blob response broken after its headers were sent")

// ErrFillGone is returned by (*Fill).Serve when the fill was over, its blob verified (and
// stored, or streamed without being stored on a full disk), before the request opened its staging
// file, which is gone: a loaded machine may schedule a request between its StartFill and its
// Serve so (issue 23). Nothing was sent: the caller answers the request again, from the cache or
// through a new fill.
var ErrFillGone = errors.New("the fill was over before the request read it")

// CommitFunc stores a verified blob: the staging file at path holds exactly desc's bytes. It
// runs detached from every request, under the fill's deadline.
type CommitFunc func(ctx context.Context, path string, desc v1.Descriptor) error

// Fill is one blob being fetched from an upstream into a staging file. Any number of client
// requests read it while it grows; the final byte is released only once the whole blob hashed
// to its digest, so no client ever receives a complete but wrong blob.
type Fill struct {
	key    string
	desc   v1.Descriptor
	path   string // staging file
	remote *Remote
	repo   string
	commit CommitFunc
	via    []string // Via ids of the request that started it (WithVia)
	// peer is the request of a member that started it (WithPeerRequest), nil for a client's:
	// a member's fill asks no other member but the one cache-only probe.
	peer *peerRequest

	// private marks a pass-through (startPassThrough): one reader's own stream of a blob that
	// cannot be stored, with no staging file; hash is the digest's state at its first byte.
	private bool
	hash    hash.Hash
	cancel  context.CancelFunc // a pass-through's: ends it
	// spilling is set once bytes go to win rather than the staging file (spill.go).
	spilling atomic.Bool

	mu      sync.Mutex
	written int64
	// spillFrom is where the staging file ended when the disk filled (-1: it did not): bytes
	// from there on go to win, a ring holding bytes [winStart, written) (win[offset%len(win)]),
	// and are never stored. lagWait bounds the wait for a lagging reader (0: none, ctx aside).
	spillFrom int64
	win       []byte
	winStart  int64
	lagWait   time.Duration
	// hashState is the digest's state (encoding.BinaryMarshaler) over the first hashAt bytes,
	// kept when the disk filled: pass-throughs start there (hashKept: the attempt was made).
	hashState []byte
	hashAt    int64
	hashKept  bool
	readers   map[*fillReader]struct{} // requests reading the fill (their windows stay)
	readStep  chan struct{}            // closed and replaced when a reader moves on or leaves
	ended     bool                     // the download is over (the window goes with the last reader)
	size      int64                    // bytes of the blob; -1 until an upstream answer tells (written by run only)
	verified  bool
	answered  bool // an upstream GET answered 2xx: the blob is coming
	err       error
	tier      string        // tier of the latest upstream answer (TierShared, TierUpstream)
	progress  chan struct{} // closed and replaced on every change
	done      chan struct{} // closed when the fill is over (committed or failed)
}

// released is how many bytes readers may see: all once verified, else all but the last byte
// (all but one when the size is not known yet), so no reader gets a complete blob that then
// fails its digest.
func (f *Fill) released() int64 {
	switch {
	case f.verified:
		return f.written
	case f.size >= 0 && f.written < f.size:
		return f.written
	}
	return max(0, f.written-1)
}

// setSize records the blob's size once an upstream answer tells it.
func (f *Fill) setSize(n int64) {
	f.mu.Lock()
	f.size = n
	f.notify()
	f.mu.Unlock()
}

// sizeNow is the blob's size, -1 while unknown.
func (f *Fill) sizeNow() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.size
}

func (f *Fill) notify() {
	close(f.progress)
	f.progress = make(chan struct{})
}

func (f *Fill) advance(n int64) {
	f.mu.Lock()
	f.written += n
	f.notify()
	f.mu.Unlock()
}

func (f *Fill) finish(err error) {
	f.mu.Lock()
	if err != nil {
		f.err = err
	} else {
		f.verified = true
	}
	f.notify()
	f.mu.Unlock()
}

// fillSet holds the fills in flight, one per (upstream, repository, digest).
type fillSet struct {
	dir string
	mu  sync.Mutex
	m   map[string]*Fill
	wg  sync.WaitGroup
}

func newFillSet(dir string) *fillSet { return &fillSet{dir: dir, m: map[string]*Fill{}} }

func (s *fillSet) get(key string) *Fill {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key]
}

// start returns the fill for key, starting it with run when none is in flight; joined reports
// that another request had started it.
func (s *fillSet) start(key string, mk func(path string) *Fill, run func(*Fill)) (f *Fill, joined bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.m[key]; f != nil {
		return f, true, nil
	}
	tmp, err := os.CreateTemp(s.dir, "fill-*")
	if err != nil {
		return nil, false, fmt.Errorf("create staging file: %w", err)
	}
	_ = tmp.Close()
	f = mk(tmp.Name())
	s.m[key] = f
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		run(f)
		s.mu.Lock()
		delete(s.m, key)
		s.mu.Unlock()
		_ = os.Remove(f.path)
		close(f.done)
	}()
	return f, false, nil
}

func (s *fillSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// wait blocks until no fill is in flight or ctx ends.
func (s *fillSet) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hasDigest reports whether a fill of blob d is in flight, in any upstream and repository.
func (s *fillSet) hasDigest(d digest.Digest) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.m {
		if f.desc.Digest == d {
			return true
		}
	}
	return false
}

// hasPath reports whether path is the staging file of a fill in flight.
func (s *fillSet) hasPath(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.m {
		if f.path == path {
			return true
		}
	}
	return false
}

// FillingDigest reports whether a fill of blob d is in flight (fetching or being committed) in
// any upstream and repository: eviction leaves such a blob's data alone.
func (f *Fetcher) FillingDigest(d digest.Digest) bool { return f.fills.hasDigest(d) }

// StagingInUse reports whether path (in Options.StagingDir) is the staging file of a fill in
// flight: a sweep of the leftovers of an earlier run leaves it.
func (f *Fetcher) StagingInUse(path string) bool { return f.fills.hasPath(path) }

func fillKey(upstream, repo string, dgst digest.Digest) string {
	return upstream + "/" + repo + "@" + dgst.String()
}

// Filling returns the fill of repo's blob dgst in flight, nil when there is none.
func (r *Remote) Filling(repo string, dgst digest.Digest) *Fill {
	return r.f.fills.get(fillKey(r.Name, repo, dgst))
}

// StartFill returns the fill of repo's blob desc (Size -1 when the upstream's HEAD did not tell
// it: the GET does, or, when even the GET gives no length, the end of its stream), starting it when none is in flight; joined
// reports that another request had started it. A started fill runs detached from the request
// (a client that goes away does not abort it) until it is stored with commit, fails, reaches
// the fill timeout, or the Fetcher abandons it; of ctx it keeps only the Via hops (WithVia) and
// the member whose request it serves (WithPeerRequest).
func (r *Remote) StartFill(ctx context.Context, repo string, desc v1.Descriptor, commit CommitFunc) (f *Fill, joined bool, err error) {
	key := fillKey(r.Name, repo, desc.Digest)
	via := viaFrom(ctx)
	var pr *peerRequest
	if sender, _, ok := PeerRequest(ctx); ok {
		pr = &peerRequest{sender: sender}
	}
	return r.f.fills.start(key, func(path string) *Fill {
		return &Fill{key: key, desc: desc, path: path, remote: r, repo: repo, commit: commit, via: via, peer: pr,
			size: desc.Size, spillFrom: -1, lagWait: spillLagWait, progress: make(chan struct{}), done: make(chan struct{})}
	}, (*Fill).run)
}

// Tier is where the fill's latest upstream answer came from: TierShared or TierUpstream ("" before
// any answer).
func (f *Fill) Tier() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tier
}

// tierOr is Tier, TierUpstream before any answer.
func (f *Fill) tierOr() string {
	if t := f.Tier(); t != "" {
		return t
	}
	return TierUpstream
}

func (f *Fill) setTier(t string) {
	f.mu.Lock()
	f.tier = t
	f.mu.Unlock()
}

// Stated is the blob as the fill started with it: Size as the upstream's HEAD stated it before
// the fill's GET (which then had to match), -1 when it did not. Desc's size can be only the
// GET's own Content-Length, unchecked until the digest is.
func (f *Fill) Stated() v1.Descriptor { return f.desc }

// Desc is the blob being filled; Size is -1 while unknown.
func (f *Fill) Desc() v1.Descriptor {
	d := f.desc
	d.Size = f.sizeNow()
	return d
}

// fillErrorLevel is the level a failed fill is logged at: debug when the upstream answered
// that the blob does not exist (a client's question, answered 404 and in the access log), warn
// when it refused access (the node falls back with its own credentials), error otherwise (the
// upstream unavailable, a broken or wrong stream: something an operator acts on).
func fillErrorLevel(err error) zerolog.Level {
	var ue *Error
	switch {
	case !errors.As(err, &ue) || ue.Unavailable():
		return zerolog.ErrorLevel
	case ue.NotFound():
		return zerolog.DebugLevel
	case ue.Status == http.StatusUnauthorized || ue.Status == http.StatusForbidden:
		return zerolog.WarnLevel
	}
	return zerolog.ErrorLevel
}

// run fetches f's blob from the upstream into its staging file, resuming with Range when the
// stream breaks, verifies the digest, releases the last byte to readers, and commits it.
func (f *Fill) run() {
	r := f.remote
	ctx, cancel := context.WithTimeout(f.context(r.f.fillCtx), r.f.opts.FillTimeout)
	defer cancel()
	defer f.over()
	log := r.f.log.With().Str("upstream", r.Name).Str("repository", f.repo).Str("digest", f.desc.Digest.String()).Logger()
	r.f.metrics.fillsInFlight.Inc()
	defer r.f.metrics.fillsInFlight.Dec()
	start := time.Now()

	err := f.download(ctx)
	if errors.Is(err, errSpillNoWindow) {
		// Not the upstream's failure: the disk is full and so is the spill budget.
		log.Warn().Err(err).Int64("bytes", f.written).Msg("disk full: fill stopped; its clients get their own upstream streams")
		f.finish(err)
		return
	}
	r.f.metrics.observe(r.Name, f.tierOr(), KindBlob, start, err)
	if r.f.fillCtx.Err() == nil { // not abandoned by Close or Drain
		r.f.health.record(r.Name, f.tierOr(), err)
	}
	if err != nil {
		log.WithLevel(fillErrorLevel(err)).Err(err).Int64("bytes", f.written).Msg("blob fill failed; nothing cached")
		f.finish(err)
		return
	}
	f.finish(nil)
	f.mu.Lock()
	spilled := f.spillFrom >= 0
	f.mu.Unlock()
	if spilled {
		log.Warn().Int64("bytes", f.size).Msg("disk full: blob fetched, verified and served, but not stored")
		return
	}
	if err := f.commit(ctx, f.path, v1.Descriptor{Digest: f.desc.Digest, Size: f.size, MediaType: "application/octet-stream"}); err != nil {
		log.Error().Err(err).Msg("blob fetched and served but not stored")
		return
	}
	log.Debug().Int64("bytes", f.size).Str("duration", clitext.Span(time.Since(start))).Msg("blob cached")
}

// context is parent with what f's upstream requests carry: the Via hops, the tier they report
// to f, and the member whose request f serves.
func (f *Fill) context(parent context.Context) context.Context {
	ctx := withPeerMemory(withTier(WithVia(parent, f.via), f.setTier))
	if f.peer != nil {
		ctx = WithPeerRequest(ctx, f.peer.sender, false)
	}
	return ctx
}

// ErrUnknownSizeTooLarge marks a fill of a blob whose size no upstream answer stated that grew
// past Options.MaxUnknownBlobSize; nothing of it is stored.
var ErrUnknownSizeTooLarge = errors.New("blob of unstated size is larger than the bound")

// download fetches the blob into the staging file, resuming a broken stream from the bytes
// written, and checks its size and digest.
func (f *Fill) download(ctx context.Context) error {
	r := f.remote
	var file *os.File // none for a pass-through
	if !f.private {
		var err error
		if file, err = os.OpenFile(f.path, os.O_WRONLY, 0); err != nil {
			return fmt.Errorf("open staging file: %w", localError{err})
		}
		defer file.Close()
	}
	h := f.hash
	if h == nil {
		h = f.desc.Digest.Algorithm().Hash()
	}
	var lastErr error
	stalled := 0 // attempts in a row that added no byte
	short := 0   // of those, the attempts in a row whose body ended early
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(retryDelay(stalled)):
			case <-ctx.Done():
				return fmt.Errorf("fill timeout or abandoned after %s: %w (last error: %w)", clitext.Count(attempt, "attempt"), ctx.Err(), lastErr)
			}
		}
		progressed, err := f.downloadOnce(ctx, file, h)
		if err == nil {
			break
		}
		lastErr = err
		if ctx.Err() != nil {
			return fmt.Errorf("fill timeout or abandoned after %s: %w (last error: %w)", clitext.Count(attempt+1, "attempt"), ctx.Err(), err)
		}
		if progressed {
			stalled, short = 0, 0
		} else {
			stalled++
			short++
			if !errors.Is(err, errEarlyEnd) {
				short = 0
			}
		}
		if f.finalError(err, attempt, short) {
			return f.shortBody(err, short)
		}
		if stalled >= maxStalledAttempts {
			return f.shortBody(fmt.Errorf("giving up after %s in a row without a byte (%s in all): %w", clitext.Count(stalled, "attempt"), clitext.Count(attempt+1, "attempt"), err), short)
		}
		r.f.log.Warn().Err(err).Str("upstream", r.Name).Str("digest", f.desc.Digest.String()).
			Int64("offset", f.written).Bool("progressed", progressed).Int("attempt", attempt+1).Msg("blob stream broke; resuming")
		r.f.metrics.resumes.WithLabelValues(r.Name).Inc()
	}
	if f.size < 0 || f.written != f.size {
		return fmt.Errorf("got %d of %s: %w", f.written, clitext.Count(f.size, "byte"), lastErr)
	}
	if got := digest.NewDigest(f.desc.Digest.Algorithm(), h); got != f.desc.Digest {
		r.f.metrics.mismatches.WithLabelValues(r.Name, KindBlob, f.tierOr()).Inc()
		r.f.distrustPeers(ctx)
		return fmt.Errorf("upstream %s: blob %s: %w (got %s)", r.Name, f.desc.Digest, ErrDigestMismatch, got)
	}
	if file == nil || f.spilling.Load() {
		return nil
	}
	if err := file.Sync(); err != nil {
		return fmt.Errorf("sync staging file: %w", localError{err})
	}
	return nil
}

// retryDelay is the wait before the next attempt of download: resumeDelay after an attempt that
// added bytes, else doubling from 250ms with the attempts in a row that added none (at most 4s).
func retryDelay(stalled int) time.Duration {
	if stalled > 0 {
		return time.Duration(1<<min(stalled-1, 4)) * 250 * time.Millisecond
	}
	return resumeDelay
}

// finalError reports whether err, of the attempt numbered attempt (from 0), ends download
// without a resume: the blob is not there or not ours to read, its bytes are wrong or too many,
// the upstream answered another range than the one asked for, it keeps answering an error or
// a body that ends early (short: that many attempts in a row) before a byte was sent, or no
// upstream slot came free (ErrUpstreamBusy) before a byte was sent.
func (f *Fill) finalError(err error, attempt, short int) bool {
	var ue *Error
	if errors.As(err, &ue) && (ue.NotFound() || ue.Status == http.StatusForbidden || ue.Status == http.StatusUnauthorized) {
		return true
	}
	if errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrUnsafeTarget) || errors.Is(err, ErrUnknownSizeTooLarge) || errors.Is(err, ErrBadRange) ||
		errors.Is(err, errSpillNoWindow) {
		return true
	}
	// The upstream answers, but with an error or an empty body, and has not sent a byte:
	// clients waiting for headers get that error now rather than after every resume attempt.
	if f.written == 0 && (short >= statusAttempts || errors.Is(err, ErrUpstreamBusy)) {
		return true // a busy request already waited the upstream timeout for a slot
	}
	return errors.As(err, &ue) && ue.Status != 0 && f.written == 0 && attempt+1 >= statusAttempts
}

// shortBody is err, the error that ends download, marked ErrShortBody when the last short
// attempts in a row, all that added no byte, ended early.
func (f *Fill) shortBody(err error, short int) error {
	if short == 0 {
		return err
	}
	return fmt.Errorf("upstream %s: blob %s: %w (%s in a row): %w", f.remote.Name, f.desc.Digest, ErrShortBody, clitext.Count(short, "answer"), err)
}

// downloadOnce makes one upstream request for the rest of the blob (all of it, or with Range
// from f.written) and copies what arrives. The stream must keep moving: a stall of the upstream
// timeout breaks it so the next attempt can resume.
func (f *Fill) downloadOnce(ctx context.Context, file *os.File, h hash.Hash) (progressed bool, err error) {
	r := f.remote
	if f.size >= 0 && f.written == f.size {
		return false, nil
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hdr := http.Header{}
	offset := f.written
	if offset > 0 {
		hdr.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	resp, err := r.client.do(rctx, http.MethodGet, f.repo, "blobs", f.desc.Digest.String(), hdr, http.StatusOK, http.StatusPartialContent)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if !f.answered {
		f.mu.Lock()
		f.answered = true
		f.notify()
		f.mu.Unlock()
	}
	// The GET is the truth about the size; the HEAD before it was a hint.
	total := resp.ContentLength
	if resp.StatusCode == http.StatusPartialContent {
		cr := resp.Header.Get("Content-Range")
		start := contentRangeStart(cr)
		total = contentRangeTotal(cr)
		if start != offset || total < 0 || (f.size >= 0 && f.written > 0 && total != f.size) {
			return false, fmt.Errorf("upstream %s: blob %s: asked from byte %d, answered 206 with Content-Range %q: %w",
				r.Name, f.desc.Digest, offset, cr, ErrBadRange)
		}
	}
	if total >= 0 && total != f.size {
		if f.size >= 0 && f.written > 0 {
			return false, fmt.Errorf("upstream %s: blob %s: %s announced, %d expected", r.Name, f.desc.Digest, clitext.Count(total, "byte"), f.size)
		}
		f.setSize(total)
	}
	if offset > 0 && resp.StatusCode == http.StatusOK {
		// The upstream ignored Range: start over, keeping what readers already have.
		h.Reset()
		return f.copyFrom(rctx, cancel, file, h, resp.Body, 0, offset)
	}
	return f.copyFrom(rctx, cancel, file, h, resp.Body, offset, 0)
}

// copyFrom reads body, which starts at byte pos of the blob, into the staging file. Bytes below
// skipUntil are already in the file (an upstream that ignored Range): they are hashed but not
// written again.
func (f *Fill) copyFrom(ctx context.Context, cancel context.CancelFunc, file *os.File, h hash.Hash, body io.Reader, pos, skipUntil int64) (bool, error) {
	r := f.remote
	timeout := r.f.opts.Timeout
	stall := time.AfterFunc(timeout, cancel)
	defer stall.Stop()
	buf := make([]byte, fillChunk)
	progressed := false
	for f.size < 0 || pos < f.size {
		want := int64(len(buf))
		if f.size >= 0 {
			want = min(want, f.size-pos)
		}
		n, rerr := body.Read(buf[:want])
		if limit := r.f.opts.MaxUnknownBlobSize; f.size < 0 && pos+int64(n) > limit {
			return progressed, fmt.Errorf("upstream %s: blob %s: %w: more than %d bytes (--max-unknown-blob-size %s)",
				r.Name, f.desc.Digest, ErrUnknownSizeTooLarge, limit, clitext.Bytes(limit))
		}
		if n > 0 {
			chunk := buf[:n]
			if pos+int64(n) > skipUntil {
				from := max(0, skipUntil-pos)
				stall.Stop() // a fill that cannot be stored may wait for its readers
				if err := f.store(ctx, file, chunk[from:], pos+from); err != nil {
					return progressed, fmt.Errorf("write staging file: %w", localError{err})
				}
				f.keepHashState(h, pos)
				f.advance(int64(n) - from)
				progressed = true
			}
			stall.Reset(timeout)
			h.Write(chunk)
			pos += int64(n)
			r.f.metrics.upstreamBytes.WithLabelValues(r.Name, f.tierOr()).Add(float64(n))
		}
		if rerr == io.EOF {
			if f.size < 0 {
				// No length was announced: the end of the stream is the end of the blob (a
				// truncated chunked stream is an error, not EOF); the digest decides.
				f.setSize(pos)
				break
			}
			if pos < f.size {
				return progressed, fmt.Errorf("upstream stream ended at byte %d of %d: %w", pos, f.size, errEarlyEnd)
			}
			break
		}
		if rerr != nil {
			return progressed, streamError(ctx, rerr, pos, timeout)
		}
	}
	return progressed, nil
}

// streamError is the error of a body read that failed at byte pos: a stall of timeout (ctx
// ended), the connection closed before the stated length (errEarlyEnd: net/http's answer to a
// body cut short with a FIN), or another break (a reset).
func streamError(ctx context.Context, rerr error, pos int64, timeout time.Duration) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("upstream stream %w for %s at byte %d: %w", errStalled, clitext.Span(timeout), pos, rerr)
	case errors.Is(rerr, io.ErrUnexpectedEOF):
		return fmt.Errorf("upstream stream broke at byte %d: %w: %w", pos, errEarlyEnd, rerr)
	}
	return fmt.Errorf("upstream stream broke at byte %d: %w", pos, rerr)
}

// store writes p at off of the staging file; once the disk is full (ENOSPC), and for a
// pass-through, to the window instead (spill.go).
func (f *Fill) store(ctx context.Context, file *os.File, p []byte, off int64) error {
	if !f.spilling.Load() {
		_, err := file.WriteAt(p, off)
		if err == nil || !errors.Is(err, syscall.ENOSPC) {
			return err
		}
		if err := f.startSpill(off); err != nil {
			return err
		}
	}
	return f.spillWrite(ctx, p, off)
}

// readAt reads released bytes at off: from the staging file, or from the window past spillFrom
// (errDropped when they are gone from it).
func (f *Fill) readAt(file *os.File, p []byte, off int64) (int, error) {
	f.mu.Lock()
	if f.spillFrom >= 0 && off+int64(len(p)) > f.spillFrom {
		if off >= f.spillFrom {
			defer f.mu.Unlock()
			if off < f.winStart || f.win == nil {
				return 0, errDropped
			}
			n := min(int64(len(p)), f.written-off)
			w := int64(len(f.win))
			c := copy(p[:n], f.win[off%w:])
			copy(p[c:n], f.win)
			return int(n), nil
		}
		p = p[:f.spillFrom-off]
	}
	f.mu.Unlock()
	return file.ReadAt(p, off)
}

// Serve streams the fill to one client, honouring Range. It returns how many bytes of the fill
// it sent. Its error is the fill's own error when the fill failed before anything was sent (the
// caller answers it as an error status), ErrFillGone when the fill was over before Serve could
// read it (nothing sent: the caller answers again), ErrSpillMemory, ErrRangeNotKept or
// ErrRangeUnknownSize when it could not start (nothing sent: 503), or ErrBroken when the
// response was cut short after its headers.
//
// A whole GET and an open-ended Range (bytes=N-, containerd's resume) stream as the bytes
// arrive, the last byte held back until the digest matched. A Range that ends before the last
// byte (bytes=A-B, containerd 2.x's parallel chunks, which check no offset) gets its 206 headers
// as early as a whole GET (containerd waits 30 s for headers) and its bytes only once the whole
// blob matched its digest; a fill that fails cuts it, so no complete 206 carries wrong bytes
// (issue 23). A bounded Range is never answered 200: while no upstream answer stated the blob's
// size it is ErrRangeUnknownSize (an open-ended one streams the whole blob without
// Content-Length, as before: the client discards up to its offset). A Range that starts past the
// size the upstream stated is answered once the digest confirmed that size (416), or with the
// fill's error (an upstream that stated a short length: 502), not at once with a 416 that may
// be the upstream's mistake.
func (f *Fill) Serve(ctx context.Context, w http.ResponseWriter, r *http.Request) (int64, error) {
	file, err := os.Open(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, f.gone(ctx)
	}
	if err != nil {
		return 0, fmt.Errorf("open staging file: %w", err)
	}
	defer file.Close()
	rd := &fillReader{ctx: ctx, f: f, file: file}
	// A GET reads from its attach on: a fill that cannot be stored waits for it from then, not
	// from its first Read, which a loaded machine may schedule after the fill went a whole
	// window further (the reader was then left behind, to a stream of its own, without waiting).
	rd.reading.Store(r.Method != http.MethodHead)
	f.attach(rd) // a window of a fill that cannot be stored stays while rd reads it
	defer rd.close()
	if err := f.firstByte(ctx, firstByteWait(f.remote.f.opts.Timeout)); err != nil && !errors.Is(err, errSpillNoWindow) {
		return 0, err
	}
	if err := rd.plan(r); err != nil {
		return 0, err
	}
	// Headers go out once the first byte is here, or after firstByteWait at the latest, before
	// the first byte arrives from the upstream: containerd gives up on a response whose headers
	// take more than 30 s.
	if f.sizeNow() < 0 {
		// Not even the upstream's GET announced a length: stream the whole blob without
		// Content-Length (an open-ended Range is not honoured: its end is unknown).
		w.Header().Del("Content-Length")
		flushOnHeader{w}.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = io.Copy(w, rd)
		}
	} else {
		http.ServeContent(flushOnHeader{w}, r, "", time.Time{}, rd)
	}
	if rd.err != nil && !errors.Is(rd.err, io.EOF) {
		return rd.read, fmt.Errorf("%w: %w", ErrBroken, rd.err)
	}
	return rd.read, nil
}

// gone is Serve's error when f's staging file is gone (removed once f is over, just before f.done
// closes): once f is over, f's own error when it failed, else ErrFillGone.
func (f *Fill) gone(ctx context.Context) error {
	select {
	case <-f.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	err := f.err
	f.mu.Unlock()
	if err != nil && !errors.Is(err, errSpillNoWindow) {
		return err
	}
	return ErrFillGone
}

// ErrRangeUnknownSize marks a Range with an end (bytes=A-B) on a blob being filled whose size no
// upstream answer stated: its 206 could not say the complete length, and a 200 would put the
// whole blob where the client expects the range. Nothing was sent (503).
var ErrRangeUnknownSize = errors.New("a bounded Range on a blob whose size the upstream has not stated")

// plan decides, before the headers, how rd serves r: a bounded Range on a blob not verified yet
// waits for the digest (gate), or is refused when a full disk means its bytes would be gone by
// then; one past the size the upstream stated waits for the digest before its headers; a reader whose first byte is already gone from a fill that cannot be stored starts its
// own stream now, so that no memory for it is a 503 rather than a cut.
func (rd *fillReader) plan(r *http.Request) error {
	f := rd.f
	f.mu.Lock()
	size, verified := f.size, f.verified
	f.mu.Unlock()
	start := int64(0)
	if v := r.Header.Get("Range"); v != "" && r.Method == http.MethodGet {
		from, to, bounded, ok := rangeSpan(v, size)
		switch {
		case !ok:
		case size >= 0 && from >= size && !verified:
			// Past the size the upstream stated, which only the digest confirms: answered
			// (416) once it does; an upstream that stated a short length fails the fill (502).
			rd.at.Store(from) // needs no byte the fill could wait to forget
			f.stepped()
			return f.settle(rd.ctx)
		case bounded && size < 0:
			return ErrRangeUnknownSize
		case bounded:
			// Its bytes must be the ones the fill verifies: never a pass-through's.
			f.mu.Lock()
			keeps := f.keeps(from, to)
			rd.gate = keeps && !verified // read by f's download under f.mu
			f.mu.Unlock()
			f.stepped() // a gated reader is not waited for
			if !keeps {
				return fmt.Errorf("bytes %d-%d of %d: %w", from, to, size, ErrRangeNotKept)
			}
			return nil
		case size >= 0:
			start = from
		}
	}
	rd.at.Store(start) // where rd reads from (not ServeContent's Seek to the end for the size)
	f.stepped()
	f.mu.Lock()
	lost := f.lost(start) && (f.err == nil || errors.Is(f.err, errSpillNoWindow))
	f.mu.Unlock()
	if lost {
		return rd.passThrough()
	}
	return nil
}

// settle waits until f is verified (nil) or failed (its error), or ctx ends.
func (f *Fill) settle(ctx context.Context) error {
	for {
		f.mu.Lock()
		verified, err, ch := f.verified, f.err, f.progress
		f.mu.Unlock()
		switch {
		case verified:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// rangeSpan reads a Range header value (RFC 9110 section 14.1.2: "bytes=A-B", "bytes=A-",
// "bytes=-N", comma-separated) against a blob of size bytes (-1: unknown): the first and the last
// byte it asks for (the last is size-1 for an open-ended or suffix range, -1 when size is
// unknown), and whether it ends before the blob's last byte (bounded; with size unknown: any
// range with an end). ok is false for a value http.ServeContent would not honour as it is.
func rangeSpan(v string, size int64) (from, to int64, bounded, ok bool) {
	spec, found := strings.CutPrefix(strings.TrimSpace(v), "bytes=")
	if !found {
		return 0, 0, false, false
	}
	from, to = -1, -1
	for part := range strings.SplitSeq(spec, ",") {
		start, end, b, ok := rangePart(strings.TrimSpace(part), size)
		if !ok {
			return 0, 0, false, false
		}
		if from < 0 || start < from {
			from = start
		}
		to, bounded = max(to, end), bounded || b
	}
	return from, to, bounded, from >= 0
}

// rangePart is rangeSpan for one range ("A-B", "A-", "-N").
func rangePart(part string, size int64) (start, end int64, bounded, ok bool) {
	a, b, found := strings.Cut(part, "-")
	a, b = strings.TrimSpace(a), strings.TrimSpace(b)
	if !found || a == "" && b == "" {
		return 0, 0, false, false
	}
	if a == "" { // the last b bytes
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, false, false
		}
		return max(0, size-n), size - 1, false, true
	}
	start, err := strconv.ParseInt(a, 10, 64)
	if err != nil || start < 0 {
		return 0, 0, false, false
	}
	if b == "" {
		return start, size - 1, false, true
	}
	e, err := strconv.ParseInt(b, 10, 64)
	if err != nil || e < start {
		return 0, 0, false, false
	}
	if size >= 0 && e >= size-1 {
		return start, size - 1, false, true
	}
	return start, e, true, true
}

// contentRangeStart returns the first byte position of a Content-Range value ("bytes 0-0/1234",
// RFC 9110 section 14.4), -1 when it has none ("bytes */1234") or does not parse.
func contentRangeStart(v string) int64 {
	rest, ok := strings.CutPrefix(strings.TrimSpace(v), "bytes ")
	if !ok {
		return -1
	}
	first, _, ok := strings.Cut(strings.TrimSpace(rest), "-")
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(first, 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// contentRangeTotal returns the complete length from a Content-Range value
// ("bytes 0-0/1234", RFC 9110 section 14.4), -1 when it is absent or "*".
func contentRangeTotal(v string) int64 {
	_, total, ok := strings.Cut(v, "/")
	if !ok || !strings.HasPrefix(strings.TrimSpace(v), "bytes ") {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(total), 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// firstByteWait is how long a client's response headers wait for a fill's first byte once the
// upstream answered 2xx. Until the upstream answers at all they wait up to maxHeaderWait, so an
// upstream that answers errors becomes an error status instead of a broken 200. Both stay below
// containerd's 30 s header deadline (with the blob HEAD before them, bounded by the upstream
// timeout as well).
func firstByteWait(upstreamTimeout time.Duration) time.Duration {
	return min(upstreamTimeout/3, 5*time.Second)
}

// maxHeaderWait bounds how long response headers wait for an upstream that has not answered.
const maxHeaderWait = 15 * time.Second

// firstByte waits until the fill has a byte for readers, is over, or wait has passed since the
// upstream answered 2xx (maxHeaderWait at most). It returns the fill's error when the fill
// failed before releasing anything.
func (f *Fill) firstByte(ctx context.Context, wait time.Duration) error {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	deadline := time.NewTimer(max(wait, maxHeaderWait))
	defer deadline.Stop()
	waited := false
	for {
		f.mu.Lock()
		avail, err, verified, answered, ch := f.released(), f.err, f.verified, f.answered, f.progress
		f.mu.Unlock()
		switch {
		case avail > 0 || verified:
			return nil
		case err != nil:
			return err
		case waited && answered:
			return nil
		}
		select {
		case <-ch:
		case <-timer.C:
			waited = true
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// flushOnHeader sends the response headers as soon as they are written.
type flushOnHeader struct{ http.ResponseWriter }

func (w flushOnHeader) WriteHeader(code int) {
	w.ResponseWriter.WriteHeader(code)
	if code < 300 {
		// Errors (a 416) are small and complete: the server then adds their Content-Length.
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w flushOnHeader) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// fillReader is an io.ReadSeeker over a growing fill: Read blocks until bytes are released.
type fillReader struct {
	ctx  context.Context
	f    *Fill
	file *os.File
	// own is rd's pass-through once bytes it needs are gone from f's window (from own.spillFrom
	// on, rd reads own; before it, f's staging file).
	own *Fill
	// gate holds every byte back until f is verified (a bounded Range: see Fill.Serve).
	gate bool
	off  int64
	read int64
	err  error
	// What fills waiting for their readers see: at is where rd reads next (set by plan and
	// each Read; a Seek alone does not move it: ServeContent seeks to the end for the size),
	// reading is set from the attach of a GET (by the first Read otherwise), away once rd
	// reads own.
	at      atomic.Int64
	reading atomic.Bool
	away    atomic.Bool
}

// close ends rd's pass-through and lets its fills' windows go.
func (rd *fillReader) close() {
	if rd.own != nil {
		rd.own.cancel()
		<-rd.own.done
		rd.own.detach(rd)
	}
	rd.f.detach(rd)
}

// passThrough gives rd its own upstream stream (Fill.startPassThrough). A gated reader gets
// ErrRangeNotKept instead: its bytes must be the ones f verified.
func (rd *fillReader) passThrough() error {
	switch {
	case rd.gate:
		return ErrRangeNotKept
	case rd.own != nil:
		return errors.New("disk full: a client's own stream lost bytes") // its window waits for rd
	}
	p, err := rd.f.startPassThrough(rd.ctx)
	if err != nil {
		return err
	}
	rd.reading.Store(true)
	p.attach(rd)
	rd.own = p
	rd.away.Store(true)
	rd.f.stepped() // f no longer waits for rd
	return nil
}

func (rd *fillReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += rd.off
	case io.SeekEnd:
		size := rd.f.sizeNow()
		if size < 0 {
			return 0, errors.New("seek: size not known yet")
		}
		offset += size
	default:
		return 0, errors.New("seek: invalid whence")
	}
	if offset < 0 {
		return 0, errors.New("seek: negative position")
	}
	rd.off = offset
	return offset, nil
}

// publish makes rd's position the one the fill waits for, waking the fill (and rd's own stream)
// when a Seek moved it since the last Read.
func (rd *fillReader) publish() {
	rd.reading.Store(true)
	if rd.at.Swap(rd.off) != rd.off {
		rd.f.stepped()
		if rd.own != nil {
			rd.own.stepped()
		}
	}
}

// readReleased reads released bytes of f (below avail) at rd's position; retry is true when they
// were forgotten meanwhile (then they are lost: the caller looks again).
func (rd *fillReader) readReleased(f *Fill, p []byte, avail int64) (n int, retry bool, err error) {
	got, err := f.readAt(rd.file, p[:min(int64(len(p)), avail-rd.off)], rd.off)
	if errors.Is(err, errDropped) {
		return 0, true, nil
	}
	rd.off += int64(got)
	rd.read += int64(got)
	rd.at.Store(rd.off)
	f.stepped()
	if errors.Is(err, io.EOF) && got > 0 {
		err = nil
	}
	if err != nil {
		rd.err = err
	}
	return got, false, err
}

func (rd *fillReader) Read(p []byte) (int, error) {
	rd.publish()
	for {
		f := rd.f
		if rd.own != nil && rd.off >= rd.own.spillFrom {
			f = rd.own
		}
		f.mu.Lock()
		avail, ferr, verified, size, ch := f.released(), f.err, f.verified, f.size, f.progress
		lost := f.lost(rd.off)
		f.mu.Unlock()
		failed := ferr != nil && !errors.Is(ferr, errSpillNoWindow) // not a stop for want of memory
		switch {
		case rd.gate && !verified && ferr == nil:
			// A bounded Range: nothing before the whole blob is verified.
		case rd.gate && !verified:
			if rd.err = ferr; !failed {
				rd.err = fmt.Errorf("%w: %w", ErrRangeNotKept, ferr)
			}
			return 0, rd.err
		case lost && failed:
			rd.err = ferr
			return 0, ferr
		case lost:
			if err := rd.passThrough(); err != nil {
				rd.err = err
				return 0, err
			}
			continue
		case rd.off < avail:
			got, retry, err := rd.readReleased(f, p, avail)
			if retry {
				continue // forgotten meanwhile: lost now
			}
			return got, err
		case ferr != nil:
			rd.err = ferr
			return 0, ferr
		case verified && rd.off >= size:
			return 0, io.EOF
		}
		select {
		case <-ch:
		case <-rd.ctx.Done():
			rd.err = rd.ctx.Err()
			return 0, rd.err
		}
	}
}
