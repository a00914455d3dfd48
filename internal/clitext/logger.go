package clitext

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// IsTerminal reports whether f is a terminal (colours, progress bars and console log lines
// only there): go-isatty, so /dev/null and other character devices that are not terminals do
// not count.
func IsTerminal(f *os.File) bool {
	return isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())
}

// NewLogger builds a command's logger on out from --log-format (json, console, or "" for
// console on a terminal and JSON otherwise) and --log-level (trace, debug, info, warn, error).
// Every line carries the time with nanoseconds, added by a hook so that zerolog's package-level
// TimeFieldFormat, which every library in the process shares, stays as it is. Errors name the
// flag and what it accepts.
func NewLogger(format, level string, out *os.File) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want one of trace, debug, info, warn, error", level)
	}
	if format == "" {
		format = "json"
		if IsTerminal(out) {
			format = "console"
		}
	}
	var l zerolog.Logger
	switch format {
	case "json":
		l = zerolog.New(out)
	case "console":
		l = zerolog.New(zerolog.ConsoleWriter{Out: out, TimeFormat: "15:04:05.000", NoColor: !IsTerminal(out)})
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want json or console", format)
	}
	return l.Level(lvl).Hook(timestamp), nil
}

var timestamp = zerolog.HookFunc(func(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().UTC().Format(time.RFC3339Nano))
})
