package mirror

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// blobStore serves a repository's blobs: from local storage when this repository holds a link to
// the blob (distribution's per-repository links: fetched from, or verified with, this upstream
// repository), else through a fill from the upstream that streams to the client at once.
type blobStore struct {
	distribution.BlobStore
	r *repository
}

func (b *blobStore) fillKey(dgst digest.Digest) string {
	return b.r.up.Name + "/" + b.r.repo + "@" + dgst.String()
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
	if f := b.r.m.fills.get(b.fillKey(dgst)); f != nil {
		return f.desc, nil
	}
	return b.r.remoteBlobStat(ctx, dgst)
}

// remoteBlobStat HEADs the blob at the upstream (never downloading it); concurrent requests share
// one HEAD.
func (r *repository) remoteBlobStat(ctx context.Context, dgst digest.Digest) (v1.Descriptor, error) {
	v, err, _ := r.m.flight.Do("blobstat\x00"+r.up.Name+"\x00"+r.repo+"\x00"+dgst.String(), func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.m.opts.UpstreamTimeout)
		defer cancel()
		start := time.Now()
		resp, err := r.up.client.do(ctx, http.MethodHead, r.repo, "blobs", dgst.String(), nil, http.StatusOK)
		r.m.metrics.observeUpstream(r.up.Name, kindBlob, start, err)
		if err != nil {
			return nil, err
		}
		_ = resp.Body.Close()
		if resp.ContentLength < 0 {
			return nil, &upstreamError{Upstream: r.up.Name, Op: "HEAD blob " + dgst.String(), Err: errors.New("no Content-Length in the answer")}
		}
		return v1.Descriptor{Digest: dgst, Size: resp.ContentLength, MediaType: "application/octet-stream"}, nil
	})
	if err != nil {
		var ue *upstreamError
		if errors.As(err, &ue) && ue.notFound() {
			return v1.Descriptor{}, distribution.ErrBlobUnknown
		}
		return v1.Descriptor{}, blobAPIError(stateFrom(ctx), err)
	}
	return v.(v1.Descriptor), nil
}

func blobAPIError(st *reqState, err error) error {
	e := upstreamAPIError(st, err)
	if ec, ok := e.(errcode.Error); ok && ec.Code == errcode.ErrorCodeManifestUnknown {
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
		st.setCache(CacheHit)
		return b.BlobStore.ServeBlob(ctx, w, r, dgst)
	}
	desc, err := b.Stat(ctx, dgst)
	if err != nil {
		return err
	}
	if st.localBlob { // stored meanwhile
		st.setCache(CacheHit)
		return b.BlobStore.ServeBlob(ctx, w, r, dgst)
	}
	setBlobHeaders(w, desc)
	if r.Method == http.MethodHead {
		// A HEAD is answered from the upstream's HEAD: nothing is downloaded for it.
		st.setCache(CacheMiss)
		w.Header().Set("Content-Length", strconv.FormatInt(desc.Size, 10))
		w.WriteHeader(http.StatusOK)
		return nil
	}
	f, joined, err := b.r.m.fills.start(b.fillKey(dgst), desc, func(f *fill) { b.r.m.runFill(f, b.r) })
	if err != nil {
		return errcode.ErrorCodeUnknown.WithMessage(err.Error())
	}
	if joined {
		st.setCache(CacheCoalesced)
	} else {
		st.setCache(CacheMiss)
	}
	return f.serve(ctx, w, r, st, b.r.m.opts.UpstreamTimeout)
}

func setBlobHeaders(w http.ResponseWriter, desc v1.Descriptor) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", desc.Digest.String())
	w.Header().Set("Etag", `"`+desc.Digest.String()+`"`)
	w.Header().Set("Cache-Control", "max-age=31536000")
}
