package main

// Placeholders for commands whose packages are still being written; each is replaced by its own
// file (gen.go, warm.go, status.go, agent.go) in the commit that lands it.

import (
	"errors"

	"github.com/urfave/cli/v2"
)

func placeholder(name, usage string) *cli.Command {
	return &cli.Command{Name: name, Usage: usage, Hidden: true, Action: func(*cli.Context) error {
		return errors.New(name + " is not available in this build")
	}}
}
