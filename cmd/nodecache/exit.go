package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
	"github.com/nodecache/nodecache/pkg/bootstrap"
	"github.com/nodecache/nodecache/pkg/mirror"
)

// Exit codes shared by every command (DESIGN.md, Contracts: exit codes).
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

// startCode is the exit code of a serve or agent run that failed with err: 2 for input refused
// and for a --root another process holds, else 1.
func startCode(err error) int {
	if errors.Is(err, bootstrap.ErrRefused) || errors.Is(err, mirror.ErrRootInUse) {
		return exitUsage
	}
	return exitNegative
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

// report prints err (if any) and returns the process exit code for it.
func report(w io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	code := exitNegative
	var ee *exitError
	var ce cli.ExitCoder
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case errors.As(err, &ce):
		code = ce.ExitCode()
	}
	if !errors.Is(err, errSilent) && err.Error() != "" {
		fmt.Fprintf(w, "nodecache: %v\n", err)
	}
	return code
}
