package mirror

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// binaryUnits are the units --max-size accepts, in bytes.
var binaryUnits = []struct {
	suffix string
	bytes  int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// decimalUnits are refused with the binary unit of the same prefix named.
var decimalUnits = map[string]string{
	"TB": "TiB", "GB": "GiB", "MB": "MiB", "KB": "KiB", "kB": "KiB",
	"T": "TiB", "G": "GiB", "M": "MiB", "K": "KiB", "k": "KiB",
	"Ti": "TiB", "Gi": "GiB", "Mi": "MiB", "Ki": "KiB",
}

// sizeNumber is the number of a --max-size: decimal digits with an optional fraction (no sign,
// exponent, hex or spaces). The chart's maxSize and agent.maxSize checks
// (charts/nodecache/templates/_validate.tpl) repeat ParseMaxSize's rules and messages but the
// disk's (deploy/test TestChartMaxSizeAgreesWithServe, TestChartValueGrammar).
var sizeNumber = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// ParseMaxSize parses --max-size: a size in binary units (500MiB, 30GiB, 1.5TiB, 1024KiB, or
// plain bytes such as 1048576 or 1048576B), or a share of the total size of the filesystem
// holding root ("30%", statfs; root or, while it does not exist, its nearest existing parent).
// "", "0" and any zero size (0B, 0GiB) mean no cap (0). Errors: decimal units (30GB: the message
// names 30GiB), a share outside (0, 100], a size that is not sizeNumber followed directly by a
// unit, a size of 8 EiB or more, statfs failures.
func ParseMaxSize(s, root string) (int64, error) {
	if s == "" || s == "0" {
		return 0, nil
	}
	accepted := "want a size in binary units such as 500MiB, 30GiB or 1TiB, or a share of the filesystem holding --root such as 30%"
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		p, err := strconv.ParseFloat(pct, 64)
		if err != nil || !sizeNumber.MatchString(pct) || math.IsNaN(p) {
			return 0, fmt.Errorf("%q: not a share: %s", s, accepted)
		}
		if p <= 0 || p > 100 {
			return 0, fmt.Errorf("%q: a share must be more than 0%% and at most 100%%: %s", s, accepted)
		}
		total, err := filesystemSize(root)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", s, err)
		}
		n := int64(float64(total) * p / 100)
		if n < 1 {
			return 0, fmt.Errorf("%q: %s of %d bytes is less than one byte (a cap of 0 would mean no cap): %s", s, s, total, accepted)
		}
		return n, nil
	}
	return parseBinarySize(s, accepted)
}

// parseBinarySize parses a size in binary units (500MiB, 1.5TiB, plain bytes); accepted ends
// its errors, saying what the flag takes.
func parseBinarySize(s, accepted string) (int64, error) {
	num := strings.TrimRightFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	unit := s[len(num):]
	if bin, ok := decimalUnits[unit]; ok {
		return 0, fmt.Errorf("%q: decimal and short units are not accepted; did you mean %s%s? (%s)", s, num, bin, accepted)
	}
	mult := int64(0)
	if unit == "" {
		mult = 1
	}
	for _, u := range binaryUnits {
		if unit == u.suffix {
			mult = u.bytes
		}
	}
	if mult == 0 {
		return 0, fmt.Errorf("%q: unknown unit %q: %s", s, unit, accepted)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || !sizeNumber.MatchString(num) || v < 0 || math.IsInf(v, 0) || v*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("%q: not a size: %s", s, accepted)
	}
	n := int64(v * float64(mult))
	if n < 1 && v > 0 {
		return 0, fmt.Errorf("%q: less than one byte (a cap of 0 would mean no cap; 0 says so): %s", s, accepted)
	}
	return n, nil
}

// filesystemSize is the total size in bytes of the filesystem holding dir (or its nearest
// existing parent).
func filesystemSize(dir string) (uint64, error) {
	p, err := filepath.Abs(dir)
	if err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return st.Blocks * uint64(st.Bsize), nil //nolint:gosec // Bsize is positive
		}
		parent := filepath.Dir(p)
		if !errors.Is(err, os.ErrNotExist) || parent == p {
			return 0, fmt.Errorf("statfs %s: %w", p, err)
		}
		p = parent
	}
}
