package mirror

import (
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

// blobStore serves a repository's blobs: from local storage when this repository holds a link to
// the blob (distribution's per-repository links: fetched from, or verified with, this upstream
// repository), else through a fill from the upstream that streams to the client at once.
type blobStore struct {
	distribution.BlobStore
	r *repository
}

func (b *blobStore) Stat(ctx context.Context, dgst digest.Digest) (v1.Descriptor, error) {
	st := stateFrom(ctx)
	desc, err := b.BlobStore.Stat(ctx, dgst)
	if err == nil {
		st.mu.Lock()
		st.localBlob = true
		st.mu.Unlock()
		return desc, nil
	}
	if !errors.Is(err, distribution.ErrBlobUnknown) {
		return v1.Descriptor{}, err
	}
	if f := b.r.up.remote.Filling(b.r.repo, dgst); f != nil {
		if t := f.Tier(); t != "" {
			st.setTier(t)
		}
		return f.Desc(), nil
	}
	st.mu.Lock()
	known, head := st.remoteBlob, st.head
	st.mu.Unlock()
	if known != nil && known.Digest == dgst {
		return *known, nil
	}
	desc, err = b.r.up.remote.BlobStat(ctx, b.r.repo, dgst, head)
	if err == nil {
		st.mu.Lock()
		st.remoteBlob = &desc
		st.mu.Unlock()
	}
	if err != nil {
		var ue *upstream.Error
		if errors.As(err, &ue) && ue.NotFound() {
			return v1.Descriptor{}, distribution.ErrBlobUnknown
		}
		return v1.Descriptor{}, blobAPIError(st, err)
	}
	return desc, nil
}

func blobAPIError(st *reqState, err error) error {
	e := upstreamAPIError(st, err)
	var ec errcode.Error
	if errors.As(e, &ec) && ec.Code == errcode.ErrorCodeManifestUnknown {
		return errcode.ErrorCodeBlobUnknown.WithMessage(ec.Message)
	}
	return e
}

func (b *blobStore) ServeBlob(ctx context.Context, w http.ResponseWriter, r *http.Request, dgst digest.Digest) error {
	st := stateFrom(ctx)
	st.mu.Lock()
	local := st.localBlob
	st.mu.Unlock()
	if local {
		st.setCache(mirrorapi.CacheHit)
		return b.serveLocal(ctx, w, r, dgst)
	}
	desc, err := b.Stat(ctx, dgst)
	if err != nil {
		return err
	}
	if st.localBlob { // stored meanwhile
		st.setCache(mirrorapi.CacheHit)
		return b.serveLocal(ctx, w, r, dgst)
	}
	setBlobHeaders(w, desc)
	if r.Method == http.MethodHead {
		// A HEAD is answered from what the upstream said of the blob: nothing is downloaded
		// for it. Range is answered as for a cached blob (206, or 416).
		st.setCache(mirrorapi.CacheMiss)
		if desc.Size < 0 {
			w.WriteHeader(http.StatusOK)
			return nil
		}
		http.ServeContent(w, r, "", time.Time{}, io.NewSectionReader(zeroes{}, 0, desc.Size))
		return nil
	}
	f, joined, err := b.r.up.remote.StartFill(ctx, b.r.repo, desc, b.r.commitBlob)
	if err != nil {
		return errcode.ErrorCodeUnknown.WithMessage(err.Error())
	}
	if joined {
		st.setCache(mirrorapi.CacheCoalesced)
	} else {
		st.setCache(mirrorapi.CacheMiss)
	}
	n, err := f.Serve(ctx, w, r)
	st.mu.Lock()
	st.upBytes += n
	if t := f.Tier(); t != "" {
		st.tier = t
	}
	st.mu.Unlock()
	switch {
	case errors.Is(err, upstream.ErrBroken):
		// Headers and part of the body are out: abort the connection so the short body is
		// seen as the broken transfer it is.
		panic(http.ErrAbortHandler)
	case err != nil:
		// Nothing was sent yet: answer with the upstream's error instead of a broken 200, with
		// none of the blob's headers.
		for _, k := range []string{"Docker-Content-Digest", "Etag", "Cache-Control", "Content-Type", "Content-Length"} {
			w.Header().Del(k)
		}
		return blobAPIError(st, err)
	}
	return nil
}

// serveLocal serves a stored blob; eviction leaves its data alone meanwhile.
func (b *blobStore) serveLocal(ctx context.Context, w http.ResponseWriter, r *http.Request, dgst digest.Digest) error {
	release := b.r.cache.Acquire(dgst)
	defer release()
	if b.serveFile(ctx, w, r, dgst) {
		return nil
	}
	return b.BlobStore.ServeBlob(ctx, w, r, dgst)
}

// serveFile serves a blob linked into this repository from its data file on filesystem storage:
// the file as an *os.File through http.ServeContent (Range, HEAD, conditional requests and 416
// are its), written to the request's own response writer, so that net/http hands the file to the
// kernel (sendfile) instead of distribution's buffered reader making 32 KiB writes through its
// response-writer wrapper, which hides io.ReaderFrom. The headers are those distribution's blob
// server sets (registry/storage linkedblobstore.go and blobserver.go, v3.1.2): Content-Type
// (the descriptor's media type), ETag, Cache-Control, Docker-Content-Digest, Content-Length.
// It reports false, having written nothing, when the storage is not local files (s3, memory),
// the blob is not linked in this repository (distribution then answers with its error) or its
// data file cannot be opened with the descriptor's size; the caller lets distribution serve it.
func (b *blobStore) serveFile(ctx context.Context, w http.ResponseWriter, r *http.Request, dgst digest.Digest) bool {
	root := b.r.cache.FilesystemRoot()
	if root == "" {
		return false
	}
	desc, err := b.BlobStore.Stat(ctx, dgst) // the repository's link: the per-repository rule
	if err != nil {
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
	out := w
	st := stateFrom(ctx)
	if st.w != nil {
		out = st.w
	}
	h := out.Header()
	// Set even when empty, as distribution does: a present Content-Type keeps ServeContent from
	// sniffing the body. Content-Length is ServeContent's (the range's size on a 206).
	h.Set("Content-Type", desc.MediaType)
	h.Set("ETag", `"`+desc.Digest.String()+`"`)
	h.Set("Cache-Control", "max-age=31536000")
	if h.Get("Docker-Content-Digest") == "" {
		h.Set("Docker-Content-Digest", desc.Digest.String())
	}
	http.ServeContent(out, r, desc.Digest.String(), time.Time{}, f)
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
