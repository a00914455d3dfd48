package cache

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/opencontainers/go-digest"
)

// Pins (issue 24). A pin names a tag or a digest of a storage repository; the images it holds
// are never removed by eviction (the cap nor a full disk) nor by an eviction on request. An image
// is what eviction removes: a top-level manifest of one repository with the child manifests and
// blobs it references as the cache holds them. A pin of a digest that is a child manifest (one
// platform of a cached index) holds the index it belongs to, as evicting the index is what would
// remove the child.
//
// A pin by tag follows the tag: when a revalidation stores the tag at another manifest (serve's
// own, or one that warm asked for), that manifest is pinned too (Pin.Next) and the image the pin
// held before is released once the new one is complete (Store.settlePins).

// Pin is one pin, as the pins file (PinsFile) records it.
type Pin struct {
	// Repo is the storage repository ("<upstream key>/<repository>").
	Repo string `json:"repo"`
	// Tag is the tag pinned; "" for a pin by digest.
	Tag string `json:"tag,omitempty"`
	// Digest is, for a pin by digest, the manifest pinned; for a pin by tag, the manifest the
	// tag named when it was pinned, or when its last move completed.
	Digest digest.Digest `json:"digest"`
	// Next is, for a pin by tag, the manifest the tag was moved to since: pinned as well until
	// its image is complete, when it becomes Digest and the image Digest named is released. ""
	// while the tag names Digest.
	Next digest.Digest `json:"next,omitempty"`
	// Pinned is when the pin was made (UTC).
	Pinned time.Time `json:"pinned"`
}

// pinKey is what a pin names: a tag of a repository, or a digest of one (tag "").
type pinKey struct {
	repo, tag string
	digest    digest.Digest
}

func (p *Pin) key() pinKey {
	if p.Tag != "" {
		return pinKey{repo: p.Repo, tag: p.Tag}
	}
	return pinKey{repo: p.Repo, digest: p.Digest}
}

// Errors of pinning and unpinning (Store.Pin, Store.Unpin).
var (
	// ErrNotCached: the tag or digest to pin names no manifest the cache holds.
	ErrNotCached = errors.New("not cached")
	// ErrNotPinned: nothing is pinned by that tag or digest.
	ErrNotPinned = errors.New("not pinned")
	// ErrPinLimit: the pin would take the pinned bytes above MaxPinnedShare of the cap.
	ErrPinLimit = errors.New("over the pinned share of the cap")
)

// MaxPinnedShare is the largest share of the cap (Options.MaxSize) pins may hold: a pin that
// would take the pinned bytes above it is refused (ErrPinLimit), so the rest of the cap stays for
// what is pulled through the cache (issue 24).
const MaxPinnedShare = 0.8

// setPins replaces the pins by pins (read from the pins file); a pin repeated keeps its first.
func (x *Index) setPins(pins []Pin) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pins = map[pinKey]*Pin{}
	for _, p := range pins {
		if _, dup := x.pins[p.key()]; !dup {
			c := p
			x.pins[p.key()] = &c
		}
	}
}

// pinContent returns what the pins would hold with p added (the images they hold now and those
// of p; content), and p as it would be recorded: a pin by tag (p.Tag) is of the manifest the
// tag names in the index now (p.Digest is set to it), a pin by digest of p.Digest. exists is
// true when a pin of the same tag or digest is there already (returned as it is).
//
// Errors: ErrNotCached when the repository holds no such tag or manifest.
func (x *Index) pinContent(p Pin) (c content, rec Pin, exists bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old := x.pins[p.key()]; old != nil {
		return content{}, *old, true, nil
	}
	r := x.repos[p.Repo]
	if p.Tag != "" {
		p.Digest = ""
		if r != nil {
			p.Digest = r.tags[p.Tag]
		}
	}
	if r == nil || p.Digest == "" || r.manifests[p.Digest] == nil {
		return content{}, p, false, ErrNotCached
	}
	prot := x.protectedLocked()
	x.topsLocked(p.Repo, p.Digest, prot)
	return x.contentLocked(prot, nil), p, false, nil
}

// AddPin records pin p (as pinContent returned it); it reports whether it is new.
func (x *Index) AddPin(p Pin) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.pins[p.key()] != nil {
		return false
	}
	x.pins[p.key()] = &p
	x.pinsDirty = true
	return true
}

// RemovePin drops the pin of tag (or, with tag "", of digest d) of repo and returns it; ok is
// false when there is none.
func (x *Index) RemovePin(repo, tag string, d digest.Digest) (p Pin, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := pinKey{repo: repo, tag: tag}
	if tag == "" {
		k.digest = d
	}
	old := x.pins[k]
	if old == nil {
		return Pin{}, false
	}
	delete(x.pins, k)
	x.pinsDirty = true
	return *old, true
}

// restorePin records p again after RemovePin (its removal could not be written).
func (x *Index) restorePin(p Pin) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.pins[p.key()] == nil {
		x.pins[p.key()] = &p
		x.pinsDirty = true
	}
}

// Pins returns the pins, by repository, then tag, then digest.
func (x *Index) Pins() []Pin {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.pinListLocked()
}

func (x *Index) pinListLocked() []Pin {
	out := make([]Pin, 0, len(x.pins))
	for _, p := range x.pins {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Pin) int {
		return cmp.Or(cmp.Compare(a.Repo, b.Repo), cmp.Compare(a.Tag, b.Tag), cmp.Compare(a.Digest, b.Digest))
	})
	return out
}

// PinBytes returns the bytes of the images pin p holds (each blob once).
func (x *Index) PinBytes(p Pin) int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	prot := map[Victim]bool{}
	x.pinTopsLocked(&p, prot)
	return x.bytesLocked(x.heldLocked(prot))
}

// PinsOf returns the pins that hold image m of repo (a top-level manifest), as Pins orders them.
func (x *Index) PinsOf(repo string, m digest.Digest) []Pin {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []Pin
	for _, p := range x.pinListLocked() {
		prot := map[Victim]bool{}
		x.pinTopsLocked(&p, prot)
		if prot[Victim{Repo: repo, Manifest: m}] {
			out = append(out, p)
		}
	}
	return out
}

// PinnedBytes returns the bytes of blob and manifest data the pins hold (each blob once,
// however many pins or images hold it).
func (x *Index) PinnedBytes() int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.bytesLocked(x.heldLocked(x.protectedLocked()))
}

// protectedLocked returns the images (top-level manifests of a repository) the pins hold.
func (x *Index) protectedLocked() map[Victim]bool {
	out := map[Victim]bool{}
	for _, p := range x.pins {
		x.pinTopsLocked(p, out)
	}
	return out
}

// pinTopsLocked adds the images pin p holds to out: those of its Digest and its Next.
func (x *Index) pinTopsLocked(p *Pin, out map[Victim]bool) {
	x.topsLocked(p.Repo, p.Digest, out)
	if p.Next != "" {
		x.topsLocked(p.Repo, p.Next, out)
	}
}

// topsLocked adds to out the images of repo that hold manifest d: d itself when no manifest of
// repo references it, else every top-level manifest above it. Nothing when repo does not hold d.
func (x *Index) topsLocked(repo string, d digest.Digest, out map[Victim]bool) {
	r := x.repos[repo]
	if r == nil || r.manifests[d] == nil {
		return
	}
	seen := map[digest.Digest]bool{}
	stack := []digest.Digest{d}
	for len(stack) > 0 {
		c := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[c] {
			continue
		}
		seen[c] = true
		if ps := r.parents[c]; len(ps) > 0 {
			stack = append(stack, ps...)
		} else if r.manifests[c] != nil {
			out[Victim{Repo: repo, Manifest: c}] = true
		}
	}
}

// heldLocked returns the digests the images images hold: their manifests, child manifests and
// blobs, as the index records them.
func (x *Index) heldLocked(images map[Victim]bool) map[digest.Digest]bool {
	held := map[digest.Digest]bool{}
	for v := range images {
		x.closureLocked(v.Repo, v.Manifest, held)
	}
	return held
}

// closureLocked adds d and what it references in repo, child manifests followed, to into.
func (x *Index) closureLocked(repo string, d digest.Digest, into map[digest.Digest]bool) {
	r := x.repos[repo]
	stack := []digest.Digest{d}
	for len(stack) > 0 {
		c := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if into[c] {
			continue
		}
		into[c] = true
		if r == nil {
			continue
		}
		if m := r.manifests[c]; m != nil {
			stack = append(stack, m.Refs...)
		}
	}
}

// bytesLocked is the size of the blob data of the digests in set that the index holds.
func (x *Index) bytesLocked(set map[digest.Digest]bool) int64 {
	var n int64
	for d := range set {
		if b := x.blobs[d]; b != nil {
			n += b.Size
		}
	}
	return n
}

// content is what a set of images holds, as the index records it.
type content struct {
	// stored is the bytes of the blobs (manifests included) the index holds, each once.
	stored int64
	// manifests are the manifests of the images (their repositories hold them).
	manifests []digest.Digest
	// missing are the digests those manifests reference that the index holds no blob of: blobs
	// not stored yet (a pull in progress), child manifests never pulled.
	missing map[digest.Digest]bool
}

// contentLocked returns what images hold, leaving out the digests in exclude.
func (x *Index) contentLocked(images map[Victim]bool, exclude map[digest.Digest]bool) content {
	c := content{missing: map[digest.Digest]bool{}}
	all := map[digest.Digest]bool{}
	for v := range images {
		one := map[digest.Digest]bool{}
		x.closureLocked(v.Repo, v.Manifest, one)
		r := x.repos[v.Repo]
		for d := range one {
			if r != nil && r.manifests[d] != nil {
				c.manifests = append(c.manifests, d)
			}
			all[d] = true
		}
	}
	for d := range all {
		switch {
		case exclude[d]:
		case x.blobs[d] != nil:
			c.stored += x.blobs[d].Size
		default:
			c.missing[d] = true
		}
	}
	return c
}

// floorContent returns what the pins hold, and what each image no pin holds holds besides
// (Store.evictionFloor).
func (x *Index) floorContent() (pinned content, images []content) {
	x.mu.Lock()
	defer x.mu.Unlock()
	prot := x.protectedLocked()
	held := x.heldLocked(prot)
	pinned = x.contentLocked(prot, nil)
	for name, r := range x.repos {
		for d := range r.manifests {
			v := Victim{Repo: name, Manifest: d}
			if len(r.parents[d]) > 0 || prot[v] {
				continue
			}
			images = append(images, x.contentLocked(map[Victim]bool{v: true}, held))
		}
	}
	return pinned, images
}

// followTagLocked moves a pin of repo's tag along when the tag now names d: d is pinned as the
// pin's Next until its image is complete (Store.settlePins); a tag back at the pin's Digest
// drops Next.
func (x *Index) followTagLocked(repo, tag string, d digest.Digest) {
	p := x.pins[pinKey{repo: repo, tag: tag}]
	if p == nil {
		return
	}
	switch d {
	case p.Digest:
		if p.Next != "" {
			p.Next = ""
			x.pinsDirty = true
		}
	case p.Next:
	default:
		p.Next = d
		x.pinsDirty = true
	}
}

// movingPins returns the pins by tag whose tag moved (Next set).
func (x *Index) movingPins() []Pin {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []Pin
	for _, p := range x.pins {
		if p.Next != "" {
			out = append(out, *p)
		}
	}
	return out
}

// hasMovingPins reports whether a pin by tag waits for its new image (movingPins).
func (x *Index) hasMovingPins() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, p := range x.pins {
		if p.Next != "" {
			return true
		}
	}
	return false
}

// completeMove makes p.Next the Digest of the pin by tag p names when its Next is still p.Next
// (the image of its old Digest is released); it reports whether it did.
func (x *Index) completeMove(p Pin) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	cur := x.pins[p.key()]
	if cur == nil || cur.Next == "" || cur.Next != p.Next {
		return false
	}
	cur.Digest, cur.Next = cur.Next, ""
	x.pinsDirty = true
	return true
}

// storedImages counts the image manifests of repo under manifest d (d included): the manifests
// of its closure that reference no manifest repo holds. 0 when repo does not hold d.
func (x *Index) storedImages(repo string, d digest.Digest) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.repos[repo]
	if r == nil || r.manifests[d] == nil {
		return 0
	}
	closure := map[digest.Digest]bool{}
	x.closureLocked(repo, d, closure)
	n := 0
	for c := range closure {
		m := r.manifests[c]
		if m != nil && !slices.ContainsFunc(m.Refs, func(ref digest.Digest) bool { return r.manifests[ref] != nil }) {
			n++
		}
	}
	return n
}

// HasBlob reports whether the index holds blob d's data.
func (x *Index) HasBlob(d digest.Digest) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.blobs[d] != nil
}

// pinsForSave returns the pins to write and clears their changed mark; dirty tells whether they
// had changed since the last write.
func (x *Index) pinsForSave() (pins []Pin, dirty bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	dirty = x.pinsDirty
	x.pinsDirty = false
	return x.pinListLocked(), dirty
}

// markPinsDirty records that the pins still have to be written (a write failed).
func (x *Index) markPinsDirty() {
	x.mu.Lock()
	x.pinsDirty = true
	x.mu.Unlock()
}
