package upstream

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"hash"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodecache/nodecache/internal/clitext"
)

// A fill whose staging file hits ENOSPC cannot be stored: from then on its bytes stream through
// a window in memory, a ring of the last bytes received, and are forgotten once every reader
// reading along has them (issue 23: before, the rest of the blob was kept in memory, so one GET
// of a large layer on a full disk took as much memory as the layer). A reader that falls behind
// the window, or joins once bytes it needs are gone, gets its own upstream stream of the rest of
// the blob (a pass-through: the same window, for one reader, verified against the digest like
// every fill). Every window comes from one budget shared by all fills (Options.SpillMemory): a
// fill that finds it used up stops and leaves its readers to pass-throughs, and a reader that
// finds no room for its pass-through gets ErrSpillMemory (503 before the headers, a cut after).

// Spill tuning.
const (
	// DefaultSpillWindow (8 MiB) is Options.SpillWindow: enough for clients reading at the
	// upstream's pace, small next to the chart's 512 MiB memory limit.
	DefaultSpillWindow = 8 << 20
	// DefaultSpillMemory (64 MiB) is Options.SpillMemory: eight fills' windows.
	DefaultSpillMemory = 64 << 20
	// passWindow is the window of one reader's pass-through (bytes): two copy chunks, so the
	// upstream stream and the client overlap.
	passWindow = 2 * fillChunk
	// minSpillWindow is the least window a fill takes from the budget (bytes).
	minSpillWindow = 2 * fillChunk
	// spillLagWait is how long a fill that cannot be stored waits for a reader a whole window
	// behind that reads nothing, when it would forget bytes that reader still needs; then the
	// reader is left behind (it gets a pass-through when it reads on). A reader that moves is
	// waited for: the fill goes at the pace of the slowest client reading along, as one stream
	// through a proxy would, and one that stops holds the others for this long once.
	spillLagWait = 3 * time.Second
)

// ErrSpillMemory marks a request that would need memory for bytes that cannot be stored (the
// disk is full) beyond Options.SpillMemory: nothing was sent (the caller answers 503, which sends
// containerd to its next host) or the response was cut.
var ErrSpillMemory = errors.New("disk full and the memory for blobs that cannot be stored is in use")

// ErrRangeNotKept marks a bounded Range on a blob that cannot be stored (the disk is full) whose
// bytes will not be in memory any more when the blob is verified: nothing was sent (503) or the
// response was cut. See Fill.Serve.
var ErrRangeNotKept = errors.New("disk full: the range's bytes are not kept until the blob is verified")

// errSpillNoWindow ends a fill that hit ENOSPC when the spill budget has no window left for it:
// its readers go on with pass-throughs.
var errSpillNoWindow = errors.New("no memory left to stream a blob that cannot be stored")

// errDropped is readAt's answer for bytes no longer in a fill's window.
var errDropped = errors.New("bytes no longer in memory")

// spillBudget bounds the bytes of every fill's and pass-through's window together.
type spillBudget struct {
	mu    sync.Mutex
	limit int64
	used  int64
	gauge prometheus.Gauge
}

// take reserves up to want bytes, and at least least: it returns what it reserved, 0 when not
// even least is free.
func (b *spillBudget) take(want, least int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(want, b.limit-b.used)
	if n < least {
		return 0
	}
	b.used += n
	b.gauge.Set(float64(b.used))
	return n
}

// give returns n reserved bytes.
func (b *spillBudget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.gauge.Set(float64(b.used))
	b.mu.Unlock()
}

// startSpill turns f, whose staging file hit ENOSPC at off, into a fill that streams through a
// window, and asks for room (Options.OnDiskFull). It returns errSpillNoWindow when the budget
// has no window for it.
func (f *Fill) startSpill(off int64) error {
	r := f.remote
	n := r.f.spill.take(r.f.opts.SpillWindow, minSpillWindow)
	f.mu.Lock()
	f.spillFrom, f.winStart = off, off
	if n > 0 {
		f.win = make([]byte, n)
	}
	f.spilling.Store(true)
	f.mu.Unlock()
	r.f.log.Warn().Str("upstream", r.Name).Str("digest", f.desc.Digest.String()).Int64("offset", off).Int64("window_bytes", n).
		Msg("disk full: the rest of this blob streams through memory to the clients reading it and is not stored")
	if cb := r.f.opts.OnDiskFull; cb != nil {
		lacked := int64(-1)
		if size := f.sizeNow(); size >= 0 {
			lacked = size - off
		}
		cb(lacked)
	}
	if n == 0 {
		return fmt.Errorf("%w (%s of fills that cannot be stored in memory already)", errSpillNoWindow, clitext.Bytes(r.f.opts.SpillMemory))
	}
	return nil
}

// spillWrite puts p, the bytes at off (the end of what was received), in f's window, forgetting
// the oldest bytes to make room: first waiting, up to f.lagWait (no bound when 0, ctx aside),
// for readers reading along that still need them.
func (f *Fill) spillWrite(ctx context.Context, p []byte, off int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if off != f.written {
		return fmt.Errorf("disk full: out-of-order write at %d, want %d", off, f.written)
	}
	if int64(len(p)) > int64(len(f.win)) {
		return errSpillNoWindow
	}
	need := off + int64(len(p)) - int64(len(f.win)) // the window's first byte once p is in
	if need > f.winStart {
		if f.readStep == nil {
			f.readStep = make(chan struct{})
		}
		var (
			timer   *time.Timer
			timeout <-chan time.Time
		)
		if f.lagWait > 0 {
			timer = time.NewTimer(f.lagWait)
			defer timer.Stop()
			timeout = timer.C
		}
		last, lagging := f.lagging(need)
	wait:
		for lagging {
			ch := f.readStep
			f.mu.Unlock()
			select {
			case <-ch:
				f.mu.Lock()
			case <-timeout:
				f.mu.Lock()
				break wait
			case <-ctx.Done():
				f.mu.Lock()
				return ctx.Err()
			}
			var at int64
			if at, lagging = f.lagging(need); lagging && at > last && timer != nil {
				timer.Reset(f.lagWait) // the slowest reader moves: it reads along
			}
			last = at
		}
		f.winStart = need
	}
	w := int64(len(f.win))
	c := copy(f.win[off%w:], p)
	copy(f.win, p[c:])
	return nil
}

// lagging reports whether a reader reading along still needs bytes below need, and where the
// slowest such reader is (f.mu held). Readers that will not read (a HEAD), hold a bounded range (they
// read once the blob is verified), have their own stream (but in that stream), or are already
// behind the window do not count.
func (f *Fill) lagging(need int64) (slowest int64, lagging bool) {
	for rd := range f.readers {
		if rd.gate || !rd.reading.Load() || rd.away.Load() && !f.private {
			continue
		}
		if at := rd.at.Load(); at < need && (at >= f.winStart || f.winStart == f.spillFrom) && (!lagging || at < slowest) {
			slowest, lagging = at, true
		}
	}
	return slowest, lagging
}

// lost reports whether byte off will never be readable from f (f.mu held): it is past the end
// of the staging file and gone from the window, or f stopped without a window.
func (f *Fill) lost(off int64) bool {
	return f.spillFrom >= 0 && off >= f.spillFrom && (off < f.winStart || errors.Is(f.err, errSpillNoWindow))
}

// keeps reports whether bytes [from, to] of f will still be readable when f is verified (f.mu
// held): in the staging file, or in the window's last bytes (f is not told when they are read,
// so a bounded range reads them after the fill is over).
func (f *Fill) keeps(from, to int64) bool {
	if f.spillFrom < 0 || to < f.spillFrom {
		return true
	}
	from = max(from, f.spillFrom)
	return f.win != nil && f.err == nil && f.size >= 0 && from >= f.winStart && from >= f.size-int64(len(f.win))
}

// keepHashState keeps the digest's state over the blob's first pos bytes, when f just started
// spilling at or after pos: a pass-through goes on from there instead of from the first byte.
func (f *Fill) keepHashState(h hash.Hash, pos int64) {
	if f.private || !f.spilling.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hashKept {
		return
	}
	f.hashKept = true
	if m, ok := h.(encoding.BinaryMarshaler); ok && pos <= f.spillFrom {
		if b, err := m.MarshalBinary(); err == nil {
			f.hashState, f.hashAt = b, pos
		}
	}
}

// attach registers rd as a reader of f: f's window stays while it is attached.
func (f *Fill) attach(rd *fillReader) {
	f.mu.Lock()
	if f.readers == nil {
		f.readers = map[*fillReader]struct{}{}
	}
	f.readers[rd] = struct{}{}
	f.mu.Unlock()
}

// detach removes rd from f's readers, releasing f's window when f is over and rd was the last.
func (f *Fill) detach(rd *fillReader) {
	f.mu.Lock()
	delete(f.readers, rd)
	f.stepLocked()
	f.releaseIfIdle()
	f.mu.Unlock()
}

// over marks f's download as over, releasing its window when no reader is attached.
func (f *Fill) over() {
	f.mu.Lock()
	f.ended = true
	f.releaseIfIdle()
	f.mu.Unlock()
}

// releaseIfIdle gives f's window back to the budget once f is over and has no reader (f.mu
// held); its bytes are then lost to a reader attaching later.
func (f *Fill) releaseIfIdle() {
	if !f.ended || len(f.readers) > 0 || f.win == nil {
		return
	}
	f.remote.f.spill.give(int64(len(f.win)))
	f.win = nil
	f.winStart = f.written
}

// stepped tells f's download, should it wait for its readers, that one moved on.
func (f *Fill) stepped() {
	if !f.spilling.Load() {
		return
	}
	f.mu.Lock()
	f.stepLocked()
	f.mu.Unlock()
}

func (f *Fill) stepLocked() {
	if f.readStep != nil {
		close(f.readStep)
	}
	f.readStep = make(chan struct{})
}

// startPassThrough starts, for one reader of f (which cannot be stored) whose bytes are gone
// from f's window, its own fetch of f's blob: from where f's digest state was kept (or the first
// byte), through a window of passWindow bytes that waits for that reader, verified like any
// fill. It runs until it is over or ctx (the reader's request) ends.
//
// Errors: ErrSpillMemory when the budget has no window for it.
func (f *Fill) startPassThrough(ctx context.Context) (*Fill, error) {
	r := f.remote
	f.mu.Lock()
	state, at, size := f.hashState, f.hashAt, f.size
	f.mu.Unlock()
	h := f.desc.Digest.Algorithm().Hash()
	if u, ok := h.(encoding.BinaryUnmarshaler); !ok || state == nil || u.UnmarshalBinary(state) != nil {
		h.Reset()
		at = 0
	}
	n := r.f.spill.take(passWindow, passWindow)
	if n == 0 {
		return nil, fmt.Errorf("%w (%s; --max-size or a larger disk keeps blobs stored)", ErrSpillMemory, clitext.Bytes(r.f.opts.SpillMemory))
	}
	p := &Fill{key: f.key, desc: f.desc, remote: r, repo: f.repo, via: f.via, peer: f.peer, private: true, hash: h,
		size: size, written: at, spillFrom: at, winStart: at, win: make([]byte, n),
		progress: make(chan struct{}), done: make(chan struct{})}
	p.spilling.Store(true)
	pctx, cancel := context.WithTimeout(p.context(r.f.fillCtx), r.f.opts.FillTimeout)
	stop := context.AfterFunc(ctx, cancel)
	p.cancel = cancel
	r.f.fills.wg.Add(1)
	go func() {
		defer r.f.fills.wg.Done()
		defer close(p.done)
		defer stop()
		defer cancel()
		start := time.Now()
		err := p.download(pctx)
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("the client went away: %w", err) // not the upstream's failure
		} else {
			r.f.metrics.observe(r.Name, p.tierOr(), KindBlob, start, err)
			if r.f.fillCtx.Err() == nil {
				r.f.health.record(r.Name, p.tierOr(), err)
			}
		}
		if err != nil && ctx.Err() == nil {
			r.f.log.WithLevel(fillErrorLevel(err)).Err(err).Str("upstream", r.Name).Str("repository", f.repo).
				Str("digest", f.desc.Digest.String()).Msg("disk full: a client's own stream of a blob that cannot be stored failed")
		}
		p.finish(err)
		p.over()
	}()
	return p, nil
}
