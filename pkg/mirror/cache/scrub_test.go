package cache

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// writeData writes content as the data file of blob d under root (distribution's layout) and
// returns d.
func writeData(t *testing.T, root string, d digest.Digest, content []byte) digest.Digest {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(BlobDataPath(d)))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// scrubbed is a Store over a filesystem root running (Run) with the scrubber every interval
// (0: off), its clock stopped at now, counting what it finds corrupt.
type scrubbed struct {
	s       *Store
	mu      sync.Mutex
	corrupt map[string]int // by found_by
	stop    func()
}

func runScrubbed(t *testing.T, root string, now time.Time, interval time.Duration, rate int64) *scrubbed {
	t.Helper()
	sc := &scrubbed{corrupt: map[string]int{}}
	s, err := New(t.Context(), Options{
		Root: root, Kind: KindFilesystem,
		Config:        configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": root}},
		Clock:         func() time.Time { return now },
		ScrubInterval: interval,
		ScrubRate:     rate,
		Corrupt: func(foundBy string) {
			sc.mu.Lock()
			sc.corrupt[foundBy]++
			sc.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	sc.s = s
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	var once sync.Once
	sc.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(sc.stop)
	return sc
}

func (sc *scrubbed) corruptBy(foundBy string) int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.corrupt[foundBy]
}

// waitFor polls ok (10 s at most).
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (sc *scrubbed) entry(d digest.Digest) (BlobEntry, bool) {
	sc.s.idx.mu.Lock()
	defer sc.s.idx.mu.Unlock()
	b := sc.s.idx.blobs[d]
	if b == nil {
		return BlobEntry{}, false
	}
	return *b, true
}

// TestScrubber (issue 23, at rest): the background scrubber re-hashes each blob whose last hash
// is an interval old, evicts one that does not match (counted, found_by scrub) and leaves alone
// one hashed recently, even when it is damaged: the times are kept in the index file across a
// clean restart. After an unclean shutdown the rebuilt index has no times: every blob is
// re-hashed first, the recently hashed damaged one too.
func TestScrubber(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const week = 7 * 24 * time.Hour
	for _, clean := range []bool{true, false} {
		t.Run(map[bool]string{true: "clean shutdown", false: "unclean shutdown"}[clean], func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			goodBytes := randomBytes(t, 64<<10)
			good := writeData(t, root, digest.FromBytes(goodBytes), goodBytes)
			// Damaged: data that is not what its digest names (same size).
			due := writeData(t, root, digest.FromBytes(randomBytes(t, 8)), randomBytes(t, 32<<10))
			recent := writeData(t, root, digest.FromBytes(randomBytes(t, 8)), randomBytes(t, 32<<10))
			x := NewIndex()
			x.Verified("", good, 64<<10, now.Add(-8*24*time.Hour), filestamp.Stamp{})
			x.Verified("", due, 32<<10, now.Add(-8*24*time.Hour), filestamp.Stamp{})
			x.Verified("", recent, 32<<10, now.Add(-time.Hour), filestamp.Stamp{})
			x.MarkReady()
			if err := x.Save(FilePath(root), func() time.Time { return now }, clean); err != nil {
				t.Fatal(err)
			}

			sc := runScrubbed(t, root, now, week, 0)
			wantCorrupt := map[bool]int{true: 1, false: 2}[clean]
			waitFor(t, "the due blobs scrubbed", func() bool {
				e, ok := sc.entry(good)
				return ok && e.Scrubbed.Equal(now) && sc.corruptBy(FoundByScrub) == wantCorrupt
			})
			for _, d := range []digest.Digest{due, recent} {
				_, err := os.Stat(filepath.Join(root, filepath.FromSlash(BlobDataPath(d))))
				_, inIndex := sc.entry(d)
				wantGone := d == due || !clean
				if gone := os.IsNotExist(err); gone != wantGone || inIndex == gone {
					t.Errorf("damaged blob %s: data gone %v (stat: %v), in the index %v; want gone %v", d, gone, err, inIndex, wantGone)
				}
			}
			if e, _ := sc.entry(good); !e.verified || e.Size != 64<<10 || e.SizeUnverified {
				t.Errorf("intact blob after its scrub: %+v; want verified, its size verified", e)
			}
			sc.stop()
			f, err := ReadFile(FilePath(root))
			if err != nil {
				t.Fatal(err)
			}
			if b := f.Blobs[good]; b == nil || !b.Scrubbed.Equal(now) {
				t.Errorf("index file after the scrub: %+v; want the intact blob scrubbed at %s", b, now)
			}
		})
	}
}

// TestVerifyPass: a verify pass reads every blob at most at its rate (two 64 KiB blobs at
// 64 KiB/s take a second: the first is paid by the bucket's burst), reports its progress and
// evicts what does not match (found_by verify); one asked for while it runs is the same pass;
// asked for before Run, it is refused.
func TestVerifyPass(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	now := time.Now()
	a, b := randomBytes(t, 64<<10), randomBytes(t, 64<<10)
	da := writeData(t, root, digest.FromBytes(a), a)
	bad := writeData(t, root, digest.FromBytes(b), append(b[:len(b)-1:len(b)-1], b[len(b)-1]^1))
	s, err := New(t.Context(), Options{Root: root, Kind: KindFilesystem,
		Config: configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": root}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartVerify(0); err == nil {
		t.Error("StartVerify before Run: no error")
	}
	_ = s.Close()

	sc := runScrubbed(t, root, now, 0, 64<<10)
	waitFor(t, "the index rebuilt and the scrub loop running", func() bool {
		sc.s.scrub.mu.Lock()
		defer sc.s.scrub.mu.Unlock()
		return sc.s.scrub.running
	})
	start := time.Now()
	p, err := sc.s.StartVerify(0)
	if err != nil || p.ID != 1 || p.State != mirrorapi.VerifyRunning || p.RateBytes != 64<<10 {
		t.Fatalf("StartVerify = %+v, %v; want pass 1 running at 64 KiB/s", p, err)
	}
	if again, err := sc.s.StartVerify(1 << 30); err != nil || again.ID != 1 {
		t.Errorf("StartVerify while pass 1 runs = %+v, %v; want pass 1", again, err)
	}
	waitFor(t, "the pass done", func() bool {
		p, _ = sc.s.VerifyStatus()
		return p.State == mirrorapi.VerifyDone
	})
	took := time.Since(start)
	if p.Blobs != 2 || p.Checked != 2 || p.CheckedBytes != 128<<10 || p.Corrupt != 1 || p.Evicted != 1 ||
		len(p.CorruptBlobs) != 1 || p.CorruptBlobs[0] != bad.String() || p.Missing != 0 || p.Unreadable != 0 {
		t.Errorf("pass = %+v; want 2 blobs checked, %s corrupt and evicted", p, bad)
	}
	if took < 900*time.Millisecond {
		t.Errorf("128 KiB read in %s at 64 KiB/s; want about a second (the burst pays 64 KiB)", took)
	}
	if n := sc.corruptBy(FoundByVerify); n != 1 {
		t.Errorf("corrupt found_by verify: %d, want 1", n)
	}
	if _, ok := sc.entry(da); !ok {
		t.Error("the intact blob left the index")
	}
	if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(BlobDirPath(bad)))); !os.IsNotExist(err) {
		t.Errorf("the damaged blob's directory: %v; want it gone", err)
	}
}

// TestEvictCorruptKeepsWhatWasStoredAgain (make test-faults, kind atrest then 429, seed
// 17187426138061879698: a manifest checked as cached was gone a round later): a blob read damaged
// whose data was stored again, whole, before the eviction took the store lock (another request
// fetched it again) is kept; data still damaged when the lock is held is evicted as before.
func TestEvictCorruptKeepsWhatWasStoredAgain(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	good := randomBytes(t, 4096)
	d := writeData(t, root, digest.FromBytes(good), good)
	sc := runScrubbed(t, root, time.Now(), 0, 0)
	sc.s.idx.AddFound(d, int64(len(good)), time.Now())
	data := filepath.Join(root, filepath.FromSlash(BlobDataPath(d)))

	// Read damaged by one request; stored again by another before the eviction ran.
	if sc.s.EvictCorrupt(t.Context(), d, FoundByServe) {
		t.Fatal("EvictCorrupt deleted data that hashes to its digest")
	}
	if b, err := os.ReadFile(data); err != nil || string(b) != string(good) {
		t.Fatalf("the data stored again is gone or changed: %v", err)
	}
	if n := sc.corruptBy(FoundByServe); n != 0 {
		t.Errorf("counted %d corrupt for a blob stored again whole, want 0", n)
	}

	// Still damaged: evicted.
	if err := os.WriteFile(data, good[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	if !sc.s.EvictCorrupt(t.Context(), d, FoundByServe) {
		t.Fatal("EvictCorrupt kept data that is still damaged")
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Fatalf("damaged data still there: %v", err)
	}
	if n := sc.corruptBy(FoundByServe); n != 1 {
		t.Errorf("counted %d corrupt, want 1", n)
	}
}
