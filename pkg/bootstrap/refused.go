package bootstrap

import (
	"errors"
	"fmt"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// ErrRefused marks input that a generator refuses: a config file it must not touch, a flag
// combination that cannot work. Nothing was changed. The CLI maps it to exit code 2.
var ErrRefused = errors.New("refused")

// RefusedError is a refusal with the reason shown to the user. errors.Is(err, ErrRefused) is true.
type RefusedError struct {
	// Reason says what was refused and what to do instead.
	Reason string
	// Err is the refusal's cause when it has one callers branch on (an *inputfile.Error from
	// RefusedInput); nil otherwise.
	Err error
}

func (e *RefusedError) Error() string { return e.Reason }

// Unwrap returns Err.
func (e *RefusedError) Unwrap() error { return e.Err }

// Is reports ErrRefused.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Refusedf returns a *RefusedError with a formatted reason.
func Refusedf(format string, args ...any) error {
	return &RefusedError{Reason: fmt.Sprintf(format, args...)}
}

// RefusedInput turns a refusal of package inputfile (a file of the wrong type or over its size
// limit) into a *RefusedError naming the file as the user knows it, name (a host path, a flag
// and its value); it matches inputfile.ErrRefused too. Other errors, nil included, are returned
// unchanged.
func RefusedInput(name string, err error) error {
	var ie *inputfile.Error
	if !errors.As(err, &ie) {
		return err
	}
	named := *ie
	named.Path = name
	return &RefusedError{Reason: named.Error(), Err: &named}
}
