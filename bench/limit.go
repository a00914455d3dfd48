package main

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// bucket is one token bucket shared by every connection that writes through it: together they
// send at most rate bytes a second (plus a burst of 64 KiB after an idle spell). Each write
// reserves the next free slot of the shared timeline and waits for its end, so writers are served
// in the order they asked and a connection cannot take more than its turn.
type bucket struct {
	rate float64 // bytes per second
	mu   sync.Mutex
	next time.Time // the end of the last slot reserved
}

const (
	bucketBurst = 64 << 10
	bucketChunk = 32 << 10 // largest single reservation
)

func newBucket(bytesPerSecond int64) *bucket { return &bucket{rate: float64(bytesPerSecond)} }

// wait blocks until n more bytes fit within the shared rate.
func (b *bucket) wait(ctx context.Context, n int) error {
	b.mu.Lock()
	now := time.Now()
	// An idle bucket holds at most bucketBurst bytes of credit.
	if floor := now.Add(-b.span(bucketBurst)); b.next.Before(floor) {
		b.next = floor
	}
	b.next = b.next.Add(b.span(n))
	until := b.next
	b.mu.Unlock()
	d := time.Until(until)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *bucket) span(n int) time.Duration {
	return time.Duration(float64(n) / b.rate * float64(time.Second))
}

// limitedWriter writes a response body through a shared bucket, bucketChunk bytes at a time.
type limitedWriter struct {
	http.ResponseWriter
	limit *bucket
	ctx   context.Context
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		k := min(len(p), bucketChunk)
		if err := l.limit.wait(l.ctx, k); err != nil {
			return written, err
		}
		n, err := l.ResponseWriter.Write(p[:k])
		written += n
		if err != nil {
			return written, err
		}
		p = p[k:]
	}
	return written, nil
}

func (l *limitedWriter) Flush() {
	if f, ok := l.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
