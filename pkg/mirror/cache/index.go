// Package cache is nodecache's on-disk cache. A Store owns it: the storage driver (built from
// distribution's storage configuration; the mirror's distribution storage reads and writes through
// the same driver), the index of what storage holds (manifests with their references and last-pulled
// times, tags, blob links, blob data sizes) and its file under the storage root, eviction under
// the size cap and on a full disk, the lock fills commit under, and the lock one process takes
// on a filesystem root. The paths of distribution's storage layout that eviction and the index
// rebuild walk and delete are here too.
package cache

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// Index is what eviction and the inventory know of the stored content: per storage
// repository ("<upstream key>/<repository>") its manifests (with the digests each references
// and when it was last pulled), its tags and its blob links; globally every blob data file
// (manifests included) with its size in bytes. It is kept up to date by the serving path, saved
// to disk (Save, file.go) and rebuilt from storage when that file cannot be trusted. The zero
// value is not usable: NewIndex. All methods are safe for concurrent use.
type Index struct {
	mu    sync.Mutex
	repos map[string]*repoIndex        // by storage repository name "<upstream key>/<repository>"
	blobs map[digest.Digest]*BlobEntry // every blob data file, manifests included
	size  int64                        // sum of blobs' sizes (bytes)
	// refs counts, per digest, the manifests (in any repository) that reference it plus the
	// repositories that hold it as a manifest: a blob whose count is 0 is unreferenced.
	refs  map[digest.Digest]int
	dirty bool // changed since the last save

	// pins are the pins (pins.go), by what they name; pinsDirty says they changed since the
	// pins file was last written.
	pins      map[pinKey]*Pin
	pinsDirty bool

	ready     chan struct{} // closed once the index reflects storage (loaded or rebuilt)
	readyOnce sync.Once
}

// repoIndex is one storage repository.
type repoIndex struct {
	manifests map[digest.Digest]*ManifestEntry
	tags      map[string]digest.Digest
	layers    map[digest.Digest]bool // blob links (_layers)
	// parents lists, per digest, the manifests of this repository that reference it (once per
	// reference): a manifest with none is top-level (an image). Touch walks it up from a child.
	parents map[digest.Digest][]digest.Digest
}

// ManifestEntry is one manifest of a repository, as held in the index and its file.
type ManifestEntry struct {
	Refs       []digest.Digest `json:"refs,omitempty"` // child manifests, config and layers
	LastPulled time.Time       `json:"last_pulled"`
}

// BlobEntry is one blob data file (a manifest's too), as held in the index and its file.
type BlobEntry struct {
	// Size is the blob's verified size in bytes: the size a fill verified with the digest when
	// it stored the blob, or, after an index rebuild, the size the manifests referencing it state
	// (never the data file's own size, which is what damage changes). The serve path compares
	// the data file with it before every hit.
	Size  int64     `json:"size"`
	Added time.Time `json:"added"`
	// LastRead is when a member of --peers last read the blob from this cache (a peer read
	// counts as a pull); zero when none did.
	LastRead time.Time `json:"last_read,omitzero"`
	// Scrubbed is when the data was last read whole and found to hash to its digest: when a fill
	// stored it, or by the scrubber, a verify pass or a first serve after a start. Zero: never
	// (an entry an index rebuild found), so the scrubber takes it first.
	Scrubbed time.Time `json:"scrubbed,omitzero"`
	// SizeUnverified is true when Size was read from the data file itself: an index rebuild
	// found no manifest stating it (a blob held for --peers, or left by a pull whose manifest was
	// never stored). Such a blob has no size to check against; it is hashed on its first serve.
	SizeUnverified bool `json:"size_unverified,omitempty"`
	// verified is true once the data was hashed and matched its digest in this process (a
	// fill's commit, a first serve, a scrub); not saved: after a restart every blob's first
	// serve is hashed again. A verified blob is served by the fast path (sendfile).
	verified bool
	// stamp is the data file as it was when it was verified (filesystem storage; zero
	// otherwise): a file written since (another mtime, inode or size) is hashed again.
	stamp filestamp.Stamp
}

// BlobCheck is what the serve path checks a stored blob's data against (Index.Check).
type BlobCheck struct {
	// Size is the verified size in bytes (BlobEntry.Size); -1 when there is none: the blob is
	// not in the index (the index is still being rebuilt, or another replica of a shared bucket
	// stored it) or its size came from its own data file.
	Size int64
	// Verified reports that the data was hashed and matched its digest since this process
	// started.
	Verified bool
	// Stamp is the data file as it was when it was verified (filesystem storage; zero when
	// unknown, which matches no file): a file that differs was written since.
	Stamp filestamp.Stamp
}

// lastUsed is when the blob was last stored or read by a member: what eviction orders an
// unreferenced blob by.
func (b *BlobEntry) lastUsed() time.Time {
	if b.LastRead.After(b.Added) {
		return b.LastRead
	}
	return b.Added
}

// NewIndex returns an empty index, not ready (Ready) until MarkReady.
func NewIndex() *Index {
	return &Index{repos: map[string]*repoIndex{}, blobs: map[digest.Digest]*BlobEntry{},
		refs: map[digest.Digest]int{}, pins: map[pinKey]*Pin{}, ready: make(chan struct{})}
}

// MarkReady records that the index reflects storage (loaded from its file or rebuilt); calls
// after the first do nothing.
func (x *Index) MarkReady() { x.readyOnce.Do(func() { close(x.ready) }) }

// Ready is closed once the index reflects storage (MarkReady).
func (x *Index) Ready() <-chan struct{} { return x.ready }

// IsReady reports whether Ready is closed.
func (x *Index) IsReady() bool {
	select {
	case <-x.ready:
		return true
	default:
		return false
	}
}

func (x *Index) repo(name string) *repoIndex {
	r := x.repos[name]
	if r == nil {
		r = &repoIndex{manifests: map[digest.Digest]*ManifestEntry{}, tags: map[string]digest.Digest{},
			layers: map[digest.Digest]bool{}, parents: map[digest.Digest][]digest.Digest{}}
		x.repos[name] = r
	}
	return r
}

// AddBlob records a blob data file of size bytes (idempotent) and, when repo is not "", its link
// in repo.
func (x *Index) AddBlob(repo string, d digest.Digest, size int64, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.addBlobLocked(repo, d, size, at)
}

// addBlobLocked records blob d of size bytes when the index does not have it, and repo's link
// to it when repo is not ""; it returns the entry, new or not.
func (x *Index) addBlobLocked(repo string, d digest.Digest, size int64, at time.Time) *BlobEntry {
	b := x.blobs[d]
	if b == nil {
		b = &BlobEntry{Size: size, Added: at}
		x.blobs[d] = b
		x.size += size
		x.dirty = true
	}
	if repo != "" && !x.repo(repo).layers[d] {
		x.repo(repo).layers[d] = true
		x.dirty = true
	}
	return b
}

// setSizeLocked makes size the verified size of entry b of the index.
func (x *Index) setSizeLocked(b *BlobEntry, size int64) {
	if b.Size != size || b.SizeUnverified {
		x.size += size - b.Size
		b.Size, b.SizeUnverified = size, false
		x.dirty = true
	}
}

// AddFound records a blob data file an index rebuild found in storage, of size bytes as the
// file says (BlobEntry.SizeUnverified until a manifest states its size, SetDescriptorSize).
// An entry the index already has (stored meanwhile by a fill) is kept as it is.
func (x *Index) AddFound(d digest.Digest, size int64, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.blobs[d] == nil {
		x.addBlobLocked("", d, size, at).SizeUnverified = true
	}
}

// SetDescriptorSize records size, which a manifest's descriptor of blob d states, as d's
// verified size when its size so far came from its own data file; a verified size stays.
func (x *Index) SetDescriptorSize(d digest.Digest, size int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if b := x.blobs[d]; b != nil && b.SizeUnverified && size >= 0 {
		x.setSizeLocked(b, size)
	}
}

// Verified records that blob d's data was read whole at at and hashed to d, size bytes long
// (its data file then stamp, on filesystem storage): size becomes its verified size, it is
// scrubbed at at and verified for this process (the serve path's fast path). A blob the index
// does not have is added (with repo's link when repo is not ""): one another replica of a
// shared bucket stored, or one served while the index is rebuilt.
func (x *Index) Verified(repo string, d digest.Digest, size int64, at time.Time, stamp filestamp.Stamp) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.addBlobLocked(repo, d, size, at)
	x.setSizeLocked(b, size)
	b.verified, b.stamp = true, stamp
	if at.After(b.Scrubbed) {
		b.Scrubbed = at
		x.dirty = true
	}
}

// Rehashed records that blob d's data was read whole at at and hashed to d, size bytes long (a
// scrub): as Verified, for a blob the index still holds (nothing is added).
func (x *Index) Rehashed(d digest.Digest, size int64, at time.Time, stamp filestamp.Stamp) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.blobs[d]
	if b == nil {
		return
	}
	x.setSizeLocked(b, size)
	b.verified, b.stamp = true, stamp
	if at.After(b.Scrubbed) {
		b.Scrubbed = at
		x.dirty = true
	}
}

// dueForScrub returns the blobs last hashed before before (never hashed included) that skip
// does not leave out, least recently hashed first (then by digest).
func (x *Index) dueForScrub(before time.Time, skip func(digest.Digest) bool) []digest.Digest {
	x.mu.Lock()
	type due struct {
		d  digest.Digest
		at time.Time
	}
	var list []due
	for d, b := range x.blobs {
		if b.Scrubbed.Before(before) && !skip(d) {
			list = append(list, due{d, b.Scrubbed})
		}
	}
	x.mu.Unlock()
	slices.SortFunc(list, func(a, b due) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return strings.Compare(string(a.d), string(b.d))
	})
	out := make([]digest.Digest, len(list))
	for i, e := range list {
		out[i] = e.d
	}
	return out
}

// oldestScrub returns the earliest time a blob was last hashed; ok is false when the index holds
// no blob.
func (x *Index) oldestScrub() (at time.Time, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, b := range x.blobs {
		if !ok || b.Scrubbed.Before(at) {
			at, ok = b.Scrubbed, true
		}
	}
	return at, ok
}

// scrubItem is a blob a verify pass reads: its digest and size (bytes, as the index has it).
type scrubItem struct {
	d    digest.Digest
	size int64
}

// scrubList returns every blob of the index, by digest.
func (x *Index) scrubList() []scrubItem {
	x.mu.Lock()
	out := make([]scrubItem, 0, len(x.blobs))
	for d, b := range x.blobs {
		out = append(out, scrubItem{d, b.Size})
	}
	x.mu.Unlock()
	slices.SortFunc(out, func(a, b scrubItem) int { return strings.Compare(string(a.d), string(b.d)) })
	return out
}

// Stored records blob d of size bytes, verified by the fill that stored it, linked into repo at
// at (its data file then stamp, on filesystem storage). fresh tells that the data in storage is
// the fill's own bytes (written by this commit): the blob is then verified (Verified);
// otherwise the data was there already (stored for another repository or by another replica)
// and size only becomes its verified size.
func (x *Index) Stored(repo string, d digest.Digest, size int64, at time.Time, fresh bool, stamp filestamp.Stamp) {
	if fresh {
		x.Verified(repo, d, size, at, stamp)
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.setSizeLocked(x.addBlobLocked(repo, d, size, at), size)
}

// Check returns what the serve path checks blob d's data against.
func (x *Index) Check(d digest.Digest) BlobCheck {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.blobs[d]
	switch {
	case b == nil:
		return BlobCheck{Size: -1}
	case b.SizeUnverified:
		return BlobCheck{Size: -1, Verified: b.verified, Stamp: b.stamp}
	}
	return BlobCheck{Size: b.Size, Verified: b.verified, Stamp: b.stamp}
}

// AddLink records repo's link to blob d when d's data is known.
func (x *Index) AddLink(repo string, d digest.Digest) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.blobs[d] != nil && !x.repo(repo).layers[d] {
		x.repo(repo).layers[d] = true
		x.dirty = true
	}
}

// AddManifest records manifest d of repo, stored in a blob of size bytes, referencing refs.
// Recording it again only moves its last-pulled time forward.
func (x *Index) AddManifest(repo string, d digest.Digest, size int64, refs []digest.Digest, pulled time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.addBlobLocked("", d, size, pulled)
	r := x.repo(repo)
	if e := r.manifests[d]; e != nil {
		if pulled.After(e.LastPulled) {
			e.LastPulled = pulled
			x.dirty = true
		}
		return
	}
	r.manifests[d] = &ManifestEntry{Refs: refs, LastPulled: pulled}
	x.refs[d]++
	for _, c := range refs {
		r.parents[c] = append(r.parents[c], d)
		x.refs[c]++
	}
	x.dirty = true
}

// Touch records a pull (GET or HEAD, by tag or digest) of manifest d of repo. A pull of a child
// manifest (an index's image, pulled by digest or through a tag of its own such as "amd64") is
// a use of every manifest of repo that references it, directly or through nested indexes: they
// are pulled at the same time, so eviction never takes an image whose child was just pulled.
func (x *Index) Touch(repo string, d digest.Digest, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.repos[repo]
	if r == nil {
		return
	}
	seen := map[digest.Digest]bool{}
	stack := []digest.Digest{d}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[d] {
			continue
		}
		seen[d] = true
		if e := r.manifests[d]; e != nil && at.After(e.LastPulled) {
			e.LastPulled = at
			x.dirty = true
		}
		for _, p := range r.parents[d] {
			if !seen[p] {
				stack = append(stack, p)
			}
		}
	}
}

// SetTag records that tag of repo points at manifest d. A pin of the tag follows it
// (followTagLocked).
func (x *Index) SetTag(repo, tag string, d digest.Digest) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.repo(repo)
	if r.tags[tag] != d {
		r.tags[tag] = d
		x.dirty = true
	}
	x.followTagLocked(repo, tag, d)
}

// HasManifest reports whether repo holds manifest d.
func (x *Index) HasManifest(repo string, d digest.Digest) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.repos[repo]
	return r != nil && r.manifests[d] != nil
}

// Holders returns the images of storage repository repo (its top-level manifests, as Images
// lists them) that hold manifest d as a child manifest — a platform's image of an index, or an
// index inside one — directly or through nested indexes, sorted. None when d is not stored in
// repo or is an image itself.
func (x *Index) Holders(repo string, d digest.Digest) []digest.Digest {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.repos[repo]
	if r == nil || r.manifests[d] == nil {
		return nil
	}
	var out []digest.Digest
	seen := map[digest.Digest]bool{d: true}
	stack := slices.Clone(r.parents[d])
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[p] {
			continue
		}
		seen[p] = true
		if len(r.parents[p]) == 0 {
			if r.manifests[p] != nil {
				out = append(out, p)
			}
			continue
		}
		stack = append(stack, r.parents[p]...)
	}
	slices.Sort(out)
	return out
}

// Totals are the stored bytes and blob data files.
func (x *Index) Totals() (size int64, blobs int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.size, len(x.blobs)
}

// UnreferencedTotals counts the blob data files no manifest references and no repository holds as a
// manifest (a raw blob GET, blobs held for the members of --peers, a pull that never stored its
// manifest), and their size in bytes: eviction removes them first, least recently used first.
func (x *Index) UnreferencedTotals() (blobs int, size int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for d, b := range x.blobs {
		if x.refs[d] <= 0 {
			blobs++
			size += b.Size
		}
	}
	return blobs, size
}

// Victim is what eviction removes next: an unreferenced blob (Repo == "") or an image.
type Victim struct {
	Repo     string        // storage repository; "" for an unreferenced blob
	Manifest digest.Digest // the image's top-level manifest; the blob when Repo == ""
}

// NextVictim picks, among what skip does not hold, what was used least recently: a blob no
// manifest references (held for the members of --peers, or left by a pull that never stored its
// manifest), by when it was stored or last read by a member, or an image (top-level manifest of
// one repository) no pin holds, by when it was last pulled. Ties go to blobs, then by name. ok
// is false when nothing is left.
func (x *Index) NextVictim(skip map[Victim]bool) (v Victim, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	pinned := x.protectedLocked()
	var oldest time.Time
	consider := func(c Victim, at time.Time) {
		if !ok || at.Before(oldest) || (at.Equal(oldest) && victimLess(c, v)) {
			v, oldest, ok = c, at, true
		}
	}
	for d, b := range x.blobs {
		if c := (Victim{Manifest: d}); x.refs[d] == 0 && !skip[c] {
			consider(c, b.lastUsed())
		}
	}
	for name, r := range x.repos {
		for d, e := range r.manifests {
			if c := (Victim{Repo: name, Manifest: d}); len(r.parents[d]) == 0 && !skip[c] && !pinned[c] {
				consider(c, e.LastPulled)
			}
		}
	}
	return v, ok
}

// victimLess orders victims used at the same moment: blobs first, then by repository and digest.
func victimLess(a, b Victim) bool {
	if (a.Repo == "") != (b.Repo == "") {
		return a.Repo == ""
	}
	return a.Repo < b.Repo || a.Repo == b.Repo && a.Manifest < b.Manifest
}

// ReadByPeer records that a member of --peers read blob d from this cache at at: a peer read
// counts as a pull for eviction's least-recently-used order.
func (x *Index) ReadByPeer(d digest.Digest, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if b := x.blobs[d]; b != nil && at.After(b.LastRead) {
		b.LastRead = at
		x.dirty = true
	}
}

// Removal is what evicting one image takes away: links first, then the blob data no remaining
// manifest references.
type Removal struct {
	Repo      string          // the storage repository
	Manifests []digest.Digest // revision links (RevisionPath)
	Tags      []string        // tag directories (TagPath), sorted
	Layers    []digest.Digest // blob links in Repo (LayerLinkPath)
	// Data are the blobs (manifests included) nothing references any more, sorted; other
	// repositories may still link them (LinksOf).
	Data []digest.Digest
}

// RemoveImage drops image m of repo from the index (its child manifests that no other manifest
// of repo references, the tags pointing at any of them, the blob links of repo nothing there
// references any more) and returns what storage must lose. Blob data stays in the index until
// DropBlob: the caller removes it only when no request uses it. An image a pin holds is not
// removed (nothing is returned).
func (x *Index) RemoveImage(repo string, m digest.Digest) Removal {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := Removal{Repo: repo}
	r := x.repos[repo]
	if r == nil || r.manifests[m] == nil || x.protectedLocked()[Victim{Repo: repo, Manifest: m}] {
		return out
	}
	touched := map[digest.Digest]bool{}
	stack := []digest.Digest{m}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		e := r.manifests[d]
		if e == nil {
			continue
		}
		delete(r.manifests, d)
		out.Manifests = append(out.Manifests, d)
		x.refs[d]--
		touched[d] = true
		for _, c := range e.Refs {
			if r.parents[c] = slices.DeleteFunc(r.parents[c], func(p digest.Digest) bool { return p == d }); len(r.parents[c]) == 0 {
				delete(r.parents, c)
			}
			x.refs[c]--
			touched[c] = true
			if r.manifests[c] != nil && len(r.parents[c]) == 0 {
				stack = append(stack, c)
			}
		}
	}
	for tag, d := range r.tags {
		if touched[d] && r.manifests[d] == nil {
			delete(r.tags, tag)
			out.Tags = append(out.Tags, tag)
		}
	}
	for d := range touched {
		if r.layers[d] && len(r.parents[d]) == 0 {
			delete(r.layers, d)
			out.Layers = append(out.Layers, d)
		}
		if x.refs[d] <= 0 {
			delete(x.refs, d)
			if x.blobs[d] != nil {
				out.Data = append(out.Data, d)
			}
		}
	}
	slices.Sort(out.Data)
	slices.Sort(out.Tags)
	x.dirty = true
	return out
}

// Unreferenced reports whether blob d is referenced by no manifest and is no manifest itself.
func (x *Index) Unreferenced(d digest.Digest) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.refs[d] <= 0
}

// LinksOf returns the repositories that link blob d (_layers).
func (x *Index) LinksOf(d digest.Digest) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for name, r := range x.repos {
		if r.layers[d] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// DropBlob forgets blob d's data file and every link to it; it returns the size it had.
func (x *Index) DropBlob(d digest.Digest) int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.blobs[d]
	if b == nil {
		return 0
	}
	delete(x.blobs, d)
	x.size -= b.Size
	for _, r := range x.repos {
		delete(r.layers, d)
	}
	x.dirty = true
	return b.Size
}

// Images lists the images of the index, most recently pulled first, each marked when a pin holds
// it. name maps a storage repository to its upstream name and repository ("" when unknown). A
// tag naming a child
// manifest of an image (an index's "amd64" image tagged on its own) is listed in that image's
// ChildTags: the image is what holds the child and what eviction removes with it.
func (x *Index) Images(name func(storageRepo string) (upstream, repo string)) []mirrorapi.CachedImage {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := []mirrorapi.CachedImage{}
	pinned := x.protectedLocked()
	for sr, r := range x.repos {
		up, repo := name(sr)
		if up == "" {
			continue
		}
		tagsOf := map[digest.Digest][]string{}
		for tag, td := range r.tags {
			tagsOf[td] = append(tagsOf[td], tag)
		}
		for d, e := range r.manifests {
			if len(r.parents[d]) > 0 {
				continue
			}
			img := mirrorapi.CachedImage{Upstream: up, Repository: repo, Digest: d.String(), LastPulled: e.LastPulled.UTC(),
				Pinned: pinned[Victim{Repo: sr, Manifest: d}]}
			img.Tags = slices.Sorted(slices.Values(tagsOf[d]))
			x.addContent(&img, r, d, tagsOf)
			out = append(out, img)
		}
	}
	slices.SortFunc(out, compareImages)
	return out
}

// addContent adds to img, the image whose top manifest is d in r, the size of every blob it
// holds (each once) and the tags of its child manifests (tagsOf: the tags of each manifest).
// x.mu is held.
func (x *Index) addContent(img *mirrorapi.CachedImage, r *repoIndex, d digest.Digest, tagsOf map[digest.Digest][]string) {
	seen := map[digest.Digest]bool{}
	var walk func(digest.Digest)
	walk = func(c digest.Digest) {
		if seen[c] {
			return
		}
		seen[c] = true
		if b := x.blobs[c]; b != nil {
			img.SizeBytes += b.Size
		}
		m := r.manifests[c]
		if m == nil {
			return
		}
		if c != d {
			for _, tag := range tagsOf[c] {
				if img.ChildTags == nil {
					img.ChildTags = map[string]string{}
				}
				img.ChildTags[tag] = c.String()
			}
		}
		for _, cc := range m.Refs {
			walk(cc)
		}
	}
	walk(d)
}

// compareImages orders images most recently pulled first, then by upstream/repository, then by
// digest.
func compareImages(a, b mirrorapi.CachedImage) int {
	if c := b.LastPulled.Compare(a.LastPulled); c != 0 {
		return c
	}
	if a.Upstream+"/"+a.Repository != b.Upstream+"/"+b.Repository {
		if a.Upstream+"/"+a.Repository < b.Upstream+"/"+b.Repository {
			return -1
		}
		return 1
	}
	if a.Digest < b.Digest {
		return -1
	}
	return 1
}

// MaxManifestRefs bounds the descriptors (config, layers, child manifests) a manifest fetched
// from an upstream may list; keepManifest refuses one that lists more, before anything is stored.
// Each reference becomes index entries (refs, parents) and the eviction walk's work, recorded
// under the store lock every fill takes. The OCI distribution spec and distribution set no
// limit of their own, but a manifest body is capped at upstream.MaxManifestBytes (4 MiB), which
// fits about 28,000 descriptors of about 150 bytes. Real images have at most 125 layers (moby's
// layer store refuses deeper chains, maxLayerDepth, for graphdrivers' 127) and real indexes tens
// of children (platforms and their attestations), so 10,000 is 80 times what a real image or
// index needs and a third of what a 4 MiB manifest can list.
const MaxManifestRefs = 10_000

// ManifestRefs returns the distinct digests a manifest or index references (config, layers,
// child manifests; a subject is not part of the image), in the order they first appear, and
// listed, the number of descriptors it lists (duplicates and invalid digests included: what
// MaxManifestRefs bounds). When limit > 0 and listed exceeds it, refs is nil: the caller refuses
// the manifest and needs only the count. Content that does not parse references nothing (listed
// 0). Time and memory are linear in the size of raw (a set removes duplicates); callers call it
// before taking any lock.
func ManifestRefs(raw []byte, limit int) (refs []digest.Digest, listed int) {
	var m struct {
		Config *struct {
			Digest digest.Digest `json:"digest"`
		} `json:"config"`
		Layers []struct {
			Digest digest.Digest `json:"digest"`
		} `json:"layers"`
		Manifests []struct {
			Digest digest.Digest `json:"digest"`
		} `json:"manifests"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return nil, 0
	}
	listed = len(m.Layers) + len(m.Manifests)
	if m.Config != nil {
		listed++
	}
	if limit > 0 && listed > limit {
		return nil, listed
	}
	seen := make(map[digest.Digest]struct{}, listed)
	add := func(d digest.Digest) {
		if _, dup := seen[d]; dup || d.Validate() != nil {
			return
		}
		seen[d] = struct{}{}
		refs = append(refs, d)
	}
	if m.Config != nil {
		add(m.Config.Digest)
	}
	for _, l := range m.Layers {
		add(l.Digest)
	}
	for _, c := range m.Manifests {
		add(c.Digest)
	}
	return refs, listed
}
