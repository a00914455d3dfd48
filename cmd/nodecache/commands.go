package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/buildinfo"
)

func commands() []*cli.Command {
	return []*cli.Command{
		serveCommand(),
		genCommand(),
		warmCommand(),
		statusCommand(),
		agentCommand(),
		versionCommand(),
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the nodecache version",
		Action: func(c *cli.Context) error {
			_, err := fmt.Fprintln(c.App.Writer, buildinfo.Version())
			return err
		},
	}
}
