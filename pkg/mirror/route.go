package mirror

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"github.com/distribution/reference"

	"github.com/nodecache/nodecache/pkg/name"
)

// Request kinds, as named in the access log and metrics.
const (
	kindBase      = "base"
	kindManifest  = "manifest"
	kindBlob      = "blob"
	kindTags      = "tags"
	kindReferrers = "referrers"
	kindOther     = "other"
)

// route is where one registry API request goes.
type route struct {
	up   *configured
	repo string // repository at the upstream, e.g. "library/alpine"
	kind string
	ref  string // tag or digest; "" for tags and base
	// rest is the path after the repository, e.g. "/manifests/latest".
	rest string
}

// apiPath splits a /v2/ path into repository components, kind, reference and the rest.
// ok is false for paths that are not a read API of the distribution spec.
func apiPath(p string) (name []string, kind, ref, rest string, ok bool) {
	s := strings.TrimPrefix(p, "/v2/")
	if s == p || s == "" {
		return nil, kindBase, "", "", s == ""
	}
	parts := strings.Split(s, "/")
	n := len(parts)
	if n < 3 {
		return nil, kindOther, "", "", false
	}
	switch {
	case parts[n-2] == "tags" && parts[n-1] == "list":
		return parts[:n-2], kindTags, "", "/tags/list", true
	case parts[n-2] == "manifests":
		return parts[:n-2], kindManifest, parts[n-1], "/manifests/" + parts[n-1], parts[n-1] != ""
	case parts[n-2] == "blobs":
		return parts[:n-2], kindBlob, parts[n-1], "/blobs/" + parts[n-1], parts[n-1] != ""
	case parts[n-2] == "referrers":
		return parts[:n-2], kindReferrers, parts[n-1], "/referrers/" + parts[n-1], parts[n-1] != ""
	}
	return nil, kindOther, "", "", false
}

// resolve applies the routing contract (docs/serve.md, "Routing") to a request:
//  1. ?ns=NAME must name a configured upstream or one of its aliases; a leading path component
//     naming the same upstream is stripped (containerd with override_path sends both). Otherwise
//     the path is a repository as given ("my.team/app" is a valid repository name).
//  2. else a leading path component naming a configured upstream — its NAME, an alias of it
//     (name.Aliases: docker.io, index.docker.io, registry-1.docker.io) or, for a NAME with a
//     port, its port-free path alias (name.PathAlias: "reg.local_5005") — selects it and is
//     stripped;
//  3. else a leading path component that is a registry host (a dot, a colon or "localhost", as
//     in image references) but names no configured upstream is refused: 404 NAME_UNKNOWN naming
//     it (closed world: it is never taken as a repository of the default upstream);
//  4. else the default upstream, if any;
//  5. Docker Hub: a single-component repository becomes library/<name>.
//
// It never dials anything: an unknown name is an error for the client.
func (m *Mirror) resolve(r *http.Request) (route, *apiError) {
	comps, kind, ref, rest, ok := apiPath(r.URL.Path)
	if !ok {
		return route{kind: kind}, errNotFound("NAME_UNKNOWN", "not a registry read API path: "+r.URL.Path)
	}
	rt := route{kind: kind, ref: ref, rest: rest}
	ns := r.URL.Query().Get("ns")
	if ns != "" {
		n, err := name.ParseRegistry(ns)
		var up *configured
		if err == nil {
			up = m.configuredAs(n)
		}
		if up == nil {
			return rt, errNotFound("NAME_UNKNOWN", "upstream "+quote(ns)+" (from ?ns=) is not configured here; configured: "+m.upstreamList())
		}
		rt.up = up
		if len(comps) > 1 && m.configuredAs(comps[0]) == up {
			comps = comps[1:]
		}
	}
	if kind == kindBase {
		return rt, nil
	}
	if kind == kindManifest && !tagOrDigestRe.MatchString(ref) {
		return rt, errNoRoute("invalid tag or digest " + quote(ref) + ": a tag is [A-Za-z0-9_][A-Za-z0-9._-]{0,127}, a digest algorithm:hex")
	}
	if (kind == kindBlob || kind == kindReferrers) && !digestRe.MatchString(ref) {
		return rt, errNoRoute("invalid digest " + quote(ref))
	}
	if rt.up == nil && len(comps) > 1 {
		switch up := m.configuredAs(comps[0]); {
		case up != nil:
			rt.up = up
			comps = comps[1:]
		case registryHost(comps[0]):
			return rt, errNotFound("NAME_UNKNOWN", "registry "+quote(comps[0])+" is not configured here, so nothing is fetched for it; configured: "+
				m.upstreamList()+" (for a repository of the default upstream whose first component looks like a host, send ?ns=<registry>)")
		}
	}
	if rt.up == nil {
		if m.defaultUpstream == nil {
			return rt, errNotFound("NAME_UNKNOWN", "no upstream selected: send ?ns=<registry> or a /v2/<registry>/<repository>/ path; configured: "+m.upstreamList())
		}
		rt.up = m.defaultUpstream
	}
	if name.Canonical(rt.up.Name) == name.DockerHub && len(comps) == 1 {
		comps = []string{"library", comps[0]}
	}
	rt.repo = strings.Join(comps, "/")
	if !routeNameRe.MatchString(rt.repo) {
		// Not a name distribution's router matches (an upper-case path component, an empty
		// one): its plain 404, as the upstream would answer /v2/<repo>/....
		return rt, errNoRoute("invalid repository name " + quote(rt.repo))
	}
	if _, err := reference.WithName(rt.up.storageKey + "/" + rt.repo); err != nil {
		return rt, &apiError{Status: http.StatusBadRequest, Code: "NAME_INVALID", Message: "invalid repository name " + quote(rt.repo) + ": " + err.Error()}
	}
	return rt, nil
}

// configuredAs returns the configured upstream that s names, or nil: its NAME, any name of its
// alias table entry (name.Canonical), or the port-free path alias of a NAME with a port
// (name.ParsePathAlias). Case-insensitive.
func (m *Mirror) configuredAs(s string) *configured {
	n := strings.ToLower(s)
	if up := m.upstreams[n]; up != nil {
		return up
	}
	if ported, ok := name.ParsePathAlias(n); ok {
		n = ported
	}
	c := name.Canonical(n)
	for _, up := range m.upstreams {
		if name.Canonical(up.Name) == c {
			return up
		}
	}
	return nil
}

// registryHost reports whether the first component of a repository path is a registry host
// rather than a repository component, by the rule of image references (distribution/reference
// splitDockerDomain): it holds a '.' or a ':', or is "localhost".
func registryHost(component string) bool {
	return strings.ContainsAny(component, ".:") || strings.EqualFold(component, "localhost")
}

func (m *Mirror) upstreamList() string {
	names := make([]string, 0, len(m.upstreams))
	for n := range m.upstreams {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

var (
	// OCI distribution spec, "Pulling manifests": tag and digest grammars.
	tagOrDigestRe = regexp.MustCompile(`^(?:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+)$`)
	digestRe      = regexp.MustCompile(`^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$`)
	// routeNameRe is the {name} of distribution's routes (api/v2 descriptors): an optional
	// domain, then lower-case path components.
	routeNameRe     = regexp.MustCompile(`^(?:` + reference.NameRegexp.String() + `)$`)
	invalidKeyChars = regexp.MustCompile(`[^a-z0-9.-]+`)
	componentRe     = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)
)

// storageKey maps an upstream name to the first repository component it is stored under, so one
// store holds every upstream and per-repository links keep them apart: "ghcr.io" stays
// "ghcr.io", "registry.local:5000" becomes "registry.local-5000", and a name that cannot be made a
// valid component becomes "h" + 16 hex digits of its SHA-256.
func storageKey(name string) string {
	k := strings.Trim(invalidKeyChars.ReplaceAllString(name, "-"), ".-")
	if componentRe.MatchString(k) {
		return k
	}
	sum := sha256.Sum256([]byte(name))
	return "h" + hex.EncodeToString(sum[:8])
}

func quote(s string) string { return "\"" + s + "\"" }
