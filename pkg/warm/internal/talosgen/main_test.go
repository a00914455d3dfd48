package main

import (
	"strings"
	"testing"
)

// TestReadPauseBetween: a release whose talos module the proxy refuses takes the pause image of
// the two patches around it, and only of patches of its own minor, one older and one newer.
func TestReadPauseBetween(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		r       release
		wantErr string
	}{
		{name: "reversed", r: release{version: "v1.12.4", pauseBetween: [2]string{"v1.12.6", "v1.12.1"}}, wantErr: "must be older and newer patches"},
		{name: "other minor", r: release{version: "v1.12.4", pauseBetween: [2]string{"v1.11.5", "v1.12.6"}}, wantErr: "must be older and newer patches"},
		{name: "itself", r: release{version: "v1.12.4", pauseBetween: [2]string{"v1.12.4", "v1.12.6"}}, wantErr: "must be older and newer patches"},
		{name: "malformed", r: release{version: "v1.12.4", pauseBetween: [2]string{"1.12.1", "v1.12.6"}}, wantErr: "must be older and newer patches"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := readPause(tc.r)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestPatchBefore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"v1.12.1", "v1.12.4", true},
		{"v1.12.4", "v1.12.10", true},
		{"v1.12.4", "v1.12.4", false},
		{"v1.12.6", "v1.12.4", false},
		{"v1.11.9", "v1.12.4", false},
		{"v2.12.1", "v1.12.4", false},
		{"1.12.1", "v1.12.4", false},
	} {
		if got := patchBefore(tc.a, tc.b); got != tc.want {
			t.Errorf("patchBefore(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
