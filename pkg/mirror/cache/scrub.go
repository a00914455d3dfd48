package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/time/rate"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Scrubbing (Options.ScrubInterval, Options.ScrubRate).
const (
	// DefaultScrubInterval is how often the scrubber re-hashes each stored blob (issue 23: once
	// a week).
	DefaultScrubInterval = 7 * 24 * time.Hour
	// DefaultScrubRate bounds the bytes a scrub or verify pass reads a second (50 MiB/s): the
	// rate is the bound; I/O priority would only be a hint some schedulers ignore.
	DefaultScrubRate = 50 << 20
	// scrubChunk is the most read at once by a scrub (bytes), and so the limiter's burst.
	scrubChunk = 1 << 20
	// scrubRetry is how long the scrubber leaves a blob whose data could not be read (an I/O
	// error, not a mismatch) before it tries again.
	scrubRetry = time.Hour
	// scrubMaxWait bounds the scrubber's sleep between looks at what is due.
	scrubMaxWait = time.Hour
)

// Where damaged data was found, the values of nodecache_cache_corrupt_total's found_by label
// (Options.Corrupt).
const (
	FoundByServe  = "serve"  // a serve: the data file's size is not the verified size, or a first serve's hash
	FoundByScrub  = "scrub"  // the background scrubber
	FoundByVerify = "verify" // a verify pass (POST mirrorapi.CacheVerifyPath, nodecache cache verify)
)

// ErrNotReady is StartVerify's error before Run has loaded the index and started the scrub
// loop (or after it stopped).
var ErrNotReady = errors.New("the cache index is being loaded or rebuilt from storage (or serve is stopping)")

// scrubState is the scrub loop's shared state: whether it runs, and the verify passes asked of it.
type scrubState struct {
	mu      sync.Mutex
	running bool
	latest  *mirrorapi.VerifyPass // the latest verify pass (running or over); nil: none yet
	pending bool                  // latest is asked for and not started yet
	rate    int64                 // latest's bound (bytes a second)
	wake    chan struct{}         // buffer 1: a pass was asked for
}

// EvictCorrupt removes blob d, whose data does not hash to d or does not have its verified
// size: its data and every repository's link to it, at once (whether or not a manifest
// references it or a request serves it: what it would serve is wrong), under the lock fills
// commit under; then it drops d from the index and counts it (Options.Corrupt, with foundBy).
// Manifests that reference d keep their entries: the next request for it is a miss that fetches
// it again, verifies it and stores it. It reports whether the data was deleted (a failed
// deletion is logged; the blob is dropped from the index anyway, so it is hashed again on its
// next serve).
//
// A pinned blob (pins.go) is evicted the same way for now, and fetched again on its next pull
// while the upstream still has it: moving it to a quarantine path instead and reporting it
// unrepairable (mirrorapi.VerifyPass.Unrepairable) is not done, so every damaged blob is
// evicted.
func (s *Store) EvictCorrupt(ctx context.Context, d digest.Digest, foundBy string) bool {
	repos, deleted, repaired := s.removeDamaged(ctx, d)
	if repaired {
		s.log.Info().Str("digest", d.String()).Str("found_by", foundBy).
			Msg("stored blob found damaged was stored again, whole, before its eviction: kept")
		return false
	}
	if s.opts.Corrupt != nil {
		s.opts.Corrupt(foundBy)
	}
	s.log.Warn().Str("digest", d.String()).Str("found_by", foundBy).Strs("repositories", repos).Bool("deleted", deleted).
		Msg("stored blob does not match its digest or verified size: evicted; the next request fetches it again")
	return deleted
}

// Damaged reports whether blob d's stored data does not hash to d: it is longer than maxBytes
// (a manifest, which is never longer), or its first maxBytes do not match. Data that cannot be
// read (gone, an I/O error) is not reported damaged: that is for its reader to answer.
func (s *Store) Damaged(ctx context.Context, d digest.Digest, maxBytes int64) bool {
	if !d.Algorithm().Available() {
		return false
	}
	rc, err := s.driver.Reader(ctx, BlobDataPath(d), 0)
	if err != nil {
		return false
	}
	defer rc.Close()
	h := d.Algorithm().Hash()
	n, err := io.Copy(h, io.LimitReader(rc, maxBytes+1))
	if err != nil {
		return false
	}
	return n > maxBytes || digest.NewDigest(d.Algorithm(), h) != d
}

// removeDamaged deletes blob d's links (the repositories the index knows) and data under the
// store lock and drops it from the index; it returns the repositories that linked it and
// whether the data is gone. When the data was stored again, whole, between the read that found
// it damaged and this lock (storedWhole), it leaves everything and reports repaired.
func (s *Store) removeDamaged(ctx context.Context, d digest.Digest) (repos []string, deleted, repaired bool) {
	s.storeMu.Lock()
	defer s.storeMu.Unlock()
	if s.storedWhole(ctx, d) {
		return nil, false, true
	}
	repos = s.idx.LinksOf(d)
	for _, repo := range repos {
		if err := s.driver.Delete(ctx, LayerLinkPath(repo, d)); err != nil && !isPathNotFound(err) {
			s.log.Error().Err(err).Str("digest", d.String()).Str("repository", repo).Msg("remove the link of a damaged blob")
		}
	}
	deleted = true
	if err := s.driver.Delete(ctx, BlobDirPath(d)); err != nil && !isPathNotFound(err) {
		s.log.Error().Err(err).Str("digest", d.String()).Msg("remove the data of a damaged blob")
		deleted = false
	}
	if n := s.idx.DropBlob(d); deleted && s.opts.Freed != nil {
		s.opts.Freed(n)
	}
	return repos, deleted, false
}

// repairCheckBytes bounds the data storedWhole hashes under the store lock: manifests (4 MiB at
// most) and small blobs. Larger data found damaged is evicted without a second look.
const repairCheckBytes = 4 << 20

// storedWhole reports whether blob d's data, at most repairCheckBytes, is there and hashes to d
// (and has the verified size the index records, if any): the case of a manifest or blob that a
// request, the scrubber or a verify pass read damaged while another request fetched it again
// and stored it (fills and manifests commit under the store lock, which the caller holds).
// Evicting it then would delete good data that the index and the clients count as cached.
func (s *Store) storedWhole(ctx context.Context, d digest.Digest) bool {
	if !d.Algorithm().Available() {
		return false
	}
	fi, err := s.driver.Stat(ctx, BlobDataPath(d))
	if err != nil || fi.Size() > repairCheckBytes {
		return false
	}
	if c := s.idx.Check(d); c.Size >= 0 && c.Size != fi.Size() {
		return false
	}
	b, err := s.driver.GetContent(ctx, BlobDataPath(d))
	return err == nil && int64(len(b)) == fi.Size() && d.Algorithm().FromBytes(b) == d
}

// StartVerify asks for a verify pass: every blob the index holds now is read whole and hashed at
// most rate bytes a second (0: Options.ScrubRate), and each that does not match is evicted
// (EvictCorrupt). A pass already running is returned as it is (rate then does not change it).
// The pass runs in Run's scrub loop, before the background scrubber's next blob.
//
// Errors: ErrNotReady before Run has loaded the index and started the scrub loop.
func (s *Store) StartVerify(rateBytes int64) (mirrorapi.VerifyPass, error) {
	st := &s.scrub
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.running {
		return mirrorapi.VerifyPass{}, ErrNotReady
	}
	if st.latest != nil && st.latest.State == mirrorapi.VerifyRunning {
		return *st.latest, nil
	}
	if rateBytes <= 0 {
		rateBytes = s.opts.ScrubRate
	}
	id := int64(1)
	if st.latest != nil {
		id = st.latest.ID + 1
	}
	st.latest = &mirrorapi.VerifyPass{ID: id, State: mirrorapi.VerifyRunning, Started: s.opts.Clock().UTC(), RateBytes: rateBytes}
	st.pending, st.rate = true, rateBytes
	select {
	case st.wake <- struct{}{}:
	default:
	}
	return *st.latest, nil
}

// VerifyStatus returns the latest verify pass (running or over); ok is false when none was
// asked for since the process started.
func (s *Store) VerifyStatus() (p mirrorapi.VerifyPass, ok bool) {
	s.scrub.mu.Lock()
	defer s.scrub.mu.Unlock()
	if s.scrub.latest == nil {
		return mirrorapi.VerifyPass{}, false
	}
	p = *s.scrub.latest
	p.CorruptBlobs = slices.Clone(p.CorruptBlobs)
	return p, true
}

// updatePass changes the latest pass under the lock.
func (s *Store) updatePass(f func(p *mirrorapi.VerifyPass)) {
	s.scrub.mu.Lock()
	defer s.scrub.mu.Unlock()
	f(s.scrub.latest)
}

// takePending returns the bound of the verify pass asked for and not started yet; ok false when
// there is none.
func (s *Store) takePending() (rateBytes int64, ok bool) {
	s.scrub.mu.Lock()
	defer s.scrub.mu.Unlock()
	if !s.scrub.pending {
		return 0, false
	}
	s.scrub.pending = false
	return s.scrub.rate, true
}

func (s *Store) hasPending() bool {
	s.scrub.mu.Lock()
	defer s.scrub.mu.Unlock()
	return s.scrub.pending
}

// setScrubRunning records whether the scrub loop runs; a pass asked for and not over when it
// stops is marked stopped.
func (s *Store) setScrubRunning(running bool) {
	s.scrub.mu.Lock()
	defer s.scrub.mu.Unlock()
	s.scrub.running = running
	if p := s.scrub.latest; !running && p != nil && p.State == mirrorapi.VerifyRunning {
		p.State, p.Finished = mirrorapi.VerifyStopped, s.opts.Clock().UTC()
		s.scrub.pending = false
	}
}

// scrubLoop runs verify passes when they are asked for and, with Options.ScrubInterval, the
// background scrubber, until ctx ends: each blob whose data was last hashed (BlobEntry.Scrubbed)
// an interval ago or more, oldest first, read at most Options.ScrubRate bytes a second. An entry
// never hashed (one an index rebuild found: after an unclean shutdown, or a missing index file)
// is due at once, so a rebuild is followed by a whole pass.
func (s *Store) scrubLoop(ctx context.Context) {
	s.setScrubRunning(true)
	defer s.setScrubRunning(false)
	lim := newByteLimiter(s.opts.ScrubRate)
	retry := map[digest.Digest]time.Time{} // blobs that could not be read, and when to try again
	for ctx.Err() == nil {
		if r, ok := s.takePending(); ok {
			s.verifyPass(ctx, r)
			continue
		}
		wait := scrubMaxWait
		if interval := s.opts.ScrubInterval; interval > 0 {
			now := s.opts.Clock()
			due := s.idx.dueForScrub(now.Add(-interval), func(d digest.Digest) bool { return now.Before(retry[d]) })
			if len(due) > 0 {
				for _, d := range due {
					if ctx.Err() != nil || s.hasPending() {
						break
					}
					if res, _ := s.scrubBlob(ctx, d, lim, FoundByScrub); res == scrubFailed {
						retry[d] = s.opts.Clock().Add(scrubRetry)
					}
				}
				continue
			}
			// Until the least recently hashed blob is due; a blob stored meanwhile is due later.
			wait = min(interval, scrubMaxWait)
			if next, ok := s.idx.oldestScrub(); ok {
				wait = min(max(next.Add(interval).Sub(now), 10*time.Millisecond), scrubMaxWait)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-s.scrub.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// verifyPass runs the verify pass asked for: every blob the index holds now, at most rateBytes
// bytes a second, progress recorded in the latest pass.
func (s *Store) verifyPass(ctx context.Context, rateBytes int64) {
	blobs := s.idx.scrubList()
	var total int64
	for _, b := range blobs {
		total += b.size
	}
	s.updatePass(func(p *mirrorapi.VerifyPass) { p.Blobs, p.SizeBytes = len(blobs), total })
	s.log.Info().Int("blobs", len(blobs)).Int64("size_bytes", total).Int64("rate_bytes_per_second", rateBytes).Msg("verify pass started")
	lim := newByteLimiter(rateBytes)
	for _, b := range blobs {
		if ctx.Err() != nil {
			return // setScrubRunning(false) marks it stopped
		}
		res, n := s.scrubBlob(ctx, b.d, lim, FoundByVerify)
		if ctx.Err() != nil {
			return
		}
		s.updatePass(func(p *mirrorapi.VerifyPass) {
			p.Checked++
			p.CheckedBytes += n
			switch res {
			case scrubCorrupt, scrubCorruptKept:
				p.Corrupt++
				p.CorruptBlobs = append(p.CorruptBlobs, b.d.String())
				if res == scrubCorrupt {
					p.Evicted++
				}
			case scrubMissing:
				p.Missing++
			case scrubFailed:
				p.Unreadable++
			}
		})
	}
	var done mirrorapi.VerifyPass
	s.updatePass(func(p *mirrorapi.VerifyPass) {
		p.State, p.Finished = mirrorapi.VerifyDone, s.opts.Clock().UTC()
		done = *p
	})
	s.log.Info().Int("checked", done.Checked).Int64("checked_bytes", done.CheckedBytes).Int("corrupt", done.Corrupt).
		Int("evicted", done.Evicted).Int("missing", done.Missing).Int("unreadable", done.Unreadable).Msg("verify pass done")
}

// scrubResult is what one blob's scrub found.
type scrubResult int

const (
	scrubOK          scrubResult = iota
	scrubCorrupt                 // did not match: evicted
	scrubCorruptKept             // did not match; its data could not be deleted
	scrubMissing                 // no data (evicted meanwhile, or deleted behind nodecache's back): dropped from the index
	scrubFailed                  // could not be read (an I/O error), or its digest cannot be computed here
)

// scrubBlob reads blob d's data whole through the driver, at most lim's rate, and checks it
// against its digest and verified size: a match is recorded (Index.Rehashed), a mismatch evicted
// (EvictCorrupt, counted with foundBy), missing data dropped from the index. Eviction leaves the
// blob alone meanwhile (Acquire). It returns what it found and the bytes it read.
func (s *Store) scrubBlob(ctx context.Context, d digest.Digest, lim *rate.Limiter, foundBy string) (scrubResult, int64) {
	release := s.Acquire(d)
	defer release()
	log := s.log.With().Str("digest", d.String()).Str("found_by", foundBy).Logger()
	if !d.Algorithm().Available() {
		log.Warn().Msg("scrub: the digest's algorithm is not available; blob left unchecked")
		return scrubFailed, 0
	}
	want := s.idx.Check(d)
	stamp := s.stampOf(d) // before the read: a write during it changes the file's stamp
	rc, err := s.driver.Reader(ctx, BlobDataPath(d), 0)
	if isPathNotFound(err) {
		s.removeDamaged(ctx, d)
		log.Warn().Msg("scrub: the index holds a blob whose data is gone; dropped (the next request fetches it again)")
		return scrubMissing, 0
	}
	if err != nil {
		log.Error().Err(err).Msg("scrub: open blob data")
		return scrubFailed, 0
	}
	defer rc.Close()
	h := d.Algorithm().Hash()
	n, err := copyAtRate(ctx, h, rc, lim)
	if err != nil {
		if ctx.Err() == nil {
			log.Error().Err(err).Int64("bytes", n).Msg("scrub: read blob data")
		}
		return scrubFailed, n
	}
	if (want.Size >= 0 && n != want.Size) || digest.NewDigest(d.Algorithm(), h) != d {
		log.Warn().Int64("bytes", n).Int64("verified_size", want.Size).Msg("scrub: mismatch")
		if s.EvictCorrupt(ctx, d, foundBy) {
			return scrubCorrupt, n
		}
		return scrubCorruptKept, n
	}
	s.idx.Rehashed(d, n, s.opts.Clock(), stamp)
	return scrubOK, n
}

// newByteLimiter is a token bucket of bytesPerSecond (at least 1) with a burst of one read.
func newByteLimiter(bytesPerSecond int64) *rate.Limiter {
	bytesPerSecond = max(bytesPerSecond, 1)
	return rate.NewLimiter(rate.Limit(bytesPerSecond), int(min(bytesPerSecond, scrubChunk)))
}

// copyAtRate copies src to dst in reads of at most the limiter's burst, each followed by a wait
// for the tokens of the bytes it read (so the next read starts within the rate); it returns the
// bytes copied.
func copyAtRate(ctx context.Context, dst io.Writer, src io.Reader, lim *rate.Limiter) (int64, error) {
	buf := make([]byte, lim.Burst())
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			_, _ = dst.Write(buf[:k]) // a hash never fails
			n += int64(k)
			if werr := lim.WaitN(ctx, k); werr != nil {
				return n, fmt.Errorf("wait for the scrub rate: %w", werr)
			}
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
