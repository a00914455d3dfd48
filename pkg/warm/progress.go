package warm

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodecache/nodecache/internal/clitext"
)

// progress receives transfer events. Implementations are safe for concurrent use.
type progress interface {
	// planned adds n bytes to the amount expected.
	planned(n int64)
	// transferred adds n received bytes (negative when a restarted blob discards what it had).
	transferred(n int64)
	// blob reports one finished blob: fetched, failed (err != nil) or external.
	blob(ev blobEvent)
}

// blobEvent describes one finished blob.
type blobEvent struct {
	Image    string
	Digest   string
	Size     int64
	Took     time.Duration
	Cache    string
	Attempts int
	External []string // urls of a foreign layer, which is not fetched
	Present  bool     // warm --to: in the bundle already (verified), not fetched
	Err      error
}

// noProgress discards events.
type noProgress struct{}

func (noProgress) planned(int64)     {}
func (noProgress) transferred(int64) {}
func (noProgress) blob(blobEvent)    {}

// lineProgress writes one line per finished blob: for logs and pipes.
type lineProgress struct {
	mu sync.Mutex
	w  io.Writer
}

func (*lineProgress) planned(int64)     {}
func (*lineProgress) transferred(int64) {}
func (p *lineProgress) blob(ev blobEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, blobLine(ev))
}

func blobLine(ev blobEvent) string {
	switch {
	case ev.External != nil:
		return fmt.Sprintf("external %s %s %s (foreign layer, not fetched: %s)", ev.Image, shortDigest(ev.Digest), clitext.Bytes(ev.Size), strings.Join(ev.External, " "))
	case ev.Present:
		return fmt.Sprintf("present  %s %s %s (in the bundle already, verified)", ev.Image, shortDigest(ev.Digest), clitext.Bytes(ev.Size))
	case ev.Err != nil:
		return fmt.Sprintf("FAILED   %s %s %s after %s in %s: %v", ev.Image, shortDigest(ev.Digest), clitext.Bytes(ev.Size), clitext.Count(ev.Attempts, "attempt"), clitext.Span(ev.Took), ev.Err)
	}
	s := fmt.Sprintf("fetched  %s %s %s in %s", ev.Image, shortDigest(ev.Digest), clitext.Bytes(ev.Size), clitext.Span(ev.Took))
	if ev.Attempts > 1 {
		s += fmt.Sprintf(" (%d attempts)", ev.Attempts)
	}
	if ev.Cache != "" {
		s += " cache=" + ev.Cache
	}
	return s
}

// barProgress draws one status line (bytes, rate, ETA, blobs) on a terminal, redrawn by run;
// failures and external layers are printed above it.
type barProgress struct {
	w        io.Writer
	start    time.Time
	total    atomic.Int64
	done     atomic.Int64
	blobs    atomic.Int64
	failed   atomic.Int64
	mu       sync.Mutex // serialises writes
	lastDraw string
}

func newBarProgress(w io.Writer) *barProgress { return &barProgress{w: w, start: time.Now()} }

func (p *barProgress) planned(n int64)     { p.total.Add(n) }
func (p *barProgress) transferred(n int64) { p.done.Add(n) }
func (p *barProgress) blob(ev blobEvent) {
	p.blobs.Add(1)
	if ev.Err == nil && ev.External == nil {
		return
	}
	if ev.Err != nil {
		p.failed.Add(1)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[K%s\n%s", blobLine(ev), p.lastDraw)
}

// run redraws the bar every interval until ctx ends, then draws it once more and ends the line.
func (p *barProgress) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.draw()
			p.mu.Lock()
			fmt.Fprintln(p.w)
			p.mu.Unlock()
			return
		case <-t.C:
			p.draw()
		}
	}
}

func (p *barProgress) draw() {
	const width = 30
	total, done := p.total.Load(), max(p.done.Load(), 0)
	elapsed := time.Since(p.start).Seconds()
	frac := 0.0
	if total > 0 {
		frac = min(float64(done)/float64(total), 1)
	}
	filled := int(frac * width)
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed
	}
	eta := "--"
	if rate > 0 && total > done {
		eta = clitext.Span(time.Duration(float64(total-done) / rate * float64(time.Second)).Round(time.Second))
	} else if total > 0 && done >= total {
		eta = "0s"
	}
	line := fmt.Sprintf("[%s%s] %s / %s  %s/s  ETA %s  blobs %d",
		strings.Repeat("#", filled), strings.Repeat("-", width-filled),
		clitext.Bytes(done), clitext.Bytes(total), clitext.Bytes(int64(rate)), eta, p.blobs.Load())
	if f := p.failed.Load(); f > 0 {
		line += fmt.Sprintf(" (%d failed)", f)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastDraw = line
	fmt.Fprint(p.w, "\r\033[K"+line)
}

// shortDigest returns "sha256:" and the first 12 hex digits.
func shortDigest(d string) string {
	if algo, hex, ok := strings.Cut(d, ":"); ok && len(hex) > 12 {
		return algo + ":" + hex[:12]
	}
	return d
}
