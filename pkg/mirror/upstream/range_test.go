package upstream

import "testing"

// TestRangeSpan: which Range values count as bounded (an end before the blob's last byte, or any
// end while the size is unknown), and the span they ask for.
func TestRangeSpan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v        string
		size     int64
		from, to int64
		bounded  bool
		ok       bool
	}{
		{"bytes=0-1023", 4096, 0, 1023, true, true},
		{"bytes=0-4095", 4096, 0, 4095, false, true},
		{"bytes=0-9999", 4096, 0, 4095, false, true},
		{"bytes=100-", 4096, 100, 4095, false, true},
		{"bytes=-100", 4096, 3996, 4095, false, true},
		{"bytes=10-19, 3000-", 4096, 10, 4095, true, true},
		{"bytes= 5 - 9", 4096, 5, 9, true, true},
		{"bytes=0-1023", -1, 0, 1023, true, true},
		{"bytes=100-", -1, 100, -1, false, true},
		{"bytes=9-3", 4096, 0, 0, false, false},
		{"bytes=-", 4096, 0, 0, false, false},
		{"bytes=-0", 4096, 0, 0, false, false},
		{"bytes=a-b", 4096, 0, 0, false, false},
		{"items=0-1", 4096, 0, 0, false, false},
	} {
		from, to, bounded, ok := rangeSpan(tc.v, tc.size)
		if ok != tc.ok || ok && (from != tc.from || to != tc.to || bounded != tc.bounded) {
			t.Errorf("rangeSpan(%q, %d) = %d, %d, bounded %v, ok %v; want %d, %d, %v, %v",
				tc.v, tc.size, from, to, bounded, ok, tc.from, tc.to, tc.bounded, tc.ok)
		}
	}
}
