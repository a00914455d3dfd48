package containerd_test

import (
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap/containerd"
)

// TestReportedRelease: what a running containerd's version service says, distribution suffixes
// included, is read as MAJOR.MINOR (the patch level changes no rule); anything without them is
// refused naming the input.
func TestReportedRelease(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]containerd.Release{
		"v2.4.2":          {Major: 2, Minor: 4},
		"1.7.35":          {Major: 1, Minor: 7},
		"2.1.4+unknown":   {Major: 2, Minor: 1},
		"1.7.28-0ubuntu1": {Major: 1, Minor: 7},
		"1.6.20~ds1":      {Major: 1, Minor: 6},
		" v2.0.5\n":       {Major: 2, Minor: 0},
		"2.4":             {Major: 2, Minor: 4},
		"2.3rc1":          {Major: 2, Minor: 3},
		"2.0.junk":        {Major: 2, Minor: 0},
		"1000.1000":       {Major: 1000, Minor: 1000},
	} {
		if got, err := containerd.ReportedRelease(in); err != nil || got != want {
			t.Errorf("ReportedRelease(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "2", "v", "x.4", "2.x", "-1.2", "+2.4", "2 .4", "1001.0", "2.1001", "99999999999999999999.1"} {
		if got, err := containerd.ReportedRelease(bad); err == nil || !strings.Contains(err.Error(), "want MAJOR.MINOR[.PATCH]") {
			t.Errorf("ReportedRelease(%q) = %v, %v; want a refusal", bad, got, err)
		}
	}
}

// TestParseRelease: --containerd-version is read by bootstrap.ParseVersionFlag's rules, with
// containerd's example in the error.
func TestParseRelease(t *testing.T) {
	t.Parallel()
	if got, err := containerd.ParseRelease("v2.4.2-rc.1+unknown"); err != nil || got != (containerd.Release{Major: 2, Minor: 4, Patch: 2}) {
		t.Errorf("ParseRelease = %v, %v", got, err)
	}
	if _, err := containerd.ParseRelease("2.0.junk"); err == nil || !strings.Contains(err.Error(), "e.g. 2.4.2") {
		t.Errorf("ParseRelease(2.0.junk): %v, want a refusal showing 2.4.2", err)
	}
}

// TestReleaseRules: each release line's loader rules (gen) and the evidence its daemon gives
// (status), from containerd's sources (version.ConfigVersion; introspection's
// RegistryConfigPath from 2.4; CRI status' config on 1.x).
func TestReleaseRules(t *testing.T) {
	t.Parallel()
	type rules struct {
		v2                  bool
		schema              int
		plugin              string
		transfer, intro, st bool
	}
	for _, tc := range []struct {
		r    containerd.Release
		want rules
	}{
		{containerd.Release{Major: 1, Minor: 6, Patch: 20}, rules{false, 2, containerd.PluginCRIv1, false, false, true}},
		{containerd.Release{Major: 1, Minor: 7, Patch: 35}, rules{false, 2, containerd.PluginCRIv1, false, false, true}},
		{containerd.Release{Major: 2, Minor: 0, Patch: 5}, rules{true, 3, containerd.PluginImages, false, false, false}},
		{containerd.Release{Major: 2, Minor: 1}, rules{true, 3, containerd.PluginImages, true, false, false}},
		{containerd.Release{Major: 2, Minor: 2, Patch: 1}, rules{true, 3, containerd.PluginImages, true, false, false}},
		{containerd.Release{Major: 2, Minor: 3}, rules{true, 4, containerd.PluginImages, true, false, false}},
		{containerd.Release{Major: 2, Minor: 4, Patch: 2}, rules{true, 4, containerd.PluginImages, true, true, false}},
		{containerd.Release{Major: 3}, rules{true, 4, containerd.PluginImages, true, true, false}},
	} {
		got := rules{tc.r.V2(), tc.r.ConfigVersion(), tc.r.PluginID(), tc.r.TransferService(), tc.r.IntrospectsConfigPath(), tc.r.CRIStatusConfig()}
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.r, got, tc.want)
		}
	}
	if s := (containerd.Release{}).String(); s != "unknown" {
		t.Errorf("zero Release is %q, want unknown", s)
	}
}
