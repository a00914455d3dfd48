package mirror_test

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodecache/nodecache/pkg/mirror"
)

func TestParseMaxSize(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	fs := int64(st.Blocks) * int64(st.Bsize) //nolint:gosec // test arithmetic on a real filesystem
	for _, tc := range []struct {
		name, in string
		want     int64
		errHas   string
	}{
		{name: "empty is no cap", in: "", want: 0},
		{name: "zero is no cap", in: "0", want: 0},
		{name: "MiB", in: "500MiB", want: 500 << 20},
		{name: "GiB", in: "30GiB", want: 30 << 30},
		{name: "TiB", in: "1TiB", want: 1 << 40},
		{name: "fraction", in: "1.5GiB", want: 3 << 29},
		{name: "plain bytes", in: "1048576", want: 1 << 20},
		{name: "share of the filesystem", in: "30%", want: int64(float64(fs) * 30 / 100)},
		{name: "whole filesystem", in: "100%", want: fs},
		{name: "decimal GB names GiB", in: "30GB", errHas: "did you mean 30GiB?"},
		{name: "decimal MB names MiB", in: "500MB", errHas: "did you mean 500MiB?"},
		{name: "kubernetes Gi names GiB", in: "2Gi", errHas: "did you mean 2GiB?"},
		{name: "share over 100", in: "101%", errHas: "at most 100%"},
		{name: "share zero", in: "0%", errHas: "more than 0%"},
		{name: "unknown unit", in: "3 bananas", errHas: "unknown unit"},
		{name: "not a number", in: "GiB", errHas: "not a size"},
		{name: "negative", in: "-1GiB", errHas: "not a size"},
		{name: "zero with a unit is no cap", in: "0GiB", want: 0},
		{name: "PiB is no unit of ours", in: "1PiB", errHas: "unknown unit"},
		{name: "exponent", in: "1e3GiB", errHas: "not a size"},
		{name: "sign", in: "+1GiB", errHas: "not a size"},
		{name: "space before the unit", in: "30 GiB", errHas: "unknown unit"},
		{name: "share with an exponent", in: "1e1%", errHas: "not a share"},
		{name: "share with a bare point", in: "50.%", errHas: "not a share"},
		// newuser trial 2, F4: caps that round to 0 bytes became "no cap".
		{name: "half a byte", in: "0.5", errHas: "less than one byte"},
		{name: "tiny share", in: "0.0000000000000001%", errHas: "less than one byte"},
		{name: "share zero point zero", in: "0.0%", errHas: "more than 0%"},
		{name: "8 EiB", in: "8388608TiB", errHas: "not a size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := mirror.ParseMaxSize(tc.in, root)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("ParseMaxSize(%q) = %d, %v; want an error containing %q", tc.in, got, err, tc.errHas)
				}
				if !strings.Contains(err.Error(), "binary units") {
					t.Errorf("error %q does not say what is accepted", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseMaxSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
	// The share of a root that does not exist yet is taken from its nearest existing parent.
	if got, err := mirror.ParseMaxSize("100%", root+"/not/yet"); err != nil || got != fs {
		t.Errorf("ParseMaxSize(100%%, missing root) = %d, %v; want %d", got, err, fs)
	}
}
