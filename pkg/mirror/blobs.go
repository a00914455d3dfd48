package mirror

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/internal/filestamp"
	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// serveBlob answers GET and HEAD /v2/<name>/blobs/<digest> (OCI distribution spec, "Pulling
// blobs"): from storage when this repository holds a link to the blob (distribution's
// per-repository links: fetched from, or verified with, this upstream repository: "hit"), else
// through a fill from the upstream that streams to the client at once ("miss", or "coalesced"
// when it joined a fill in flight). A HEAD of a blob not stored is answered from what the
// upstream says of it: nothing is downloaded for it. A GET that joined a fill that was over
// before it read it (upstream.ErrFillGone) is answered again, from storage or through a new fill.
//
// Errors: a *readError, nothing written (400 DIGEST_INVALID, 404 BLOB_UNKNOWN: also at once for
// an offline upstream's blob not stored, offline.go; the upstream's failure as blobAPIError
// answers it); an error wrapping upstream.ErrBroken when the transfer
// broke after the headers went out (the caller aborts the connection, so the short body is seen
// as the broken transfer it is).
func (r *repository) serveBlob(ctx context.Context, w http.ResponseWriter, req *http.Request, ref string) (outcome, error) {
	dgst, err := digest.Parse(ref)
	if err != nil {
		return outcome{}, codeError(errcode.ErrorCodeDigestInvalid, err)
	}
	if content, ok := knownBlobs[dgst]; ok {
		return serveKnown(w, req, dgst, content), nil
	}
	for attempt := 1; ; attempt++ {
		out, err := r.serveBlobOnce(ctx, w, req, dgst)
		if !errors.Is(err, upstream.ErrFillGone) {
			return out, err
		}
		if attempt == fillGoneAttempts {
			return out, blobAPIError(err)
		}
		r.log.Debug().Str("repository", r.repo).Str("digest", dgst.String()).
			Msg("the fill this request joined was over before it read it; answered again")
	}
}

// fillGoneAttempts bounds how many times serveBlob answers a request whose fill was over before
// it read it (upstream.ErrFillGone): again, the blob is stored (a hit) or a new fill starts, which
// would have to end before its own request reads it for a third attempt.
const fillGoneAttempts = 3

// serveBlobOnce is serveBlob for blob dgst, not a known one, with its errors, and
// upstream.ErrFillGone (nothing written) when the fill it joined was over before it read it.
func (r *repository) serveBlobOnce(ctx context.Context, w http.ResponseWriter, req *http.Request, dgst digest.Digest) (outcome, error) {
	blobs := r.local.Blobs(ctx)
	if desc, err := blobs.Stat(ctx, dgst); err == nil { // the repository's link: the per-repository rule
		if _, _, peerRead := upstream.PeerRequest(ctx); peerRead {
			r.cache.ReadByPeer(dgst) // a member's read counts as a pull
		}
		out := outcome{cache: mirrorapi.CacheHit}
		setCacheHeader(w, out)
		if err := r.serveLocal(ctx, blobs, w, req, desc); !errors.Is(err, errDamaged) {
			return out, err
		}
		// Damaged on disk and evicted, nothing written: answered as if it had never been
		// stored, through a fill that stores it again.
	} else if !errors.Is(err, distribution.ErrBlobUnknown) {
		return outcome{}, asReadError(err)
	}
	if cacheOnly(ctx) {
		return outcome{}, codeError(errcode.ErrorCodeBlobUnknown, dgst)
	}
	if r.up.Offline {
		return outcome{}, r.offlineMiss(errcode.ErrorCodeBlobUnknown, "blob "+dgst.String()+" of "+r.repo)
	}
	desc, tier, err := r.remoteBlob(ctx, dgst, req.Method == http.MethodHead)
	if err != nil {
		return outcome{tier: tier}, err
	}
	if req.Method == http.MethodHead {
		// Range is answered as for a stored blob (206, or 416).
		out := outcome{cache: mirrorapi.CacheMiss, tier: tier}
		setBlobHeaders(w, desc)
		setCacheHeader(w, out)
		if desc.Size < 0 {
			w.WriteHeader(http.StatusOK)
			return out, nil
		}
		http.ServeContent(w, req, "", time.Time{}, io.NewSectionReader(zeroes{}, 0, desc.Size))
		return out, nil
	}
	return r.fillBlob(ctx, w, req, desc)
}

// knownBlobs are blobs answered from their digest alone, in any repository and without asking
// the upstream (the one exception to the rule that a blob is served through its repository's
// link): the empty blob, and the OCI empty JSON "{}" that most OCI 1.1 artifacts carry as their
// config (OCI image spec, "Guidance for an Empty Descriptor"). Both are known to every client by
// heart; asking an upstream for them only adds a way to fail.
var knownBlobs = map[digest.Digest][]byte{
	digest.FromBytes(nil):          {},
	digest.FromBytes([]byte("{}")): []byte("{}"),
}

// serveKnown answers a GET or HEAD of a known blob (Range, conditional requests and 416 are
// http.ServeContent's), with the headers of any blob.
func serveKnown(w http.ResponseWriter, req *http.Request, d digest.Digest, content []byte) outcome {
	out := outcome{cache: mirrorapi.CacheHit}
	setBlobHeaders(w, v1.Descriptor{Digest: d, Size: int64(len(content))})
	setCacheHeader(w, out)
	http.ServeContent(w, req, "", time.Time{}, bytes.NewReader(content))
	return out
}

// remoteBlob is what the upstream says of blob dgst, or the fill of it in flight says, and the
// tier that answered. With head, a size the HEAD did not state is probed (see
// upstream.Remote.BlobStat), and a fill in flight answers only with a size the upstream's HEAD
// stated: a size only the fill's GET gave is unchecked until the digest is (a short 200 looks
// whole until then), so the HEAD asks the upstream itself.
//
// Errors: 404 BLOB_UNKNOWN for a blob the upstream does not have; else the upstream's failure as
// blobAPIError answers it.
func (r *repository) remoteBlob(ctx context.Context, dgst digest.Digest, head bool) (v1.Descriptor, string, error) {
	if f := r.up.remote.Filling(r.repo, dgst); f != nil {
		if !head {
			return f.Desc(), f.Tier(), nil
		}
		if d := f.Stated(); d.Size >= 0 {
			return d, f.Tier(), nil
		}
	}
	desc, tier, err := r.up.remote.BlobStat(ctx, r.repo, dgst, head)
	if err != nil {
		var ue *upstream.Error
		if errors.As(err, &ue) && ue.NotFound() {
			return v1.Descriptor{}, tier, codeError(errcode.ErrorCodeBlobUnknown, dgst)
		}
		return v1.Descriptor{}, tier, blobAPIError(err)
	}
	return desc, tier, nil
}

// fillBlob answers a GET of blob desc through a fill: started now ("miss") or joined
// ("coalesced"), streamed as it arrives. Its error is upstream.ErrFillGone, nothing written, when
// the fill was over before the request read it.
func (r *repository) fillBlob(ctx context.Context, w http.ResponseWriter, req *http.Request, desc v1.Descriptor) (outcome, error) {
	f, joined, err := r.up.remote.StartFill(ctx, r.repo, desc, r.commitBlob)
	if err != nil {
		return outcome{}, &readError{err: errcode.ErrorCodeUnknown.WithMessage(err.Error())}
	}
	out := outcome{cache: mirrorapi.CacheMiss}
	if joined {
		out.cache = mirrorapi.CacheCoalesced
		if r.fillJoined != nil {
			r.fillJoined()
		}
	}
	setBlobHeaders(w, desc)
	setCacheHeader(w, out)
	n, err := f.Serve(ctx, w, req)
	out.upBytes, out.tier = n, f.Tier()
	switch {
	case errors.Is(err, upstream.ErrBroken):
		return out, err
	case err != nil:
		// Nothing was sent yet: answer with the upstream's error instead of a broken 200, with
		// none of the blob's headers.
		for _, k := range []string{"Docker-Content-Digest", "Etag", "Cache-Control", "Content-Type", "Content-Length"} {
			w.Header().Del(k)
		}
		if errors.Is(err, upstream.ErrFillGone) {
			return out, err // answered again (serveBlob)
		}
		return out, blobAPIError(err)
	}
	return out, nil
}

// evictDamaged logs that the stored blob (or manifest) d, size bytes as stored, is damaged (why)
// and evicts it: its next request fetches it again. Counted as found by a serve.
func (r *repository) evictDamaged(ctx context.Context, d digest.Digest, size int64, why string) {
	r.log.Warn().Str("repository", r.repo).Str("digest", d.String()).Int64("size", size).Msg("stored content damaged, evicted: " + why)
	r.cache.EvictCorrupt(context.WithoutCancel(ctx), d, cache.FoundByServe)
}

// errDamaged is serveLocal's error for a stored blob whose data file does not have the blob's
// verified size (cache.BlobCheck), or is empty for a digest that is not of empty content: it was
// evicted before anything was written, and the request is answered as a miss.
var errDamaged = errors.New("stored blob damaged: evicted")

// serveLocal serves a blob stored and linked in this repository; eviction leaves its data alone
// meanwhile. Every serve first compares the data's size (the file's, or the object's that
// serveBlob's Stat read) with the blob's verified size, which the cache index records when a
// fill stores the blob (never read from the data itself): a mismatch is evicted at once and
// answered as a miss (errDamaged). A blob hashed in this process (a fill's commit, an earlier
// serve, a scrub) whose data file was not written since (filestamp: inode, size, mtime) is then
// served as it is, by sendfile on filesystem storage (serveFile). Any other serve (a blob's
// first after a start) is hashed as it streams, its last byte held back until the whole data is
// hashed (serveHashed): data that does not match its digest is evicted and the response cut, so
// a client never gets a complete answer with wrong bytes.
//
// Errors: errDamaged (nothing written); distribution's blob store's, as asReadError answers
// them (nothing written); an error wrapping upstream.ErrBroken when a first serve found the data
// does not match its digest after the headers went out (the caller aborts the connection).
func (r *repository) serveLocal(ctx context.Context, blobs distribution.BlobStore, w http.ResponseWriter, req *http.Request, desc v1.Descriptor) error {
	release := r.cache.Acquire(desc.Digest)
	defer release()
	check := r.cache.Check(desc.Digest)
	var (
		file  *os.File
		stamp filestamp.Stamp
	)
	if root := r.cache.FilesystemRoot(); root != "" {
		f, err := os.Open(filepath.Join(root, filepath.FromSlash(cache.BlobDataPath(desc.Digest))))
		if err == nil {
			defer f.Close()
			if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
				file, desc.Size = f, fi.Size()
				stamp, _ = filestamp.FromInfo(fi)
			}
		}
	}
	if (check.Size >= 0 && desc.Size != check.Size) || (desc.Size == 0 && desc.Digest.Algorithm().FromBytes(nil) != desc.Digest) {
		r.evictDamaged(ctx, desc.Digest, desc.Size, fmt.Sprintf("its data is not its verified size (%s)", clitext.Count(check.Size, "byte")))
		return errDamaged
	}
	if req.Method == http.MethodHead && !check.Verified && check.Size < 0 {
		// Nothing vouches for the size (the data file's own, not hashed since the start) and a
		// HEAD reads no body to cut: hash the data before its Content-Length is stated.
		if r.cache.Damaged(ctx, desc.Digest, desc.Size) {
			r.evictDamaged(ctx, desc.Digest, desc.Size, "its data does not match its digest (hashed for a HEAD)")
			return errDamaged
		}
		r.cache.Verified(r.storageName(), desc.Digest, desc.Size, stamp)
		check.Verified, check.Stamp = true, stamp
	}
	switch {
	case check.Verified && file != nil && stamp.Equal(check.Stamp):
		serveFile(w, req, desc, file)
		return nil
	case check.Verified && file == nil:
		if err := blobs.ServeBlob(ctx, w, req, desc.Digest); err != nil {
			return asReadError(err)
		}
		return nil
	case file != nil: // not hashed in this process, or its file was written since
		return r.serveHashed(ctx, w, req, desc, file, stamp)
	}
	rs, err := blobs.Open(ctx, desc.Digest)
	if err != nil {
		return asReadError(err)
	}
	defer rs.Close()
	return r.serveHashed(ctx, w, req, desc, rs, filestamp.Stamp{})
}

// setStoredBlobHeaders sets the headers distribution's blob server sets (registry/storage
// linkedblobstore.go and blobserver.go, v3.1.2): Content-Type (the descriptor's media type; set
// even when empty, as distribution does: a present Content-Type keeps http.ServeContent from
// sniffing the body), ETag, Cache-Control, Docker-Content-Digest. Content-Length is
// http.ServeContent's (the range's size on a 206).
func setStoredBlobHeaders(w http.ResponseWriter, desc v1.Descriptor) {
	h := w.Header()
	h.Set("Content-Type", desc.MediaType)
	h.Set("ETag", `"`+desc.Digest.String()+`"`)
	h.Set("Cache-Control", "max-age=31536000")
	if h.Get("Docker-Content-Digest") == "" {
		h.Set("Docker-Content-Digest", desc.Digest.String())
	}
}

// serveFile serves blob desc from its data file f on filesystem storage, through
// http.ServeContent (Range, HEAD, conditional requests and 416 are its) with the file as an
// *os.File, so that net/http hands it to the kernel (sendfile) instead of distribution's buffered
// reader making 32 KiB writes; the headers are distribution's (setStoredBlobHeaders).
func serveFile(w http.ResponseWriter, req *http.Request, desc v1.Descriptor, f *os.File) {
	setStoredBlobHeaders(w, desc)
	http.ServeContent(w, req, desc.Digest.String(), time.Time{}, f)
}

// serveHashed serves blob desc, desc.Size bytes read from src (its data file as stamp says, on
// filesystem storage), through http.ServeContent with
// distribution's headers, hashing the data as it goes (hashingReader: the bytes a Range skips
// are hashed too, and the rest after it) and holding the body's last byte back until the whole
// data is hashed (holdLastWriter). A match records the blob as verified (later serves take the
// fast path); a mismatch evicts it and withholds the last byte. A HEAD, a 304 or a 416 reads
// nothing and verifies nothing.
//
// Errors: an error wrapping upstream.ErrBroken after a mismatch (the caller aborts the
// connection: the client sees a broken transfer, never a complete answer).
func (r *repository) serveHashed(ctx context.Context, w http.ResponseWriter, req *http.Request, desc v1.Descriptor, src io.ReadSeeker, stamp filestamp.Stamp) error {
	if !desc.Digest.Algorithm().Available() {
		return codeError(errcode.ErrorCodeDigestInvalid, desc.Digest)
	}
	hr := &hashingReader{src: src, size: desc.Size, d: desc.Digest, h: desc.Digest.Algorithm().Hash()}
	hw := &holdLastWriter{ResponseWriter: w, left: -1, verify: hr.verify}
	setStoredBlobHeaders(w, desc)
	http.ServeContent(hw, req, desc.Digest.String(), time.Time{}, hr)
	switch hw.verdict {
	case verdictMatch:
		r.cache.Verified(r.storageName(), desc.Digest, desc.Size, stamp)
	case verdictMismatch:
		r.evictDamaged(ctx, desc.Digest, desc.Size, "its data does not match its digest (response cut before its last byte)")
		return fmt.Errorf("stored blob %s does not match its digest: %w", desc.Digest, upstream.ErrBroken)
	}
	return nil
}

// hashingReader is an io.ReadSeeker over a stored blob's data (src, size bytes) for
// http.ServeContent that hashes the data from its first byte as the response reads it: a seek
// forward (a Range) hashes the bytes skipped when the next Read reaches them; a seek back (a
// multipart range out of order) reads without hashing. verify hashes what was not read yet and
// compares the result with d.
type hashingReader struct {
	src    io.ReadSeeker
	size   int64
	d      digest.Digest
	h      hash.Hash
	hashed int64 // bytes hashed, from the start
	pos    int64 // where the next Read reads
	srcPos int64 // where src is
}

func (r *hashingReader) Seek(offset int64, whence int) (int64, error) {
	p := offset
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		p += r.pos
	case io.SeekEnd:
		p += r.size
	default:
		return r.pos, fmt.Errorf("seek: whence %d", whence)
	}
	if p < 0 {
		return r.pos, fmt.Errorf("seek to %d: before the start", p)
	}
	r.pos = p
	return p, nil
}

func (r *hashingReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	if r.hashed < r.pos {
		if err := r.hashTo(r.pos); err != nil {
			return 0, err
		}
	}
	if r.srcPos != r.pos {
		if _, err := r.src.Seek(r.pos, io.SeekStart); err != nil {
			return 0, err
		}
		r.srcPos = r.pos
	}
	p = p[:min(int64(len(p)), r.size-r.pos)]
	n, err := r.src.Read(p)
	if r.pos == r.hashed {
		r.h.Write(p[:n])
		r.hashed += int64(n)
	}
	r.pos += int64(n)
	r.srcPos += int64(n)
	if errors.Is(err, io.EOF) && r.pos < r.size {
		err = io.ErrUnexpectedEOF // shorter than it was a moment ago
	}
	return n, err
}

// hashTo hashes src from r.hashed up to end.
func (r *hashingReader) hashTo(end int64) error {
	if _, err := r.src.Seek(r.hashed, io.SeekStart); err != nil {
		return err
	}
	n, err := io.CopyN(r.h, r.src, end-r.hashed)
	r.hashed += n
	r.srcPos = r.hashed
	return err
}

// verify hashes the rest of the data and reports whether all of it, size bytes, hashes to d.
func (r *hashingReader) verify() bool {
	return r.hashTo(r.size) == nil && digest.NewDigest(r.d.Algorithm(), r.h) == r.d
}

// Verdicts of a holdLastWriter.
const (
	verdictNone     = iota // the body's last byte was not reached (HEAD, 304, 416, a client gone)
	verdictMatch           // the data matched: the last byte was sent
	verdictMismatch        // it did not: the last byte was withheld
)

// holdLastWriter passes a 200 or 206 body on to the client except its last byte, which it sends
// only once verify says the whole data is right (its Content-Length tells where the body ends);
// the headers of such a body are flushed at once. It hides io.ReaderFrom: every byte goes
// through Write.
type holdLastWriter struct {
	http.ResponseWriter
	verify  func() bool
	left    int64 // body bytes not written yet; -1: no body held (not 200 or 206, or no length)
	wrote   bool  // WriteHeader was called
	verdict int
}

func (w *holdLastWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if code == http.StatusOK || code == http.StatusPartialContent {
		if n, err := strconv.ParseInt(w.Header().Get("Content-Length"), 10, 64); err == nil && n > 0 {
			w.left = n
		}
	}
	w.ResponseWriter.WriteHeader(code)
	if f, ok := w.ResponseWriter.(http.Flusher); ok && w.left > 0 {
		// The headers go out now: a Range far into a large blob is hashed up to its start
		// before its first byte, and containerd gives up on headers after 30 s.
		f.Flush()
	}
}

// errWithheld is Write's error when the data did not match: the body's last byte was withheld.
var errWithheld = errors.New("stored blob does not match its digest: last byte withheld")

func (w *holdLastWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.verdict == verdictMismatch {
		return 0, errWithheld
	}
	if w.left < 0 || int64(len(p)) < w.left {
		n, err := w.ResponseWriter.Write(p)
		if w.left > 0 {
			w.left -= int64(n)
		}
		return n, err
	}
	p = p[:w.left] // the body's end: what follows is not part of it
	n, err := w.ResponseWriter.Write(p[:len(p)-1])
	w.left -= int64(n)
	if err != nil {
		return n, err
	}
	if !w.verify() {
		w.verdict = verdictMismatch
		return n, errWithheld
	}
	w.verdict = verdictMatch
	m, err := w.ResponseWriter.Write(p[len(p)-1:])
	w.left -= int64(m)
	return n + m, err
}

// commitBlob stores a verified fill's staging file as a blob linked into r's repository
// (upstream.CommitFunc). With filesystem storage the staging file (under the same root) is
// hard-linked into the blob store, so storing takes no second copy: a fill needs the blob's
// size free once. Other storage gets the file through one of distribution's uploads.
func (r *repository) commitBlob(ctx context.Context, path string, desc v1.Descriptor) error {
	err := r.cache.LinkBlob(ctx, r.storageName(), path, desc.Digest, desc.Size)
	if !errors.Is(err, cache.ErrNotFilesystem) && !errors.Is(err, syscall.EXDEV) {
		return err
	}
	// Not a filesystem root, or the staging directory is on another file system (something
	// mounted inside the root): copy it through an upload after all.
	named, err := reference.WithName(r.up.storageKey + "/" + r.repo)
	if err != nil {
		return fmt.Errorf("repository name: %w", err)
	}
	repo, err := r.store.Repository(ctx, named)
	if err != nil {
		return fmt.Errorf("open repository %s: %w", named, err)
	}
	if d, err := repo.Blobs(ctx).Stat(ctx, desc.Digest); err == nil && d.Size == desc.Size {
		// Linked meanwhile in shared storage (another replica of one bucket, the member this
		// fill streamed from): the blob is stored once, not uploaded again; only recorded.
		return r.cache.CommitBlob(ctx, r.storageName(), desc.Digest, desc.Size, func() error { return nil })
	}
	src, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open staging file: %w", err)
	}
	defer src.Close()
	bw, err := repo.Blobs(ctx).Create(ctx)
	if err != nil {
		return fmt.Errorf("create blob upload: %w", err)
	}
	if _, err := io.Copy(bw, src); err != nil {
		_ = bw.Cancel(ctx)
		if errors.Is(err, syscall.ENOSPC) {
			r.cache.DiskFull(-1)
		}
		return fmt.Errorf("write blob: %w", err)
	}
	// Data moved into the blob store and linked under the lock eviction deletes data with.
	err = r.cache.CommitBlob(ctx, r.storageName(), desc.Digest, desc.Size, func() error {
		_, err := bw.Commit(ctx, desc)
		return err
	})
	if err != nil {
		_ = bw.Cancel(ctx)
		return fmt.Errorf("commit blob: %w", err)
	}
	return nil
}

// zeroes is an io.ReaderAt of zero bytes: a HEAD answered by http.ServeContent reads nothing.
type zeroes struct{}

func (zeroes) ReadAt(p []byte, _ int64) (int, error) {
	clear(p)
	return len(p), nil
}

func setBlobHeaders(w http.ResponseWriter, desc v1.Descriptor) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", desc.Digest.String())
	w.Header().Set("Etag", `"`+desc.Digest.String()+`"`)
	w.Header().Set("Cache-Control", "max-age=31536000")
}
