package crio_test

import (
	"strings"
	"testing"

	"github.com/nodecache/nodecache/pkg/bootstrap/crio"
)

// TestRelease: --crio-version is read by bootstrap.ParseVersionFlag's rules with CRI-O's
// example, and auto_reload_registries exists from 1.30 on.
func TestRelease(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{"1.29.9": false, "v1.30.0": true, "1.31.2-rc.1": true, "2.0": true} {
		r, err := crio.ParseRelease(in)
		if err != nil || r.AutoReloadRegistries() != want {
			t.Errorf("ParseRelease(%q) = %v, %v: AutoReloadRegistries %v, want %v", in, r, err, r.AutoReloadRegistries(), want)
		}
	}
	if _, err := crio.ParseRelease("1.30.junk"); err == nil || !strings.Contains(err.Error(), "e.g. 1.34.1") {
		t.Errorf("ParseRelease(1.30.junk): %v, want a refusal showing 1.34.1", err)
	}
	if r := (crio.Release{}); r.AutoReloadRegistries() || r.String() != "unknown" {
		t.Errorf("zero Release: auto reload %v, %q", r.AutoReloadRegistries(), r)
	}
}
