package warm

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/platforms"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// ParsePlatform parses "os/arch[/variant]" with containerd's parser (github.com/containerd/platforms)
// after the character check, and returns it normalised ("linux/aarch64" -> linux/arm64). Empty s
// means this machine's platform (platforms.DefaultSpec). Errors are refusals naming --platform and s
// (refusal.Value).
func ParsePlatform(s string) (specs.Platform, error) {
	if s == "" {
		return platforms.Normalize(platforms.DefaultSpec()), nil
	}
	refuse := func(reason string) (specs.Platform, error) {
		return specs.Platform{}, refusal.Value("--platform", s, reason)
	}
	if bad := checkChars(s, 64); bad != "" {
		return refuse(bad + "; want os/arch[/variant], e.g. linux/amd64 or linux/arm/v7")
	}
	if strings.Count(s, "/") < 1 {
		return refuse("want os/arch[/variant], e.g. linux/amd64 or linux/arm64")
	}
	p, err := platforms.Parse(s)
	if err != nil {
		return refuse(fmt.Sprintf("want os/arch[/variant], e.g. linux/amd64: %v", err))
	}
	return platforms.Normalize(p), nil
}

// FormatPlatform returns os/arch[/variant].
func FormatPlatform(p specs.Platform) string { return platforms.Format(p) }

// PlatformMatch is the rule that picks an index's manifest for the platform: the runtime that
// will pull decides which one it takes, so warm must take the same.
type PlatformMatch string

const (
	// PlatformMatchTransfer takes only the exact os/arch/variant (containerd's
	// platforms.Ordered(platform)), as containerd >= 2.1 CRI pulls through the transfer service
	// and CRI-O do. arm64 with variant v8 and without are the same platform.
	PlatformMatchTransfer PlatformMatch = "transfer"
	// PlatformMatchOnly is containerd's platforms.Only(platform), as containerd 1.7 and 2.0
	// local pulls use it: the exact platform first, then older variants of the architecture
	// (arm/v7 before arm/v6, amd64/v3 before v2) and the architectures it runs (amd64 -> 386,
	// arm64 -> arm/v8, arm/v7, …).
	PlatformMatchOnly PlatformMatch = "only"
)

// ParsePlatformMatch accepts "transfer" or "only"; "" means PlatformMatchTransfer. Errors are
// refusal naming --platform-match and s (refusal.Value).
func ParsePlatformMatch(s string) (PlatformMatch, error) {
	switch PlatformMatch(s) {
	case "", PlatformMatchTransfer:
		return PlatformMatchTransfer, nil
	case PlatformMatchOnly:
		return PlatformMatchOnly, nil
	}
	return "", refusal.Value("--platform-match", s,
		"want transfer (exact os/arch/variant: containerd >= 2.1, CRI-O) or only (containerd 1.7 and 2.0 with their fallbacks)")
}

// describe says what the rule accepts, for messages.
func (r PlatformMatch) describe() string {
	if r == PlatformMatchOnly {
		return "by containerd's platforms.Only (same platform, then its fallbacks)"
	}
	return "by the transfer rule (exact os/arch/variant)"
}

// platformMatcher picks the manifest for one platform from an index by rule: containerd's own
// MatchComparer (platforms.Ordered or platforms.Only) decides what matches and what is better.
type platformMatcher struct {
	want specs.Platform
	rule PlatformMatch
	cmp  platforms.MatchComparer
}

func newPlatformMatcher(want specs.Platform, rule PlatformMatch) platformMatcher {
	want = platforms.Normalize(want)
	m := platformMatcher{want: want, rule: rule, cmp: platforms.Ordered(want)}
	if rule == PlatformMatchOnly {
		m.cmp = platforms.Only(want)
	} else {
		m.rule = PlatformMatchTransfer
	}
	return m
}

// match reports whether p (an index entry's platform; nil never matches) is acceptable.
func (m platformMatcher) match(p *v1.Platform) bool {
	return p != nil && m.matchSpec(toSpec(p))
}

// matchSpec reports whether p (a platform read from an image config) is acceptable, by the same
// rule as match.
func (m platformMatcher) matchSpec(p specs.Platform) bool {
	return m.cmp.Match(platforms.Normalize(p))
}

// configPlatform reads the platform an image config names: the fields os, architecture, variant,
// os.version and os.features that the OCI image config shares with the platform object (the
// fields containerd's images.ConfigPlatform reads), normalised. named is false when the config
// gives neither os nor architecture. Errors: the body is not a JSON object.
func configPlatform(body []byte) (p specs.Platform, named bool, err error) {
	if err := json.Unmarshal(body, &p); err != nil {
		return specs.Platform{}, false, fmt.Errorf("parse image config: %w", err)
	}
	if p.OS == "" && p.Architecture == "" {
		return p, false, nil
	}
	return platforms.Normalize(p), true, nil
}

// best returns the index of the best acceptable platform in ps (index order breaks ties), or -1.
func (m platformMatcher) best(ps []*v1.Platform) int {
	var idx []int
	for i, p := range ps {
		if m.match(p) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return -1
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		pa, pb := toSpec(ps[a]), toSpec(ps[b])
		switch {
		case m.cmp.Less(pa, pb):
			return -1
		case m.cmp.Less(pb, pa):
			return 1
		}
		return 0
	})
	return idx[0]
}

func toSpec(p *v1.Platform) specs.Platform {
	return specs.Platform{
		OS: p.OS, Architecture: p.Architecture, Variant: p.Variant,
		OSVersion: p.OSVersion, OSFeatures: p.OSFeatures,
	}
}

// formatV1Platform returns os/arch[/variant] of an index entry, "none" when it has no platform.
func formatV1Platform(p *v1.Platform) string {
	if p == nil {
		return "none"
	}
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
