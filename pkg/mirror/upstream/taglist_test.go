package upstream

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTagListCacheBounds: the kept listings stay within their entry and byte bounds (the
// oldest go first), expire against the clock when asked for or when another is kept, and
// nothing is kept without a TTL, past the TTL already, or larger than the byte bound.
func TestTagListCacheBounds(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	const ttl = time.Minute
	list := func(n int) []string {
		tags := make([]string, n)
		for i := range tags {
			tags[i] = fmt.Sprintf("v%04d", i)
		}
		return tags
	}
	has := func(c *tagListCache, now time.Time, keys ...string) []string {
		var got []string
		for _, k := range keys {
			if _, ok := c.get(k, now, ttl); ok {
				got = append(got, k)
			}
		}
		return got
	}

	t.Run("entries", func(t *testing.T) {
		t.Parallel()
		c := &tagListCache{maxEntries: 3}
		for i, k := range []string{"a", "b", "c", "d"} {
			c.put(k, list(2), sec(i), sec(i), ttl)
		}
		if got := has(c, sec(4), "a", "b", "c", "d"); !slices.Equal(got, []string{"b", "c", "d"}) {
			t.Errorf("kept %v, want the newest three [b c d]", got)
		}
		if n, size := c.stats(); n != 3 || size != 3*tagListSize("b", list(2)) {
			t.Errorf("stats %d, %d bytes; want 3, %d", n, size, 3*tagListSize("b", list(2)))
		}
	})
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		one := tagListSize("a", list(100))
		c := &tagListCache{maxBytes: 2*one + one/2}
		for i, k := range []string{"a", "b", "c"} {
			c.put(k, list(100), sec(i), sec(i), ttl)
		}
		if got := has(c, sec(3), "a", "b", "c"); !slices.Equal(got, []string{"b", "c"}) {
			t.Errorf("kept %v, want [b c]", got)
		}
		if _, size := c.stats(); size > c.maxBytes {
			t.Errorf("%d bytes kept, bound %d", size, c.maxBytes)
		}
		c.put("huge", list(1000), sec(3), sec(3), ttl)
		if got := has(c, sec(3), "huge", "b", "c"); !slices.Equal(got, []string{"b", "c"}) {
			t.Errorf("a listing larger than the bound: kept %v, want [b c] untouched", got)
		}
	})
	t.Run("expiry", func(t *testing.T) {
		t.Parallel()
		var c tagListCache // the zero value, with the default bounds
		c.put("a", list(3), sec(0), sec(0), ttl)
		c.put("b", list(3), sec(30), sec(30), ttl)
		if tags, ok := c.get("a", sec(59), ttl); !ok || !slices.Equal(tags, list(3)) {
			t.Errorf("within the TTL: %v %v, want the listing", tags, ok)
		}
		if _, ok := c.get("a", sec(60), ttl); ok {
			t.Error("a listing TTL old is still fresh")
		}
		if n, _ := c.stats(); n != 1 {
			t.Errorf("%d kept after an expired get, want 1 (dropped)", n)
		}
		c.put("c", list(3), sec(91), sec(91), ttl) // b expired at 90: swept
		if n, _ := c.stats(); n != 1 {
			t.Errorf("%d kept after a put past b's TTL, want 1", n)
		}
		if _, ok := c.get("c", sec(90), ttl); ok {
			t.Error("a listing from the future (the clock went back) counts as fresh")
		}
		c.put("late", list(3), sec(100), sec(100).Add(ttl), ttl)
		c.put("none", list(3), sec(100), sec(100), 0)
		if got := has(&c, sec(100).Add(ttl), "late", "none"); len(got) != 0 {
			t.Errorf("kept %v; a fetch longer than the TTL and a TTL of 0 keep nothing", got)
		}
	})
}

// TestTagsStopsOnClose: a listing does not end with the request that started it, but it does
// when the Fetcher is closed.
func TestTagsStopsOnClose(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/tags/list") {
			return
		}
		arrived <- struct{}{}
		<-r.Context().Done() // never answers
	}))
	t.Cleanup(srv.Close)
	f := testFetcher(t, srv, Options{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := f.Remote("upstream.test").Tags(ctx, "team/app")
		done <- err
	}()
	<-arrived
	cancel()
	select {
	case err := <-done:
		t.Fatalf("the listing ended with its request: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	start := time.Now()
	_ = f.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a listing cut by Close succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the listing went on after Close")
	}
	t.Logf("ended %s after Close", time.Since(start).Round(time.Millisecond))
}
