package bundle

import (
	_ "crypto/sha256" // digest algorithms for go-digest
	_ "crypto/sha512"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/distribution/reference"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/internal/atomicfile"
	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// WorkDirName is the directory a writer keeps inside DIR while it runs: temporary blob files
// and, for a new Talos tree, the manifests staged until Commit. It is removed by Close; one
// left by a killed writer is removed by the next. Readers ignore it.
const WorkDirName = ".nodecache-bundle"

// ErrInUse is wrapped by Create's error when another writer holds DIR.
var ErrInUse = errors.New("bundle directory in use")

// Image is one image a bundle lists: the reference it is listed under and the manifest (an
// index or an image manifest) that reference names.
type Image struct {
	// Registry and Repository are the reference's, normalised by the distribution reference
	// grammar: "docker.io" and "library/alpine", "ghcr.io" and "siderolabs/kubelet".
	Registry, Repository string
	// Tag is the tag the image is listed under; "" for an image named by digest only.
	Tag string
	// Manifest is what the reference names: media type, digest and size (bytes) of the index
	// or image manifest stored with Writer.Manifest.
	Manifest v1.Descriptor
}

// Name is the image's full reference: registry/repository:tag, or registry/repository@digest
// for an image without a tag ("docker.io/library/alpine:3.20").
func (im Image) Name() string {
	if im.Tag != "" {
		return im.Registry + "/" + im.Repository + ":" + im.Tag
	}
	return im.Registry + "/" + im.Repository + "@" + im.Manifest.Digest.String()
}

// layout is what differs between the formats: where blobs and manifests go, and what Commit
// writes last.
type layout interface {
	// start writes what marks a new bundle as one being written (the OCI layout's oci-layout
	// file), once the work directory exists.
	start(w *Writer) error
	// blobPath is the final path of blob d (a config or layer).
	blobPath(d digest.Digest) (string, error)
	// putManifest stores a manifest of registry/repository whose digest was checked.
	putManifest(w *Writer, registry, repository string, d digest.Digest, body []byte) error
	// commit makes the images visible: it is the last write.
	commit(w *Writer, images []Image) error
}

// Writer writes one bundle. Blob, Manifest and Add are safe for concurrent use. Nothing a
// Writer writes before Commit makes an image visible to a reader: an interrupted or failed run
// leaves at most verified blobs (and manifests, in an OCI layout's blobs/), which the next run
// into the same DIR reuses after hashing them again.
type Writer struct {
	dir, work string
	format    Format
	lock      *os.File // DIR itself, flock'ed
	existing  bool     // DIR held a bundle of this format listing images: Commit merges
	l         layout

	mu       sync.Mutex
	verified map[digest.Digest]bool
	images   []Image
	names    map[string]digest.Digest
	synced   map[string]bool // directories that got entries, fsynced before Commit's last write
	done     bool
}

// Create opens DIR for writing a bundle of format f, creating it (and its parents) when
// missing, and holds an exclusive lock on it (flock(2) on the directory) until Close.
//
// DIR may be missing or empty (a new bundle), a bundle of the same format (its images are kept
// and the ones written now are added, replacing an image listed under the same name), or what
// an interrupted writer left (oci-layout and blobs without index.json; blob/ without
// manifests/), which is resumed. Anything else is refused (refusal.ErrRefused, naming DIR as
// --to and what it holds): a file, a directory holding other things, a bundle of the other
// format, an index.json that is not an OCI image index. Another writer holding DIR is refused
// too (ErrInUse).
func Create(dir string, f Format) (*Writer, error) {
	if _, err := ParseFormat(string(f)); err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create bundle directory %s: %w", dir, err)
		}
	case err != nil:
		return nil, fmt.Errorf("bundle directory %s: %w", dir, err)
	case !st.IsDir():
		return nil, refusal.Errorf("--to %s is not a directory: want a new or empty directory, or a bundle to add to", dir)
	}
	lock, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("bundle directory %s: %w", dir, err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &refusal.Error{Reason: fmt.Sprintf("--to %s: %v: another nodecache warm --to is writing it; wait for it to end, or give another directory", dir, ErrInUse), Err: ErrInUse}
		}
		return nil, fmt.Errorf("bundle directory %s: lock: %w", dir, err)
	}
	w := &Writer{dir: dir, work: filepath.Join(dir, WorkDirName), format: f, lock: lock,
		verified: map[digest.Digest]bool{}, names: map[string]digest.Digest{}, synced: map[string]bool{}}
	fail := func(err error) (*Writer, error) {
		_ = lock.Close()
		return nil, err
	}
	entries, err := listDir(dir)
	if err != nil {
		return fail(err)
	}
	switch f {
	case FormatTalosFlat:
		w.l, w.existing, err = openTalosFlatWriter(dir, entries)
	default:
		w.l, w.existing, err = openOCIWriter(dir, entries)
	}
	if err != nil {
		return fail(err)
	}
	// What a killed writer left here is ours (DIR is locked): start from nothing.
	if err := os.RemoveAll(w.work); err != nil {
		return fail(fmt.Errorf("bundle directory %s: remove %s left by an earlier run: %w", dir, WorkDirName, err))
	}
	if err := os.Mkdir(w.work, 0o700); err != nil {
		return fail(fmt.Errorf("bundle directory %s: %w", dir, err))
	}
	if err := w.l.start(w); err != nil {
		_ = os.RemoveAll(w.work)
		return fail(fmt.Errorf("bundle directory %s: %w", dir, err))
	}
	return w, nil
}

// Dir is the bundle directory; Format its format.
func (w *Writer) Dir() string    { return w.dir }
func (w *Writer) Format() Format { return w.format }

// Existing reports whether DIR held a bundle of this format listing images already: Commit
// keeps them (replacing those listed under a name written now).
func (w *Writer) Existing() bool { return w.existing }

// listDir returns DIR's entries but the writer's own work directory.
func listDir(dir string) ([]fs.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bundle directory %s: %w", dir, err)
	}
	return slices.DeleteFunc(entries, func(e fs.DirEntry) bool { return e.Name() == WorkDirName }), nil
}

// describeEntries names up to three entries for a refusal: "a, b, c and 4 more".
func describeEntries(entries []fs.DirEntry) string {
	var names []string
	for i, e := range entries {
		if i == 3 {
			names = append(names, fmt.Sprintf("and %d more", len(entries)-3))
			break
		}
		n := e.Name()
		if e.IsDir() {
			n += "/"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// Blob returns nil when blob desc (a config or layer) is in the bundle already and its bytes
// hash to desc's digest and size (hashed once per Writer), else a BlobFile to write it into.
// A stored blob that does not match is removed first. Errors: a digest whose algorithm is not
// available (or, in a Talos tree, not sha256), a negative size, I/O.
func (w *Writer) Blob(desc v1.Descriptor) (*BlobFile, error) {
	d, err := parseDigest(desc.Digest)
	if err != nil {
		return nil, err
	}
	if desc.Size < 0 {
		return nil, fmt.Errorf("blob %s: negative size %d", d, desc.Size)
	}
	final, err := w.l.blobPath(d)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	ok := w.verified[d]
	w.mu.Unlock()
	if ok {
		return nil, nil
	}
	switch match, err := fileMatches(final, d, desc.Size); {
	case err != nil:
		return nil, err
	case match:
		w.mu.Lock()
		w.verified[d] = true
		w.mu.Unlock()
		return nil, nil
	}
	tmp, err := os.CreateTemp(w.work, "blob-*")
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d, err)
	}
	return &BlobFile{w: w, f: tmp, want: d, size: desc.Size, h: d.Algorithm().Hash(), final: final}, nil
}

// ReadBlob returns the bytes of blob desc as the bundle holds it, checked against desc's digest
// and size again: for a blob Blob found present, which warm --to still reads (an image's
// config, for its platform). Errors: the blob is not stored, does not match, or cannot be read.
func (w *Writer) ReadBlob(desc v1.Descriptor) ([]byte, error) {
	d, err := parseDigest(desc.Digest)
	if err != nil {
		return nil, err
	}
	final, err := w.l.blobPath(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(final)
	if err != nil {
		return nil, fmt.Errorf("read stored blob %s: %w", d, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, desc.Size+1))
	if err != nil {
		return nil, fmt.Errorf("read stored blob %s: %w", d, err)
	}
	if int64(len(b)) != desc.Size || d.Algorithm().FromBytes(b) != d {
		return nil, fmt.Errorf("stored blob %s: does not match its digest and size %d any more", d, desc.Size)
	}
	return b, nil
}

// parseDigest checks h as a digest whose algorithm this build can compute.
func parseDigest(h v1.Hash) (digest.Digest, error) {
	d, err := digest.Parse(h.String())
	if err != nil {
		return "", fmt.Errorf("digest %q: %w", h, err)
	}
	if !d.Algorithm().Available() {
		return "", fmt.Errorf("digest %s: algorithm not supported", d)
	}
	return d, nil
}

// fileMatches reports whether the file at p holds exactly size bytes hashing to d. A file that
// does not match is removed; a missing one is no match.
func fileMatches(p string, d digest.Digest, size int64) (bool, error) {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check stored blob %s: %w", d, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("check stored blob %s: %w", d, err)
	}
	if st.Mode().IsRegular() && st.Size() == size {
		h := d.Algorithm().Hash()
		if _, err := io.Copy(h, f); err != nil {
			return false, fmt.Errorf("check stored blob %s: %w", d, err)
		}
		if digest.NewDigest(d.Algorithm(), h) == d {
			return true, nil
		}
	}
	if err := os.RemoveAll(p); err != nil {
		return false, fmt.Errorf("remove damaged blob %s: %w", p, err)
	}
	return false, nil
}

// BlobFile receives one blob's bytes in a temporary file inside the bundle directory, hashing
// them as they are written. Commit checks size and digest, fsyncs and renames it into place;
// Abort throws it away. Not safe for concurrent use.
type BlobFile struct {
	w     *Writer
	f     *os.File
	want  digest.Digest
	size  int64
	h     hash.Hash
	n     int64
	final string
	err   error
	// broken: the file could not be emptied for a new start; err stays.
	broken bool
}

// Write appends p. Writing past the blob's size is an error (the bytes are not the blob).
func (b *BlobFile) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.n+int64(len(p)) > b.size {
		b.err = fmt.Errorf("blob %s: more than its %s", b.want, clitext.Count(b.size, "byte"))
		return 0, b.err
	}
	n, err := b.f.Write(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	if err != nil {
		b.err = fmt.Errorf("write blob %s: %w", b.want, err)
		return n, b.err
	}
	return n, nil
}

// Reset discards what was written, for a transfer that starts over. When the file cannot be
// emptied, every later Write and Commit fail with that error.
func (b *BlobFile) Reset() {
	if b.broken {
		return
	}
	b.h.Reset()
	b.n, b.err = 0, nil
	if err := b.f.Truncate(0); err != nil {
		b.err, b.broken = fmt.Errorf("blob %s: start over: %w", b.want, err), true
		return
	}
	if _, err := b.f.Seek(0, io.SeekStart); err != nil {
		b.err, b.broken = fmt.Errorf("blob %s: start over: %w", b.want, err), true
	}
}

// Commit checks that exactly the blob's size was written and that it hashes to its digest,
// fsyncs the file and renames it to its place in the bundle. Errors name the blob; on any
// error the temporary file is removed and nothing is stored.
func (b *BlobFile) Commit() error {
	defer b.Abort()
	switch {
	case b.err != nil:
		return b.err
	case b.n != b.size:
		return fmt.Errorf("blob %s: wrote %d of its %s", b.want, b.n, clitext.Count(b.size, "byte"))
	}
	if got := digest.NewDigest(b.want.Algorithm(), b.h); got != b.want {
		return fmt.Errorf("blob %s: digest mismatch: the bytes written hash to %s", b.want, got)
	}
	if err := b.f.Chmod(0o644); err != nil { // CreateTemp's 0600 would keep other readers out
		return fmt.Errorf("write blob %s: %w", b.want, err)
	}
	if err := b.f.Sync(); err != nil {
		return fmt.Errorf("write blob %s: %w", b.want, err)
	}
	if err := b.f.Close(); err != nil {
		return fmt.Errorf("write blob %s: %w", b.want, err)
	}
	if err := b.w.place(b.f.Name(), b.final); err != nil {
		return fmt.Errorf("store blob %s: %w", b.want, err)
	}
	b.w.mu.Lock()
	b.w.verified[b.want] = true
	b.w.mu.Unlock()
	return nil
}

// Abort removes the temporary file (after Commit: nothing left to remove).
func (b *BlobFile) Abort() {
	_ = b.f.Close()
	_ = os.Remove(b.f.Name())
}

// place renames tmp to final, creating final's directory, and remembers the directory to
// fsync before Commit's last write.
func (w *Writer) place(tmp, final string) error {
	parent := filepath.Dir(final)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	w.mu.Lock()
	w.markSynced(parent)
	w.mu.Unlock()
	return nil
}

// markSynced records that directory p (inside DIR) got an entry: p and the directories between
// it and DIR, which MkdirAll may have created, are fsynced before Commit's last write. w.mu is
// held.
func (w *Writer) markSynced(p string) {
	for ; p != w.dir && strings.HasPrefix(p, w.dir+string(filepath.Separator)); p = filepath.Dir(p) {
		w.synced[p] = true
	}
	w.synced[w.dir] = true
}

// Manifest stores the manifest body (an index or an image manifest) of registry/repository
// after checking it against desc's digest (and size, when desc has one). Errors name the
// manifest.
func (w *Writer) Manifest(registry, repository string, desc v1.Descriptor, body []byte) error {
	d, err := parseDigest(desc.Digest)
	if err != nil {
		return err
	}
	if got := d.Algorithm().FromBytes(body); got != d {
		return fmt.Errorf("manifest %s: digest mismatch: its bytes hash to %s", d, got)
	}
	if desc.Size > 0 && desc.Size != int64(len(body)) {
		return fmt.Errorf("manifest %s: %d bytes, its descriptor says %d", d, len(body), desc.Size)
	}
	return w.l.putManifest(w, registry, repository, d, body)
}

// Add lists img in the bundle at Commit; its manifest was stored with Manifest. Two images of
// one Writer under the same name must name the same manifest: an error otherwise.
func (w *Writer) Add(img Image) error {
	if _, err := reference.ParseNormalizedNamed(img.Name()); err != nil {
		return fmt.Errorf("image %s: not a reference: %w", img.Name(), err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	name := img.Name()
	if prev, ok := w.names[name]; ok {
		if prev != digest.Digest(img.Manifest.Digest.String()) {
			return fmt.Errorf("image %s: named twice, as %s and as %s: a bundle lists one manifest per name", name, prev, img.Manifest.Digest)
		}
		return nil
	}
	w.names[name] = digest.Digest(img.Manifest.Digest.String())
	w.images = append(w.images, img)
	return nil
}

// Commit makes every image added visible, after fsyncing the directories blobs went into: the
// OCI layout's index.json, or the Talos tree's manifests. It is the Writer's last write; an
// error leaves the bundle as it was before (a new one without index.json or manifests/).
func (w *Writer) Commit() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return errors.New("bundle: Commit after Close")
	}
	for _, p := range slices.Sorted(maps.Keys(w.synced)) {
		if err := syncDir(p); err != nil {
			return fmt.Errorf("bundle %s: %w", w.dir, err)
		}
	}
	if err := w.l.commit(w, w.images); err != nil {
		return fmt.Errorf("bundle %s: %w", w.dir, err)
	}
	return nil
}

// Close removes the work directory (temporary files, manifests staged and not committed) and
// releases DIR. Blobs already placed stay, for the next run.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	w.done = true
	err := os.RemoveAll(w.work)
	// Unlock explicitly: a child process forked meanwhile (and not yet exec'ed) shares the
	// open file description, and closing ours alone would not release the lock.
	if uerr := unix.Flock(int(w.lock.Fd()), unix.LOCK_UN); err == nil {
		err = uerr
	}
	if cerr := w.lock.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bundle %s: close: %w", w.dir, err)
	}
	return nil
}

// writeFileAtomic writes b to p (mode 0644, directories 0755) through a temporary file in the
// work directory, fsynced, then renamed over p.
func (w *Writer) writeFileAtomic(p string, b []byte) error {
	return atomicfile.Write(p, b, atomicfile.Options{TempDir: w.work, Perm: 0o644, DirPerm: 0o755})
}

// syncDir fsyncs directory p, so the entries renamed into it survive a crash.
func syncDir(p string) error {
	d, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("sync %s: %w", p, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", p, err)
	}
	return nil
}
