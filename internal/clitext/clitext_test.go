package clitext

import (
	"testing"
	"time"
)

func TestSpan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{time.Nanosecond, "<1ms"},
		{108221 * time.Nanosecond, "<1ms"}, // "cache index rebuilt … duration" (newuser F10)
		{315129 * time.Nanosecond, "<1ms"}, // warm's "0 B in 315.129µs" (newuser F10)
		{999499 * time.Nanosecond, "<1ms"},
		{time.Millisecond, "1ms"},
		{-1500 * time.Millisecond, "-1.5s"},
		{5 * time.Minute, "5m"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + 5*time.Second, "1h0m5s"},
		{1500 * time.Microsecond, "2ms"},
		{353190694 * time.Nanosecond, "353ms"},
		{10 * time.Second, "10s"},
		{3000516560 * time.Nanosecond, "3s"},
		{1234 * time.Millisecond, "1.2s"},
		{150*time.Second + 400*time.Millisecond, "2m30s"},
	} {
		if got := Span(tc.d); got != tc.want {
			t.Errorf("Span(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	t.Parallel()
	names := []string{"listen", "metrics-listen", "root", "upstream", "upstream-timeout"}
	for _, tc := range []struct{ typed, want string }{
		{"lsiten", "listen"},
		{"upstram", "upstream"},
		{"rot", "root"},
		{"bogus", ""},
		{"x", ""},
	} {
		if got := Suggest(tc.typed, names); got != tc.want {
			t.Errorf("Suggest(%q) = %q, want %q", tc.typed, got, tc.want)
		}
	}
}

func TestCheckValues(t *testing.T) {
	t.Parallel()
	kinds := map[string]Kind{"listen": Text, "wait": Duration, "concurrency": Number, "talos": Boolean, "upstream": List}
	good := map[string]any{"listen": ":5000", "wait": "30s", "concurrency": 4, "talos": true, "upstream": []any{"a", "b"}}
	if err := CheckValues(good, kinds); err != nil {
		t.Fatalf("good values refused: %v", err)
	}
	for _, tc := range []struct {
		key  string
		v    any
		want string
	}{
		{"listen", 5000, `key "listen": want text (quote it if it looks like a number or true/false), got the number 5000`},
		{"wait", "soon", `key "wait": want a duration such as 500ms, 30s, 5m or 1h30m, got the text "soon"`},
		{"concurrency", 2.5, `key "concurrency": want a whole number such as 4, got the number 2.5`},
		{"talos", "yes", `key "talos": want true or false, got the text "yes"`},
		{"upstream", "docker.io", `key "upstream": want a list (a YAML sequence such as ["a", "b"]), got the text "docker.io"`},
		{"upstream", []any{"docker.io", 5}, `key "upstream": item 2 is the number 5; want text in each item of the list (quote it if it looks like a number or true/false)`},
		{"upstream", []any{nil, true}, `key "upstream": item 1 is nothing (an empty value), item 2 is true (a true/false value); want text in each item of the list (quote it if it looks like a number or true/false)`},
		{"listen", map[string]any{"a": 1}, `key "listen": want text (quote it if it looks like a number or true/false), got a mapping (nested keys)`},
		{"listen", nil, `key "listen": want text (quote it if it looks like a number or true/false), got nothing (an empty value)`},
	} {
		err := CheckValues(map[string]any{tc.key: tc.v}, kinds)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s = %#v: %v, want %q", tc.key, tc.v, err, tc.want)
		}
	}
}

// TestBytes (was warm's TestHumanBytes; warm and cache ls had one copy each).
func TestBytes(t *testing.T) {
	t.Parallel()
	for in, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB"} {
		if got := Bytes(in); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", in, got, want)
		}
	}
}

// TestCount: 0, 1 and 2 of every noun nodecache counts in a message (issue 26: "1 images",
// "1 blobs fetched").
func TestCount(t *testing.T) {
	t.Parallel()
	for noun, plural := range map[string]string{
		"image": "images", "blob": "blobs", "attempt": "attempts", "probe": "probes", "answer": "answers",
		"argument": "arguments", "byte": "bytes", "registry": "registries", "process": "processes",
		"test": "tests", "day": "days", "box": "boxes", "match": "matches",
	} {
		for n, want := range map[int]string{0: "0 " + plural, 1: "1 " + noun, 2: "2 " + plural} {
			if got := Count(n, noun); got != want {
				t.Errorf("Count(%d, %q) = %q, want %q", n, noun, got, want)
			}
		}
	}
	if got := Count(int64(-1), "byte"); got != "-1 bytes" {
		t.Errorf("Count(-1, byte) = %q", got)
	}
}
