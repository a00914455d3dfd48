package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// Errors of Mirror.Pin and Mirror.Unpin (errors.Is).
var (
	// ErrPinSpec: the upstream is not configured here, or the repository, tag or digest is not
	// one (the message says which, and what is accepted). HTTP 400.
	ErrPinSpec = errors.New("invalid pin")
	// ErrNotCached: the cache holds no manifest under that tag or digest; nothing is fetched
	// for a pin (nodecache warm --pin fetches, then pins). HTTP 404.
	ErrNotCached = cache.ErrNotCached
	// ErrNotPinned: Unpin of a tag or digest nothing is pinned by. HTTP 404.
	ErrNotPinned = cache.ErrNotPinned
	// ErrPinLimit: the pin would take the pinned bytes above 80% of --max-size (the message
	// names the cap). HTTP 409.
	ErrPinLimit = cache.ErrPinLimit
	// ErrCacheNotReady: the cache index is being loaded or rebuilt; try again shortly. HTTP 503.
	ErrCacheNotReady = cache.ErrNotReady
)

// tagRe is a tag (OCI distribution spec, "Pulling manifests").
var tagRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// Pin pins what the cache holds of the image that ref names in repository of the configured
// upstream upstream (a name, alias or path alias, as ?ns= takes it; a one-component Docker Hub
// repository is library/<name>): ref is a tag (the pin follows the tag: the image a revalidation
// moves it to is pinned too, and the old one released once the new one is complete) or a
// digest (of an image, or of a child manifest of a cached index, which then holds the index).
// Pinned images are never evicted (--max-size, a full disk, DELETE): issue 24. Nothing is
// fetched; the pins file is written before it returns. Pinning what is already pinned returns
// the pin as it is.
//
// Errors: ErrPinSpec (a bad upstream, repository or reference), ErrNotCached, ErrPinLimit (the
// message names the cap), ErrCacheNotReady, ctx's, and a failed write of the pins file (the pin
// is then not kept).
func (m *Mirror) Pin(ctx context.Context, upstream, repository, ref string) (mirrorapi.Pin, error) {
	sr, tag, d, err := m.pinTarget(ctx, upstream, repository, ref)
	if err != nil {
		return mirrorapi.Pin{}, err
	}
	p, _, err := m.cache.Pin(ctx, sr, tag, d)
	if errors.Is(err, cache.ErrNotCached) {
		what := d.String()
		if tag != "" {
			what = "tagged " + tag
		}
		return mirrorapi.Pin{}, fmt.Errorf("%w: %s: the cache holds no manifest %s; nothing is fetched for a pin: pull it through the cache first, or warm and pin it with nodecache warm --pin",
			cache.ErrNotCached, pinName(upstream, repository, ref), what)
	}
	if err != nil {
		return mirrorapi.Pin{}, fmt.Errorf("pin %s: %w", pinName(upstream, repository, ref), err)
	}
	return m.apiPin(p), nil
}

// Unpin drops the pin of ref (a tag or a digest, as it was pinned) in repository of upstream
// (as Pin takes them): what it held is evicted again like anything else, least recently pulled
// first. It returns the pin dropped.
//
// Errors: ErrPinSpec, ErrNotPinned (the message names the pins that hold the image ref names,
// when there are), ErrCacheNotReady, ctx's, and a failed write of the pins file (the pin then
// stays).
func (m *Mirror) Unpin(ctx context.Context, upstream, repository, ref string) (mirrorapi.Pin, error) {
	sr, tag, d, err := m.pinTarget(ctx, upstream, repository, ref)
	if err != nil {
		return mirrorapi.Pin{}, err
	}
	p, err := m.cache.Unpin(sr, tag, d)
	if errors.Is(err, cache.ErrNotPinned) {
		msg := pinName(upstream, repository, ref) + ": nothing is pinned by this tag"
		if d != "" {
			msg = pinName(upstream, repository, ref) + ": nothing is pinned by this digest"
			if held := m.cache.PinsOf(sr, d); len(held) > 0 {
				msg += "; the image is held by " + m.pinNames(held) + ": unpin that"
			}
		}
		return mirrorapi.Pin{}, fmt.Errorf("%w: %s", cache.ErrNotPinned, msg)
	}
	if err != nil {
		return mirrorapi.Pin{}, fmt.Errorf("unpin %s: %w", pinName(upstream, repository, ref), err)
	}
	return m.apiPin(p), nil
}

// Pins returns the pins (mirrorapi.PinList).
func (m *Mirror) Pins() mirrorapi.PinList {
	out := mirrorapi.PinList{PinnedBytes: m.cache.PinnedBytes(), MaxSizeBytes: m.cache.MaxSize(), Pins: []mirrorapi.Pin{}}
	for _, p := range m.cache.Pins() {
		out.Pins = append(out.Pins, m.apiPin(p))
	}
	return out
}

// pinTarget resolves a pin's upstream, repository and reference to its storage repository and
// its tag or digest. Errors: ErrPinSpec, naming what is wrong; ctx's.
func (m *Mirror) pinTarget(ctx context.Context, upstream, repository, ref string) (sr, tag string, d digest.Digest, err error) {
	if err := ctx.Err(); err != nil {
		return "", "", "", err
	}
	up := m.configuredAs(upstream)
	if up == nil {
		return "", "", "", fmt.Errorf("%w: upstream %q is not configured here (configured: %s): want UPSTREAM/REPOSITORY:TAG or UPSTREAM/REPOSITORY@DIGEST as cache ls lists it, e.g. docker.io/library/alpine:3.20",
			ErrPinSpec, upstream, m.upstreamList())
	}
	repo := repository
	if name.Canonical(up.Name) == name.DockerHub && !strings.Contains(repo, "/") {
		repo = "library/" + repo
	}
	if !routeNameRe.MatchString(repo) {
		return "", "", "", fmt.Errorf("%w: repository %q: want lower-case path components such as library/alpine", ErrPinSpec, repository)
	}
	sr = up.storageKey + "/" + repo
	if _, err := reference.WithName(sr); err != nil {
		return "", "", "", fmt.Errorf("%w: repository %q: %w", ErrPinSpec, repository, err)
	}
	switch {
	case strings.Contains(ref, ":"):
		if d, err = digest.Parse(ref); err != nil {
			return "", "", "", fmt.Errorf("%w: digest %q: %w (want algorithm:hex, e.g. sha256:<64 hex digits>)", ErrPinSpec, ref, err)
		}
	case tagRe.MatchString(ref):
		tag = ref
	default:
		return "", "", "", fmt.Errorf("%w: tag %q: a tag is [A-Za-z0-9_][A-Za-z0-9._-]{0,127}", ErrPinSpec, ref)
	}
	return sr, tag, d, nil
}

// apiPin is p as the API answers it, its storage repository named by its upstream.
func (m *Mirror) apiPin(p cache.Pin) mirrorapi.Pin {
	key, repo, _ := strings.Cut(p.Repo, "/")
	out := mirrorapi.Pin{Repository: repo, Tag: p.Tag, Digest: p.Digest.String(), Next: p.Next.String(),
		Pinned: p.Pinned.UTC(), SizeBytes: m.cache.PinBytes(p)}
	if up := m.byKey[key]; up != nil {
		out.Upstream = up.Name
	}
	return out
}

// pinNames names pins as cache pin and unpin take them, comma-separated.
func (m *Mirror) pinNames(pins []cache.Pin) string {
	names := make([]string, len(pins))
	for i, p := range pins {
		a := m.apiPin(p)
		ref := a.Digest
		if a.Tag != "" {
			ref = a.Tag
		}
		names[i] = pinName(a.Upstream, a.Repository, ref)
	}
	return strings.Join(names, ", ")
}

// pinName is UPSTREAM/REPOSITORY:TAG or UPSTREAM/REPOSITORY@DIGEST.
func pinName(upstream, repository, ref string) string {
	if strings.Contains(ref, ":") {
		return upstream + "/" + repository + "@" + ref
	}
	return upstream + "/" + repository + ":" + ref
}

// servePins answers mirrorapi.CachePinsPath (loopback and --allow networks): GET lists the pins,
// PUT …/<upstream>/<repository>(:<tag>|@<digest>) pins, DELETE unpins.
func (m *Mirror) servePins(w http.ResponseWriter, r *http.Request) {
	if !m.clients.allowed(r.RemoteAddr) {
		m.metrics.refused.WithLabelValues(RefusedAllow).Inc()
		writeJSONError(w, http.StatusForbidden, "pins are accepted from loopback and the --allow networks only (serve --allow CIDR)")
		return
	}
	spec, hasSpec := strings.CutPrefix(r.URL.Path, mirrorapi.CachePinsPath+"/")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == mirrorapi.CachePinsPath:
		if !m.cache.Ready() {
			writeJSONError(w, http.StatusServiceUnavailable, "the cache index is being loaded or rebuilt from storage; try again shortly")
			return
		}
		_ = json.NewEncoder(w).Encode(m.Pins())
		return
	case hasSpec && (r.Method == http.MethodPut || r.Method == http.MethodDelete):
	default:
		w.Header().Set("Allow", "GET, PUT, DELETE")
		writeJSONError(w, http.StatusMethodNotAllowed, "want GET "+mirrorapi.CachePinsPath+", or PUT or DELETE "+mirrorapi.CachePinsPath+"/<upstream>/<repository>:<tag> (or @<digest>)")
		return
	}
	upName, rest, ok := strings.Cut(spec, "/")
	repo, ref, okRef := splitPinRef(rest)
	if !ok || !okRef || upName == "" {
		writeJSONError(w, http.StatusBadRequest, "want "+mirrorapi.CachePinsPath+"/<upstream>/<repository>:<tag> or …/<repository>@<digest>, e.g. …/docker.io/library/alpine:3.20")
		return
	}
	var (
		p   mirrorapi.Pin
		err error
	)
	if r.Method == http.MethodPut {
		p, err = m.Pin(r.Context(), upName, repo, ref)
	} else {
		p, err = m.Unpin(r.Context(), upName, repo, ref)
	}
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrPinSpec):
			code = http.StatusBadRequest
		case errors.Is(err, ErrNotCached), errors.Is(err, ErrNotPinned):
			code = http.StatusNotFound
		case errors.Is(err, ErrPinLimit):
			code = http.StatusConflict
		case errors.Is(err, ErrCacheNotReady):
			code = http.StatusServiceUnavailable
		}
		writeJSONError(w, code, err.Error())
		return
	}
	msg := "pinned on request"
	if r.Method == http.MethodDelete {
		msg = "unpinned on request"
	}
	m.log.Info().Str("upstream", p.Upstream).Str("repository", p.Repository).Str("tag", p.Tag).
		Str("digest", p.Digest).Str("client", r.RemoteAddr).Msg(msg)
	_ = json.NewEncoder(w).Encode(p)
}

// splitPinRef splits "<repository>:<tag>" or "<repository>@<digest>"; ok is false when neither.
func splitPinRef(s string) (repo, ref string, ok bool) {
	if repo, d, found := strings.Cut(s, "@"); found {
		return repo, d, repo != "" && d != ""
	}
	i := strings.LastIndex(s, ":")
	if i <= 0 || strings.Contains(s[i:], "/") || i == len(s)-1 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}
