package mirror

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// serveBlob answers GET and HEAD /v2/<name>/blobs/<digest> (OCI distribution spec, "Pulling
// blobs"): from storage when this repository holds a link to the blob (distribution's
// per-repository links: fetched from, or verified with, this upstream repository: "hit"), else
// through a fill from the upstream that streams to the client at once ("miss", or "coalesced"
// when it joined a fill in flight). A HEAD of a blob not stored is answered from what the
// upstream says of it: nothing is downloaded for it.
//
// Errors: a *readError, nothing written (400 DIGEST_INVALID, 404 BLOB_UNKNOWN, the upstream's
// failure as blobAPIError answers it); an error wrapping upstream.ErrBroken when the transfer
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
	blobs := r.local.Blobs(ctx)
	if desc, err := blobs.Stat(ctx, dgst); err == nil { // the repository's link: the per-repository rule
		if _, _, peerRead := upstream.PeerRequest(ctx); peerRead {
			r.cache.ReadByPeer(dgst) // a member's read counts as a pull
		}
		out := outcome{cache: mirrorapi.CacheHit}
		setCacheHeader(w, out)
		return out, r.serveLocal(ctx, blobs, w, req, desc)
	} else if !errors.Is(err, distribution.ErrBlobUnknown) {
		return outcome{}, asReadError(err)
	}
	if cacheOnly(ctx) {
		return outcome{}, codeError(errcode.ErrorCodeBlobUnknown, dgst)
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
// upstream.Remote.BlobStat).
//
// Errors: 404 BLOB_UNKNOWN for a blob the upstream does not have; else the upstream's failure as
// blobAPIError answers it.
func (r *repository) remoteBlob(ctx context.Context, dgst digest.Digest, head bool) (v1.Descriptor, string, error) {
	if f := r.up.remote.Filling(r.repo, dgst); f != nil {
		return f.Desc(), f.Tier(), nil
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
// ("coalesced"), streamed as it arrives.
func (r *repository) fillBlob(ctx context.Context, w http.ResponseWriter, req *http.Request, desc v1.Descriptor) (outcome, error) {
	f, joined, err := r.up.remote.StartFill(ctx, r.repo, desc, r.commitBlob)
	if err != nil {
		return outcome{}, &readError{err: errcode.ErrorCodeUnknown.WithMessage(err.Error())}
	}
	out := outcome{cache: mirrorapi.CacheMiss}
	if joined {
		out.cache = mirrorapi.CacheCoalesced
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
		return out, blobAPIError(err)
	}
	return out, nil
}

// serveLocal serves a blob stored and linked in this repository; eviction leaves its data alone
// meanwhile.
//
// Errors: distribution's blob store's, as asReadError answers them (nothing written).
func (r *repository) serveLocal(ctx context.Context, blobs distribution.BlobStore, w http.ResponseWriter, req *http.Request, desc v1.Descriptor) error {
	release := r.cache.Acquire(desc.Digest)
	defer release()
	if r.serveFile(w, req, desc) {
		return nil
	}
	if err := blobs.ServeBlob(ctx, w, req, desc.Digest); err != nil {
		return asReadError(err)
	}
	return nil
}

// serveFile serves blob desc, linked into this repository (serveBlob's Stat), from its data file
// on filesystem storage:
// the file as an *os.File through http.ServeContent (Range, HEAD, conditional requests and 416
// are its), so that net/http hands the file to the kernel (sendfile) instead of distribution's
// buffered reader making 32 KiB writes. The headers are those distribution's blob
// server sets (registry/storage linkedblobstore.go and blobserver.go, v3.1.2): Content-Type
// (the descriptor's media type), ETag, Cache-Control, Docker-Content-Digest, Content-Length.
// It reports false, having written nothing, when the storage is not local files (s3, memory) or
// the data file cannot be opened with the descriptor's size (evicted meanwhile); the caller lets
// distribution serve it (or answer with its error).
func (r *repository) serveFile(w http.ResponseWriter, req *http.Request, desc v1.Descriptor) bool {
	root := r.cache.FilesystemRoot()
	if root == "" {
		return false
	}
	f, err := os.Open(filepath.Join(root, filepath.FromSlash(cache.BlobDataPath(desc.Digest))))
	if err != nil {
		return false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != desc.Size {
		return false
	}
	h := w.Header()
	// Set even when empty, as distribution does: a present Content-Type keeps ServeContent from
	// sniffing the body. Content-Length is ServeContent's (the range's size on a 206).
	h.Set("Content-Type", desc.MediaType)
	h.Set("ETag", `"`+desc.Digest.String()+`"`)
	h.Set("Cache-Control", "max-age=31536000")
	if h.Get("Docker-Content-Digest") == "" {
		h.Set("Docker-Content-Digest", desc.Digest.String())
	}
	http.ServeContent(w, req, desc.Digest.String(), time.Time{}, f)
	return true
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
		return r.cache.CommitBlob(r.storageName(), desc.Digest, desc.Size, func() error { return nil })
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
	err = r.cache.CommitBlob(r.storageName(), desc.Digest, desc.Size, func() error {
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
