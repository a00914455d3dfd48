package name

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Offline is the URL word of an upstream that is never asked: --upstream NAME=offline (issue 24).
const Offline = "offline"

// Upstream is one registry nodecache pulls through.
type Upstream struct {
	// Name is the registry host as written in image references (ParseRegistry: lower case, port
	// significant), e.g. "ghcr.io" or "localhost:5000". containerd sends it as ?ns=.
	Name string
	// URL is where the registry API is reached: scheme://host[:port], no path (ParseURL). Nil
	// for an upstream given as NAME=offline.
	URL *url.URL
	// Offline: the upstream is never asked (NAME=offline, or serve --offline): what the cache
	// holds is served, tags included, and anything else is not found at once.
	Offline bool
}

// String returns NAME=URL, or NAME=offline for an offline upstream.
func (u Upstream) String() string {
	if u.Offline || u.URL == nil {
		return u.Name + "=" + Offline
	}
	return u.Name + "=" + u.URL.String()
}

// ParseUpstream parses one --upstream value: "NAME=URL" (serve, agent), "NAME=offline" (an
// upstream never asked; the word in any case) or a bare "NAME", whose URL is the real registry's
// (RegistryURL). NAME follows ParseRegistry, URL ParseURL. An error names the part refused once:
// ParseRegistry's `registry name "ghcr.io/x": ...`, or for the URL the name and the URL error:
// `docker.io: URL "ftp://x": scheme "ftp": want ...` (*URLError inside; credentials in the URL
// are never echoed). A word that reads as a try at "offline" ("ofline", "off-line", "off",
// "none", "disabled", ...) is refused naming offline, not read as a host name. The Helm chart's
// upstreams check (charts/nodecache/templates/_validate.tpl) repeats these rules and messages
// (deploy/test TestChartValueGrammar): change both.
func ParseUpstream(s string) (Upstream, error) {
	nameStr, rawURL, hasURL := strings.Cut(strings.TrimSpace(s), "=")
	n, err := ParseRegistry(nameStr)
	if err != nil {
		return Upstream{}, err
	}
	if !hasURL {
		rawURL = RegistryURL(n)
	}
	if word := strings.TrimSpace(rawURL); strings.EqualFold(word, Offline) {
		return Upstream{Name: n, Offline: true}, nil
	} else if nearOffline(word) {
		return Upstream{}, fmt.Errorf("%s: %w", n, &URLError{Field: "URL", Value: word,
			Reason: "did you mean offline? want http://HOST[:PORT], https://HOST[:PORT], or offline (serve what the cache holds, never ask the upstream)"})
	}
	u, err := ParseURL("URL", rawURL)
	if err != nil {
		return Upstream{}, fmt.Errorf("%s: %w", n, err)
	}
	return Upstream{Name: n, URL: u}, nil
}

// nearOffline reports whether w, which is not "offline", reads as a try at it rather than a host:
// a word for "no upstream", or "offline" misspelt (beginning with its o, at most two letters
// changed, added or dropped, or written with separators: "off-line", "OFF_LINE"; "online" is
// not). Host names stay host names: anything with a dot, a colon, a slash or a bracket is not a
// try.
func nearOffline(w string) bool {
	if t := strings.TrimRight(w, ":/"); t != w && t != "" {
		return strings.EqualFold(t, Offline) || nearOffline(t) // "offline://", "offline:"
	}
	if w == "" || strings.ContainsAny(w, ".:/[") {
		return false
	}
	lw := strings.ToLower(w)
	switch lw {
	case "off", "none", "no", "false", "disabled", "disable", "airgap", "airgapped", "air-gapped", "air-gap":
		return true
	}
	letters := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == ' ' {
			return -1
		}
		return r
	}, lw)
	return strings.HasPrefix(letters, "o") && letters != "online" && editDistance(letters, Offline) <= 2
}

// editDistance is the Levenshtein distance of a and b, byte-wise (bounded input: a flag value).
func editDistance(a, b string) int {
	if len(a) > 64 {
		return len(a) // no try at a seven-letter word
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// ParseUpstreams parses every value (ParseUpstream) and refuses a registry configured twice,
// aliases included (docker.io and index.docker.io are one registry: Canonical). Errors are
// joined, one per refused value, each naming the flag once: `--upstream docker.io: URL "ftp://x":
// scheme "ftp": want ...`, `--upstream: registry name "ghcr.io/x": ...`, `--upstream: "ghcr.io"
// is configured twice`.
func ParseUpstreams(in []string) ([]Upstream, error) {
	var (
		out  []Upstream
		errs []error
		seen = map[string]string{}
	)
	for _, s := range in {
		u, err := ParseUpstream(s)
		var ue *URLError
		switch {
		case errors.As(err, &ue):
			errs = append(errs, fmt.Errorf("--upstream %w", err))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("--upstream: %w", err))
			continue
		}
		c := Canonical(u.Name)
		if prev, dup := seen[c]; dup {
			if prev == u.Name {
				errs = append(errs, fmt.Errorf("--upstream: %q is configured twice", u.Name))
			} else {
				errs = append(errs, fmt.Errorf("--upstream: %q is configured twice (as %q: the same registry)", u.Name, prev))
			}
			continue
		}
		seen[c] = u.Name
		out = append(out, u)
	}
	return out, errors.Join(errs...)
}

// DefaultUpstreams returns DefaultNames, each at its real registry (RegistryURL).
func DefaultUpstreams() []Upstream {
	names := DefaultNames()
	out := make([]Upstream, 0, len(names))
	for _, n := range names {
		u, err := url.Parse(RegistryURL(n))
		if err != nil {
			continue // constant input: cannot happen
		}
		out = append(out, Upstream{Name: n, URL: u})
	}
	return out
}

// DefaultUpstreamValues returns DefaultUpstreams as --upstream values NAME=URL: the default of
// serve's, the agent's and warm --to's --upstream flag.
func DefaultUpstreamValues() []string {
	var out []string
	for _, u := range DefaultUpstreams() {
		out = append(out, u.String())
	}
	return out
}
