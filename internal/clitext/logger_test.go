package clitext

import (
	"bufio"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/ptytest"
)

// TestNewLoggerFormat: without --log-format a terminal gets console lines and a pipe JSON
// lines; the flag overrides; bad values name the flag.
func TestNewLoggerFormat(t *testing.T) {
	t.Parallel()
	console := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3} .*INF.* hello .*took=.*3s`)
	json := regexp.MustCompile(`^\{"level":"info","took":"3s","time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z","message":"hello"\}$`)
	for _, tc := range []struct {
		name, format string
		terminal     bool
		want         *regexp.Regexp
	}{
		{"terminal, default", "", true, console},
		{"pipe, default", "", false, json},
		{"terminal, json asked", "json", true, json},
		{"pipe, console asked", "console", false, console},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var r, w *os.File
			if tc.terminal {
				r, w = ptytest.Pair(t)
			} else {
				var err error
				if r, w, err = os.Pipe(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
			}
			l, err := NewLogger(tc.format, "info", w)
			if err != nil {
				t.Fatal(err)
			}
			l.Info().Str("took", Span(3*time.Second)).Msg("hello")
			line, err := bufio.NewReader(r).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			line = regexp.MustCompile(`\x1b\[[0-9;]*m|\r?\n$`).ReplaceAllString(line, "")
			if !tc.want.MatchString(line) {
				t.Fatalf("line %q does not match %s", line, tc.want)
			}
		})
	}
	for _, tc := range []struct{ format, level, want string }{
		{"xml", "info", `--log-format "xml": want json or console`},
		{"json", "loud", `--log-level "loud": want one of trace, debug, info, warn, error`},
	} {
		if _, err := NewLogger(tc.format, tc.level, os.Stderr); err == nil || err.Error() != tc.want {
			t.Errorf("NewLogger(%q, %q): %v, want %q", tc.format, tc.level, err, tc.want)
		}
	}
}
