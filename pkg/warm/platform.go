package warm

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/platforms"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/image-spec/specs-go/v1"
)

// ParsePlatform parses "os/arch[/variant]" with containerd's parser (github.com/containerd/platforms)
// after the character check, and returns it normalised ("linux/aarch64" -> linux/arm64). Empty s
// means this machine's platform (platforms.DefaultSpec). Errors are *RefusedError.
func ParsePlatform(s string) (specs.Platform, error) {
	if s == "" {
		return platforms.Normalize(platforms.DefaultSpec()), nil
	}
	refuse := func(reason string) (specs.Platform, error) {
		return specs.Platform{}, &RefusedError{What: "--platform", Value: s, Reason: reason}
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

// platformMatcher picks the manifest for one platform from an index, by containerd's rules
// (platforms.Only): an exact match first, then the same architecture's older variants in
// containerd's order (arm/v7 before arm/v6; arm64 with variant v8 or none; amd64/v3 before v2).
// Unlike platforms.Only it never falls back to another architecture (amd64 -> 386,
// arm64 -> arm): a node would then run a different binary than the one the runtime pulls.
type platformMatcher struct {
	want specs.Platform
	only platforms.MatchComparer
}

func newPlatformMatcher(want specs.Platform) platformMatcher {
	want = platforms.Normalize(want)
	return platformMatcher{want: want, only: platforms.Only(want)}
}

// match reports whether p (an index entry's platform; nil never matches) is acceptable.
func (m platformMatcher) match(p *v1.Platform) bool {
	if p == nil {
		return false
	}
	sp := platforms.Normalize(toSpec(p))
	return sp.OS == m.want.OS && sp.Architecture == m.want.Architecture && m.only.Match(sp)
}

// matchSpec reports whether p (a platform read from an image config) is acceptable, by the same
// rules as match.
func (m platformMatcher) matchSpec(p specs.Platform) bool {
	p = platforms.Normalize(p)
	return p.OS == m.want.OS && p.Architecture == m.want.Architecture && m.only.Match(p)
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
		case m.only.Less(pa, pb):
			return -1
		case m.only.Less(pb, pa):
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
