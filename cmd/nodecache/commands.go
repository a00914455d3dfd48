package main

import (
	"runtime"
	"strings"

	"github.com/urfave/cli/v2"
)

func commands() []*cli.Command {
	cmds := []*cli.Command{
		serveCommand(),
		genCommand(),
		warmCommand(),
		statusCommand(),
		agentCommand(),
		versionCommand(),
	}
	for _, c := range cmds {
		refuseUnknownSubcommands(c)
	}
	guardLinuxOnly(cmds, runtime.GOOS)
	return cmds
}

// refuseUnknownSubcommands makes a command with subcommands show its help when called bare and
// refuse an unknown subcommand with exit 2 (urfave/cli would exit 3, which means "status cannot
// tell" here).
func refuseUnknownSubcommands(cmd *cli.Command) {
	if len(cmd.Subcommands) == 0 || cmd.Action != nil {
		return
	}
	var names []string
	for _, s := range cmd.Subcommands {
		names = append(names, s.Name)
	}
	cmd.Action = func(c *cli.Context) error {
		if c.Args().Present() {
			return usagef("unknown command %q for %s; want one of: %s", c.Args().First(), cmd.Name, strings.Join(names, ", "))
		}
		return cli.ShowSubcommandHelp(c)
	}
}
