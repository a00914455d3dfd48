package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/refusal"
)

// Exit codes shared by every command (docs/contracts.md, "Exit codes").
const (
	exitOK       = 0 // served, generated, warm, ACTIVE
	exitNegative = 1 // ran, answer negative or failed
	exitUsage    = 2 // usage or input refused; nothing was changed
	exitUnknown  = 3 // status cannot tell
)

// exitError carries an exit code with the error that caused it.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usagef returns an error that exits 2: the input was refused and nothing was changed.
func usagef(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// withCode attaches an exit code to err (nil stays nil).
func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// silentExit exits with code and prints nothing more: the command already reported its answer.
func silentExit(code int) error {
	if code == exitOK {
		return nil
	}
	return &exitError{code: code, err: errSilent}
}

var errSilent = errors.New("")

// usageError turns urfave/cli's flag errors into exit 2 with words (clitext.FlagError).
func usageError(c *cli.Context, err error, _ bool) error {
	flags, where := c.App.Flags, "nodecache"
	if c.Command != nil && c.Command.Name != "" {
		flags, where = c.Command.Flags, c.Command.HelpName
	}
	return &exitError{code: exitUsage, err: clitext.FlagError(err, flags, where)}
}

// report prints err (if any) and returns the process exit code for it (exitCode).
func report(w io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	if !errors.Is(err, errSilent) && err.Error() != "" {
		fmt.Fprintf(w, "nodecache: %v\n", err)
	}
	return exitCode(err)
}

// exitCode is the process exit code for err, a command's failure (not nil): the code an
// exitError in it carries (withCode, usagef, silentExit), else 2 for refused input
// (refusal.ErrRefused: bootstrap, warm, status and agent options, files of the wrong type or
// size) and for a --root another process holds (mirror.ErrRootInUse), else the code of a
// cli.ExitCoder, else 1. This is the one place a refusal becomes exit 2: commands return it as
// it is.
func exitCode(err error) int {
	var ee *exitError
	var ce cli.ExitCoder
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, refusal.ErrRefused), errors.Is(err, mirror.ErrRootInUse):
		return exitUsage
	case errors.As(err, &ce):
		return ce.ExitCode()
	}
	return exitNegative
}
