package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/inputfile"
)

// pinsVersion is the format of the pins file; a file of another version is not used (it is moved
// aside, see loadPins).
const pinsVersion = 1

// PinsFile is the pins file (JSON), at PinsPath of the storage root: the pins, kept apart from the
// index file so that an index rebuilt from storage (a lost, corrupt or unclean index file) keeps
// them. It is written whole at every change: a temporary file fsynced, renamed over it, and the
// directory fsynced.
type PinsFile struct {
	// Version is pinsVersion.
	Version int `json:"version"`
	// Pins are the pins, by repository, then tag, then digest.
	Pins []Pin `json:"pins"`
}

// PinsPath is the pins file of storage root: <root>/nodecache/pins.json; "" (no file) for
// in-memory storage (root "").
func PinsPath(root string) string {
	if root == "" {
		return ""
	}
	return filepath.Join(root, "nodecache", "pins.json")
}

// ReadPinsFile reads the pins file at p (through inputfile's size bound) and checks it. Errors:
// missing (wraps os.ErrNotExist), too large, not JSON, of another version, or a pin that is not
// one (a repository, tag or digest outside distribution's grammar, a pin by tag without its
// digest).
func ReadPinsFile(p string) (*PinsFile, error) {
	b, err := inputfile.Read(p, inputfile.Pins)
	if err != nil {
		return nil, err
	}
	var f PinsFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("corrupt: %w", err)
	}
	if f.Version != pinsVersion {
		return nil, fmt.Errorf("version %d, want %d", f.Version, pinsVersion)
	}
	for i, pin := range f.Pins {
		if err := checkPin(pin); err != nil {
			return nil, fmt.Errorf("corrupt: pin %d: %w", i+1, err)
		}
	}
	return &f, nil
}

// checkPin reports what makes p unusable: eviction and the API derive storage paths and
// references from its repository, tag and digests.
func checkPin(p Pin) error {
	named, err := reference.WithName(p.Repo)
	if err != nil {
		return fmt.Errorf("repository %q: %w", p.Repo, err)
	}
	if p.Tag != "" {
		if _, err := reference.WithTag(named, p.Tag); err != nil {
			return fmt.Errorf("tag %q: %w", p.Tag, err)
		}
	} else if p.Next != "" {
		return fmt.Errorf("a pin by digest (%s) with a next digest", p.Digest)
	}
	if err := p.Digest.Validate(); err != nil {
		return fmt.Errorf("digest %q: %w", p.Digest, err)
	}
	if p.Next != "" {
		if err := p.Next.Validate(); err != nil {
			return fmt.Errorf("next digest %q: %w", p.Next, err)
		}
	}
	return nil
}

// loadPins reads the pins file into the index (LoadIndex, before the index itself: the pins
// then follow the tags the index file or the rebuild records). A file that cannot be used is
// logged and moved aside to <file>.unusable, for a person to look at, and serving goes on with
// no pins: it is never overwritten.
func (s *Store) loadPins() {
	defer s.pinsLoaded.Store(true)
	p := PinsPath(s.opts.Root)
	if p == "" {
		return
	}
	f, err := ReadPinsFile(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return
	case err != nil:
		aside := p + ".unusable"
		if rerr := os.Rename(p, aside); rerr != nil {
			s.log.Error().Err(err).Str("file", p).AnErr("move_aside", rerr).
				Msg("pins file unusable, and it could not be moved aside: serving with no pins; the next pin overwrites it")
			return
		}
		s.log.Error().Err(err).Str("file", p).Str("moved_to", aside).
			Msg("pins file unusable: moved aside; serving with no pins until images are pinned again (nodecache cache pin, warm --pin)")
		return
	}
	s.idx.setPins(f.Pins)
	s.log.Info().Str("file", p).Int("pins", len(f.Pins)).Msg("pins loaded")
}

// savePins writes the pins file when the pins changed since the last write (always with
// force), once they were loaded (loadPins: an unread file is never overwritten). Errors: writing
// the file; the pins then stay changed, so the next call tries again.
func (s *Store) savePins(force bool) error {
	if !s.pinsLoaded.Load() {
		return nil
	}
	s.pinsFileMu.Lock()
	defer s.pinsFileMu.Unlock()
	pins, dirty := s.idx.pinsForSave()
	p := PinsPath(s.opts.Root)
	if p == "" || (!dirty && !force) {
		return nil
	}
	b, err := json.MarshalIndent(PinsFile{Version: pinsVersion, Pins: pins}, "", "  ")
	if err != nil {
		s.idx.markPinsDirty()
		return fmt.Errorf("encode pins: %w", err)
	}
	if err := writeFileSynced(p, append(b, '\n')); err != nil {
		s.idx.markPinsDirty()
		return err
	}
	return nil
}

// Pin pins tag (or, with tag "", digest d) of storage repository repo: what the cache holds of
// the image it names now, and, for a tag, the images the tag moves to (Pin.Next). With a cap
// (Options.MaxSize), a pin that would take the pinned bytes above MaxPinnedShare of it is
// refused; the pinned bytes are counted as the images will be once complete (heldBytes: the
// blobs their stored manifests list count at the sizes listed, stored or not, as a pull may be
// storing them still). The pins file is written before it returns; a pin that already exists is
// returned as it is. It returns the pin and the pinned bytes with it.
//
// Errors: ErrNotReady before the index is loaded; ErrNotCached when the repository holds no such
// tag or manifest; ErrPinLimit (wrapped, naming the cap and the bytes); writing the pins file
// (the pin is then not kept).
func (s *Store) Pin(ctx context.Context, repo, tag string, d digest.Digest) (Pin, int64, error) {
	if !s.idx.IsReady() || !s.pinsLoaded.Load() {
		return Pin{}, 0, ErrNotReady
	}
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	c, p, exists, err := s.idx.pinContent(Pin{Repo: repo, Tag: tag, Digest: d, Pinned: s.opts.Clock().UTC()})
	switch {
	case err != nil:
		return p, 0, err
	case exists:
		return p, s.idx.PinnedBytes(), nil
	}
	pinned := s.heldBytes(ctx, c)
	if limit := int64(float64(s.opts.MaxSize) * MaxPinnedShare); s.opts.MaxSize > 0 && pinned > limit {
		return p, pinned, fmt.Errorf("%w: pinning it would take the pinned bytes to %s (%d bytes), above %.0f%% of the cap --max-size %s (%d bytes): unpin other images first (nodecache cache unpin) or raise --max-size",
			ErrPinLimit, clitext.Bytes(pinned), pinned, MaxPinnedShare*100, clitext.Bytes(s.opts.MaxSize), s.opts.MaxSize)
	}
	if !s.idx.AddPin(p) {
		return p, pinned, nil
	}
	if err := s.savePins(true); err != nil {
		s.idx.RemovePin(p.Repo, p.Tag, p.Digest)
		return p, 0, fmt.Errorf("pin not kept: %w", err)
	}
	s.log.Info().Str("repository", repo).Str("tag", tag).Str("digest", p.Digest.String()).Int64("pinned_bytes", pinned).Msg("pinned")
	return p, pinned, nil
}

// Unpin drops the pin of tag (or, with tag "", of digest d) of storage repository repo and
// writes the pins file; what it held is evicted again like anything else (least recently pulled
// first). It returns the pin dropped.
//
// Errors: ErrNotReady before the index is loaded; ErrNotPinned; writing the pins file (the pin
// then stays).
func (s *Store) Unpin(repo, tag string, d digest.Digest) (Pin, error) {
	if !s.idx.IsReady() || !s.pinsLoaded.Load() {
		return Pin{}, ErrNotReady
	}
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	p, ok := s.idx.RemovePin(repo, tag, d)
	if !ok {
		return Pin{}, ErrNotPinned
	}
	if err := s.savePins(true); err != nil {
		s.idx.restorePin(p)
		return p, fmt.Errorf("pin kept: %w", err)
	}
	s.log.Info().Str("repository", repo).Str("tag", tag).Str("digest", p.Digest.String()).Msg("unpinned")
	s.wake()
	return p, nil
}

// Pins returns the pins (Index.Pins).
func (s *Store) Pins() []Pin { return s.idx.Pins() }

// PinBytes returns the bytes of the images pin p holds (Index.PinBytes).
func (s *Store) PinBytes(p Pin) int64 { return s.idx.PinBytes(p) }

// PinsOf returns the pins that hold image m of storage repository repo (Index.PinsOf).
func (s *Store) PinsOf(repo string, m digest.Digest) []Pin { return s.idx.PinsOf(repo, m) }

// PinnedBytes returns the bytes the pins hold (Index.PinnedBytes): nodecache_cache_pinned_bytes.
func (s *Store) PinnedBytes() int64 { return s.idx.PinnedBytes() }

// pinProgress wakes the eviction loop, which settles the pins (settlePins), when a pin by tag
// waits for its new image: something was just stored.
func (s *Store) pinProgress() {
	if s.idx.hasMovingPins() {
		s.wake()
	}
}

// settlePins completes the moves of pins by tag whose new image is complete (imageComplete):
// the new image becomes the pin's, the old one is released. Then it writes the pins file when
// they changed (a tag followed, a move completed). Run calls it at every turn of its loop.
func (s *Store) settlePins(ctx context.Context) {
	for _, p := range s.idx.movingPins() {
		if !s.imageComplete(ctx, p.Repo, p.Next, max(1, s.idx.storedImages(p.Repo, p.Digest))) {
			continue
		}
		if s.idx.completeMove(p) {
			s.log.Info().Str("repository", p.Repo).Str("tag", p.Tag).Str("digest", p.Next.String()).Str("released", p.Digest.String()).
				Msg("pinned tag moved: its new image is complete and pinned, the old one released")
		}
	}
	if err := s.savePins(false); err != nil {
		s.log.Warn().Err(err).Msg("write pins file")
	}
}

// maxPinDepth bounds the nesting of indexes imageComplete follows.
const maxPinDepth = 4

// imageComplete reports whether the image of manifest d of storage repository repo is complete
// enough for a pin by tag to move to it: d is stored, every manifest of it that is stored has
// every blob it references stored, and it holds at least one platform image — at least need of
// them (the number the pin's old image held) unless its index lists fewer.
func (s *Store) imageComplete(ctx context.Context, repo string, d digest.Digest, need int) bool {
	images, listed, ok := s.completeImages(ctx, repo, d, 0)
	return ok && images >= 1 && images >= min(need, listed)
}

// completeImages walks manifest d of repo as storage holds it: images counts its platform images
// stored whole, listed the manifests an index lists (1 for an image manifest), ok is false when
// d is not stored or a stored manifest under it lacks a blob.
func (s *Store) completeImages(ctx context.Context, repo string, d digest.Digest, depth int) (images, listed int, ok bool) {
	if depth > maxPinDepth || !s.idx.HasManifest(repo, d) {
		return 0, 0, false
	}
	raw, err := s.driver.GetContent(ctx, BlobDataPath(d))
	if err != nil {
		return 0, 0, false
	}
	type descriptor struct {
		Digest digest.Digest `json:"digest"`
	}
	var m struct {
		Config    *descriptor  `json:"config"`
		Layers    []descriptor `json:"layers"`
		Manifests []descriptor `json:"manifests"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return 0, 0, false
	}
	if m.Manifests == nil {
		blobs := m.Layers
		if m.Config != nil {
			blobs = append(blobs, *m.Config)
		}
		for _, b := range blobs {
			if !s.idx.HasBlob(b.Digest) {
				return 0, 1, false
			}
		}
		return 1, 1, true
	}
	for _, c := range m.Manifests {
		if !s.idx.HasManifest(repo, c.Digest) {
			continue
		}
		n, _, cok := s.completeImages(ctx, repo, c.Digest, depth+1)
		if !cok {
			return 0, len(m.Manifests), false
		}
		images += n
	}
	return images, len(m.Manifests), true
}

// heldBytes is what content c comes to once its images are complete: the bytes of its blobs
// the index holds, plus, for each blob it lacks, the size a stored manifest of it lists for it
// (config and layers; a child manifest never pulled is not counted, nor its blobs).
func (s *Store) heldBytes(ctx context.Context, c content) int64 {
	n := c.stored
	if len(c.missing) == 0 {
		return n
	}
	for _, m := range c.manifests {
		for d, size := range s.listedBlobs(ctx, m) {
			if c.missing[d] {
				n += size
				delete(c.missing, d)
			}
		}
	}
	return n
}

// maxListedCache bounds the manifests listedBlobs remembers; past it, it starts over.
const maxListedCache = 100_000

// listedBlobs returns the sizes stored manifest m lists for its config and layers (an index lists
// none), read from storage once and remembered: a manifest's content is its digest's. Nil when
// it cannot be read or parsed.
func (s *Store) listedBlobs(ctx context.Context, m digest.Digest) map[digest.Digest]int64 {
	s.listedMu.Lock()
	sizes, ok := s.listed[m]
	s.listedMu.Unlock()
	if ok {
		return sizes
	}
	raw, err := s.driver.GetContent(ctx, BlobDataPath(m))
	if err != nil {
		return nil
	}
	type descriptor struct {
		Digest digest.Digest `json:"digest"`
		Size   int64         `json:"size"`
	}
	var doc struct {
		Config *descriptor  `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if json.Unmarshal(raw, &doc) != nil {
		return nil
	}
	sizes = map[digest.Digest]int64{}
	for _, l := range append(doc.Layers, func() []descriptor {
		if doc.Config != nil {
			return []descriptor{*doc.Config}
		}
		return nil
	}()...) {
		if l.Digest.Validate() == nil && l.Size >= 0 {
			sizes[l.Digest] = l.Size
		}
	}
	s.listedMu.Lock()
	if len(s.listed) >= maxListedCache {
		s.listed = map[digest.Digest]map[digest.Digest]int64{}
	}
	s.listed[m] = sizes
	s.listedMu.Unlock()
	return sizes
}

// evictionFloor returns the bytes the pins hold and those of the largest image no pin holds
// (its blobs the pins hold not counted), both as they will be once complete (heldBytes: an image
// whose pull is storing its layers counts them all). Eviction keeps room for both (issue 24), so
// a cap nearly full of pins does not evict an image right after it was pulled.
func (s *Store) evictionFloor(ctx context.Context) (pinned, largest int64) {
	p, images := s.idx.floorContent()
	pinned = s.heldBytes(ctx, p)
	for _, c := range images {
		largest = max(largest, s.heldBytes(ctx, c))
	}
	return pinned, largest
}
