package mirror

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/distribution/distribution/v3/registry/api/errcode"

	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// outcome is how one registry read was answered, returned by the calls that learned it: the
// X-Nodecache-Cache value, the tier of the latest upstream answer, and how many of the bytes
// sent came from an upstream fill in flight. The access log and the metrics report it.
type outcome struct {
	// cache is a mirrorapi.Cache* value; "" when nothing said (answered locally: a hit).
	cache string
	// tier is upstream.TierShared or upstream.TierUpstream; "" when no upstream answered.
	tier string
	// upBytes is how many bytes of the response were taken from a fill in flight.
	upBytes int64
}

// and returns o followed by a later step of the same request, n: the stronger cache answer (miss
// beats revalidated and hit; stale and coalesced are never downgraded), n's tier when it has one,
// the bytes of both.
func (o outcome) and(n outcome) outcome {
	switch o.cache {
	case "":
		o.cache = n.cache
	case mirrorapi.CacheHit, mirrorapi.CacheRevalidated:
		if n.cache != "" && n.cache != mirrorapi.CacheHit {
			o.cache = n.cache
		}
	}
	if n.tier != "" {
		o.tier = n.tier
	}
	o.upBytes += n.upBytes
	return o
}

// header is the X-Nodecache-Cache value of a successful answer: a hit when nothing else was said.
func (o outcome) header() string {
	if o.cache == "" {
		return mirrorapi.CacheHit
	}
	return o.cache
}

// setCacheHeader sets X-Nodecache-Cache for a successful answer about to be written.
func setCacheHeader(w http.ResponseWriter, o outcome) {
	w.Header().Set(mirrorapi.HeaderCache, o.header())
}

// readError is a registry read's error answer in the OCI error format (distribution spec, "Error
// Codes"; distribution's errcode envelope, byte for byte as its registry writes it): sent with
// the HTTP status of its code, or with status when set (502: the upstream's answer, not this
// cache, was at fault; 508: a loop of chained nodecaches), and a 429's Retry-After.
type readError struct {
	err        errcode.Error
	status     int
	retryAfter string
}

func (e *readError) Error() string { return e.err.Error() }

// httpStatus is the status the answer is sent with.
func (e *readError) httpStatus() int {
	if e.status != 0 {
		return e.status
	}
	return e.err.Code.Descriptor().HTTPStatusCode
}

func (e *readError) write(w http.ResponseWriter) {
	status := e.httpStatus()
	w.Header().Del(mirrorapi.HeaderCache)
	if status == http.StatusTooManyRequests && e.retryAfter != "" {
		w.Header().Set("Retry-After", e.retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(mirrorapi.HeaderErrorCode, e.err.Code.String())
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errcode.Errors{e.err})
}

// codeError is the answer of code with detail (nil: none), as distribution's handlers give it.
func codeError(code errcode.ErrorCode, detail any) *readError {
	return &readError{err: code.WithDetail(detail)}
}

// nameInvalid is the answer for a repository name storage refuses.
func nameInvalid(name string, err error) *readError {
	return codeError(errcode.ErrorCodeNameInvalid, map[string]string{"name": name, "reason": err.Error()})
}

// asReadError is err as the client's answer: a *readError as it is, an errcode.Error with its
// code, anything else 500 UNKNOWN with err as detail (distribution's rule for errors its
// handlers do not know).
func asReadError(err error) *readError {
	var (
		re *readError
		ec errcode.Error
	)
	switch {
	case errors.As(err, &re):
		return re
	case errors.As(err, &ec):
		return &readError{err: ec}
	}
	return codeError(errcode.ErrorCodeUnknown, err)
}

// upstreamAPIError turns an upstream failure with nothing cached into the client's answer:
// 400 MANIFEST_INVALID for schema 1, 429 with the upstream's Retry-After, 404 for an
// authoritative not-found, 401/403 DENIED, 502 UNKNOWN naming what the upstream's answer did
// wrong (a redirect or realm the address guard refused, a blob of unstated size past its bound,
// bytes that do not match the digest asked for, a manifest over 4 MiB, a body that is not a
// manifest, a blob body that keeps ending early, a 206 for another range), 508 for a loop of chained nodecaches, 503 for an upstream that is unreachable, timed
// out or failing (issue 23: one status code per cause).
func upstreamAPIError(err error) *readError {
	var (
		ue *upstream.Error
		re *readError
		ec errcode.Error
	)
	switch {
	case errors.Is(err, upstream.ErrSchema1):
		return &readError{err: errcode.ErrorCodeManifestInvalid.WithMessage(err.Error())} // ends "schema 1 manifests are not supported"
	case errors.As(err, &re):
		return re // already the client's answer (e.g. MANIFEST_INVALID from storing)
	case errors.As(err, &ec):
		return &readError{err: ec}
	case errors.Is(err, upstream.ErrUnsafeTarget), errors.Is(err, upstream.ErrUnknownSizeTooLarge),
		errors.Is(err, upstream.ErrDigestMismatch), errors.Is(err, upstream.ErrManifestTooLarge),
		errors.Is(err, upstream.ErrNotManifest), errors.Is(err, upstream.ErrBadRange), errors.Is(err, upstream.ErrShortBody):
		return badGateway(err) // the upstream's answer was wrong: not a failing upstream (503)
	}
	if errors.As(err, &ue) {
		switch {
		case ue.Status == http.StatusTooManyRequests:
			return &readError{err: errcode.ErrorCodeTooManyRequests.WithMessage(ue.Error()), retryAfter: ue.RetryAfter}
		case ue.Status == http.StatusNotFound:
			return &readError{err: errcode.ErrorCodeManifestUnknown.WithMessage(ue.Error())}
		case ue.Status == http.StatusUnauthorized || ue.Status == http.StatusForbidden:
			return &readError{err: errcode.ErrorCodeDenied.WithMessage(ue.Error())}
		case ue.Status == http.StatusLoopDetected:
			return &readError{status: http.StatusLoopDetected, err: errcode.ErrorCodeUnknown.WithMessage(
				ue.Error() + ": the request went round a loop of chained nodecaches (check --chain and --upstream URLs)")}
		}
	}
	return &readError{err: errcode.ErrorCodeUnavailable.WithMessage(err.Error())}
}

// badGateway is a 502 UNKNOWN naming what the upstream's answer did wrong.
func badGateway(err error) *readError {
	return &readError{status: http.StatusBadGateway, err: errcode.ErrorCodeUnknown.WithMessage(err.Error())}
}

// blobAPIError is upstreamAPIError for a blob: BLOB_UNKNOWN where a manifest would be
// MANIFEST_UNKNOWN.
func blobAPIError(err error) *readError {
	e := upstreamAPIError(err)
	if e.err.Code == errcode.ErrorCodeManifestUnknown {
		return &readError{err: errcode.ErrorCodeBlobUnknown.WithMessage(e.err.Message)}
	}
	return e
}
