// Package refusal is the error for input nodecache refuses: a flag value, a flag combination, a
// file named on the command line or found on the host that the user must fix. Nothing was
// changed and nothing was sent when it is returned. bootstrap, warm, the agent and the input
// file guard (internal/inputfile) all return it; the CLI exits 2 for every error that matches
// ErrRefused (cmd/nodecache exitCode; docs/contracts.md, "Exit codes": 2 usage or input refused).
package refusal

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrRefused matches every *Error with errors.Is. bootstrap.ErrRefused and warm.ErrRefused are
// this value.
var ErrRefused = errors.New("input refused")

// Error is refused input: where it came from and why.
type Error struct {
	// Source names the input as the user knows it: a flag with the value given
	// (`--platform "linux/arm"`), a file (a host path, or a flag and the file it named), or ""
	// when Reason names it itself.
	Source string
	// Reason says what is wrong and what is accepted, worded to follow Source when there is one:
	// "is a directory; want a PEM file: a regular file of at most 1 MiB".
	Reason string
	// Err is a cause callers may branch on with errors.Is or errors.As, or nil; it is not part
	// of the message.
	Err error
}

// Error returns Source and Reason joined by a space, or Reason alone when Source is "".
func (e *Error) Error() string {
	if e.Source == "" {
		return e.Reason
	}
	return e.Source + " " + e.Reason
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is ErrRefused.
func (e *Error) Is(target error) bool { return target == ErrRefused }

// Errorf returns an *Error whose Reason is the text formatted as fmt.Sprintf does (no %w: a
// refusal's cause goes in Err), for a message that names its flag or file itself:
// Errorf("--mirror-ca %q: want an absolute path", p).
func Errorf(format string, args ...any) error {
	return &Error{Reason: fmt.Sprintf(format, args...)}
}

// Value refuses value given as what (a flag such as "--platform", or a kind of input such as
// "image reference"): the message is `what "value" refused: reason`, the value quoted as Go
// quotes strings (strconv.Quote) so that control characters and spaces show.
func Value(what, value, reason string) error {
	return &Error{Source: what + " " + strconv.Quote(value), Reason: "refused: " + reason}
}
