package mirror

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/mirror/cache"
	"github.com/nodecache/nodecache/pkg/mirrorapi"
	"github.com/nodecache/nodecache/pkg/name"
)

// cacheView is what mirrorapi.CachePath needs of the cache: a *cache.Store.
type cacheView interface {
	// Totals are the bytes and the number of blobs stored.
	Totals() (size int64, blobs int)
	// Unreferenced are the blobs no stored manifest references and their bytes.
	Unreferenced() (blobs int, size int64)
	// Ready reports whether the index is loaded (else Totals and Images are partial).
	Ready() bool
	// Images lists the stored images, storage repositories named by name.
	Images(name func(storageRepo string) (upstream, repo string)) []mirrorapi.CachedImage
	// HasManifest reports whether manifest d is stored in storage repository repo.
	HasManifest(repo string, d digest.Digest) bool
	// Holders are the images of repo that hold manifest d as a child manifest.
	Holders(repo string, d digest.Digest) []digest.Digest
	// MaxSize is the cap in bytes (0: none).
	MaxSize() int64
	// PinnedBytes is the bytes the pins hold; PinsOf the pins that hold an image.
	PinnedBytes() int64
	PinsOf(repo string, m digest.Digest) []cache.Pin
	// EvictImage removes an image of a storage repository, returning the bytes freed.
	EvictImage(ctx context.Context, repo string, d digest.Digest, reason string) int64
	// StartVerify asks for a verify pass at rate bytes a second (0: the scrub rate), or
	// returns the one running; VerifyStatus returns the latest.
	StartVerify(rate int64) (mirrorapi.VerifyPass, error)
	VerifyStatus() (mirrorapi.VerifyPass, bool)
}

// Inventory returns the cache inventory (mirrorapi.CachePath's document).
func (m *Mirror) Inventory() mirrorapi.CacheInventory { return inventory(m.cache, m.byKey) }

// inventory is c's inventory, storage repositories named by their upstream (byKey: the
// upstreams by storage key).
func inventory(c cacheView, byKey map[string]*configured) mirrorapi.CacheInventory {
	size, blobs := c.Totals()
	inv := mirrorapi.CacheInventory{SizeBytes: size, MaxSizeBytes: c.MaxSize(), PinnedBytes: c.PinnedBytes(), Blobs: blobs, Ready: c.Ready()}
	inv.UnreferencedBlobs, inv.UnreferencedBytes = c.Unreferenced()
	inv.Images = c.Images(func(sr string) (string, string) {
		key, repo, _ := strings.Cut(sr, "/")
		if up := byKey[key]; up != nil {
			return up.Name, repo
		}
		return "", ""
	})
	return inv
}

// serveCache answers mirrorapi.CachePath: GET (loopback and --allow networks) lists the cache,
// DELETE .../<upstream>/<repository>@<digest> or …:<tag> (loopback only) evicts one image; and
// mirrorapi.CacheVerifyPath (serveVerify), mirrorapi.CachePinsPath (servePins), and
// mirrorapi.CacheImportPath and its check (serveImport).
func (m *Mirror) serveCache(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == mirrorapi.CacheVerifyPath:
		m.serveVerify(w, r)
	case r.URL.Path == mirrorapi.CachePinsPath || strings.HasPrefix(r.URL.Path, mirrorapi.CachePinsPath+"/"):
		m.servePins(w, r)
	case r.URL.Path == mirrorapi.CacheImportPath || r.URL.Path == mirrorapi.CacheImportCheckPath:
		m.serveImport(w, r)
	case r.Method == http.MethodGet && r.URL.Path == mirrorapi.CachePath:
		if !m.clients.allowed(r.RemoteAddr) {
			m.metrics.refused.WithLabelValues(RefusedAllow).Inc()
			writeJSONError(w, http.StatusForbidden, "the cache inventory is served to loopback and --allow networks only")
			return
		}
		_ = json.NewEncoder(w).Encode(m.Inventory())
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, mirrorapi.CachePath+"/"):
		if !remoteLoopback(r.RemoteAddr) {
			writeJSONError(w, http.StatusForbidden, "cache deletions are accepted from loopback only")
			return
		}
		m.deleteImage(w, r, strings.TrimPrefix(r.URL.Path, mirrorapi.CachePath+"/"))
	default:
		w.Header().Set("Allow", "GET, DELETE")
		writeJSONError(w, http.StatusMethodNotAllowed, "want GET "+mirrorapi.CachePath+" or DELETE "+mirrorapi.CachePath+"/<upstream>/<repository>@<digest> (or :<tag>)")
	}
}

// serveVerify answers mirrorapi.CacheVerifyPath, to loopback and --allow networks (a pass
// only reads, at the scrub rate, and evicts what is damaged, which the next pull fetches
// again): POST starts a verify pass or answers
// the one running, 202 (query rate: its bound, bytes a second as cache verify's --rate takes it,
// ParseRate; 400 when it does not parse); GET answers the latest, 200 (404 when none was asked
// for).
func (m *Mirror) serveVerify(w http.ResponseWriter, r *http.Request) {
	if !m.clients.allowed(r.RemoteAddr) {
		m.metrics.refused.WithLabelValues(RefusedAllow).Inc()
		writeJSONError(w, http.StatusForbidden, "cache verify passes are served to loopback and --allow networks only")
		return
	}
	var c cacheView = m.cache
	switch r.Method {
	case http.MethodPost:
		rate, err := ParseRate("--rate", r.URL.Query().Get("rate"))
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error())
			return
		}
		p, err := c.StartVerify(rate)
		if err != nil {
			writeJSONError(w, http.StatusServiceUnavailable, err.Error()+"; try again shortly")
			return
		}
		m.log.Info().Int64("pass", p.ID).Int64("rate_bytes_per_second", p.RateBytes).Str("client", r.RemoteAddr).Msg("verify pass asked for")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(p)
	case http.MethodGet:
		p, ok := c.VerifyStatus()
		if !ok {
			writeJSONError(w, http.StatusNotFound, "no verify pass was asked for since serve started (POST to start one)")
			return
		}
		_ = json.NewEncoder(w).Encode(p)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeJSONError(w, http.StatusMethodNotAllowed, "want POST "+mirrorapi.CacheVerifyPath+" to start a verify pass, GET to follow it")
	}
}

// deleteImage evicts the image named by spec, "<upstream>/<repository>@<digest>" or
// "<upstream>/<repository>:<tag>" with a tag cache ls shows (an image's own tag). A child
// manifest of a cached index (by digest, or by a tag that points at it) is no image of its own:
// 409 naming the index that holds it (issue 26: it was "not cached").
func (m *Mirror) deleteImage(w http.ResponseWriter, r *http.Request, spec string) {
	const want = "want " + mirrorapi.CachePath + "/<upstream>/<repository>@<digest> or …/<repository>:<tag> as cache ls lists it, e.g. …/docker.io/library/alpine@sha256:... or …/docker.io/library/alpine:3.20"
	upName, rest, ok1 := strings.Cut(spec, "/")
	repo, ref, d, byTag, ok2 := splitCacheRef(rest)
	if !ok1 || !ok2 || upName == "" {
		writeJSONError(w, http.StatusBadRequest, want)
		return
	}
	var up *configured
	for _, u := range m.upstreams {
		if name.Canonical(u.Name) == name.Canonical(upName) {
			up = u
		}
	}
	if up == nil {
		// The spec is wrong, not the cache (400: the CLI's input refused, exit 2); often the
		// upstream was left out (library/app@…).
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("upstream %q is not configured here (configured: %s): want UPSTREAM/REPOSITORY@DIGEST or UPSTREAM/REPOSITORY:TAG as cache ls lists it, e.g. docker.io/library/alpine@sha256:...", upName, m.upstreamList()))
		return
	}
	var c cacheView = m.cache
	if !c.Ready() {
		writeJSONError(w, http.StatusServiceUnavailable, "the cache index is being rebuilt from storage; try again shortly")
		return
	}
	sr := up.storageKey + "/" + repo
	named := up.Name + "/" + repo + "@" + d.String()
	var images []mirrorapi.CachedImage
	for _, i := range inventory(c, m.byKey).Images {
		if i.Upstream == up.Name && i.Repository == repo {
			images = append(images, i)
		}
	}
	if byTag {
		named = up.Name + "/" + repo + ":" + ref
		if d = tagged(images, ref); d == "" {
			writeJSONError(w, http.StatusNotFound, "not cached: "+named+" (no cached image has that tag; cache ls lists the tags)")
			return
		}
		named += " (" + d.String() + ")"
	}
	var img *mirrorapi.CachedImage
	for _, i := range images {
		if i.Digest == d.String() {
			img = &i
		}
	}
	if img == nil || !c.HasManifest(sr, d) {
		if holders := c.Holders(sr, d); len(holders) > 0 {
			writeJSONError(w, http.StatusConflict, childMessage(named, up.Name, repo, holders, images))
			return
		}
		writeJSONError(w, http.StatusNotFound, "not cached: "+named)
		return
	}
	if pins := c.PinsOf(sr, d); len(pins) > 0 {
		names := m.pinNames(pins)
		writeJSONError(w, http.StatusConflict, fmt.Sprintf("%s/%s@%s is pinned by %s: unpin it first (nodecache cache unpin %s)",
			up.Name, repo, d, names, strings.ReplaceAll(names, ", ", " and nodecache cache unpin ")))
		return
	}
	c.EvictImage(r.Context(), sr, d, EvictAPI)
	m.log.Info().Str("upstream", up.Name).Str("repository", repo).Str("digest", d.String()).
		Str("client", r.RemoteAddr).Msg("image evicted on request")
	_ = json.NewEncoder(w).Encode(img)
}

// splitCacheRef splits "<repository>@<digest>" (d parsed) or "<repository>:<tag>" (byTag);
// ok is false when it is neither or the digest does not parse.
func splitCacheRef(s string) (repo, ref string, d digest.Digest, byTag, ok bool) {
	repo, ref, ok = splitPinRef(s)
	if byTag = !strings.Contains(s, "@"); ok && !byTag {
		var err error
		d, err = digest.Parse(ref)
		ok = err == nil
	}
	return repo, ref, d, byTag, ok
}

// tagged is the manifest tag points at in a repository's inventory rows: the image whose own
// tag it is, else the child manifest a child tag names; "" when no row has it.
func tagged(images []mirrorapi.CachedImage, tag string) digest.Digest {
	var child digest.Digest
	for _, i := range images {
		if slices.Contains(i.Tags, tag) {
			return digest.Digest(i.Digest)
		}
		if c, ok := i.ChildTags[tag]; ok && child == "" {
			child = digest.Digest(c)
		}
	}
	return child
}

// childMessage is the refusal of a removal of named, a child manifest of the cached images
// holders of upName/repo (images: that repository's rows, for their tags): it names each index,
// by its tag where it has one, and the removal that works.
func childMessage(named, upName, repo string, holders []digest.Digest, images []mirrorapi.CachedImage) string {
	var idx []string
	for _, h := range holders {
		ref := upName + "/" + repo + "@" + h.String()
		for _, i := range images {
			if i.Digest == h.String() && len(i.Tags) > 0 {
				ref = upName + "/" + repo + ":" + i.Tags[0] + " (index " + h.String() + ")"
			}
		}
		idx = append(idx, ref)
	}
	of := "a platform manifest of " + idx[0]
	if len(idx) > 1 {
		of = "a platform manifest of each of " + strings.Join(idx, ", ")
	}
	return fmt.Sprintf("%s is %s, not an image of its own: remove the index (nodecache cache rm %s/%s@%s), which takes its platforms with it",
		named, of, upName, repo, holders[0])
}

func remoteLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
