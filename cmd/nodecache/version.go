package main

import (
	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/internal/clitext"
)

func versionCommand() *cli.Command {
	var output string
	return &cli.Command{
		Name:  "version",
		Usage: "print the nodecache version, commit, and the Talos machinery, containerd and distribution versions built in",
		Description: `Text (default) is one "name  value" line each; --output json is one object:
   {"version", "commit", "go", "platform", "talos_machinery", "containerd", "distribution"}
The library versions are the Go module versions linked into this binary.`,
		Flags: []cli.Flag{stringFlag(&output, "output", "text", "output `FORMAT`: text or json")},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("version takes no arguments, got %q", c.Args().First())
			}
			if err := outputFormat(output); err != nil {
				return err
			}
			return clitext.Render(c.App.Writer, output, buildinfo.Read())
		},
	}
}
