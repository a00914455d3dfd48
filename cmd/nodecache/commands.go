package main

import (
	"io"
	"runtime"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/clitext"
)

func commands() []*cli.Command {
	cmds := []*cli.Command{
		serveCommand(),
		genCommand(),
		warmCommand(),
		statusCommand(),
		agentCommand(),
		cacheCommand(),
		versionCommand(),
		completionCommand(),
	}
	for _, c := range cmds {
		refuseBadInput(c)
	}
	guardLinuxOnly(cmds, runtime.GOOS)
	return cmds
}

// refuseBadInput gives cmd and its subcommands main's usage error for a flag they lack (exit 2,
// one line, nothing on stdout), and makes a command with subcommands show its help on stderr when
// called bare and refuse that, and an unknown subcommand, with exit 2 (urfave/cli would exit 3,
// which means "status cannot tell" here).
func refuseBadInput(cmd *cli.Command) {
	cmd.OnUsageError = usageError
	for _, s := range cmd.Subcommands {
		refuseBadInput(s)
	}
	if len(cmd.Subcommands) == 0 || cmd.Action != nil {
		return
	}
	names := clitext.CommandNames(cmd.Subcommands)
	unknown := func(typed string) error {
		return usagef("unknown command %q for %s%s want one of: %s", typed, cmd.Name, clitext.DidYouMean(typed, names), strings.Join(names, ", "))
	}
	cmd.Action = func(c *cli.Context) error {
		if c.Args().Present() {
			return unknown(c.Args().First())
		}
		return helpOnStderr(c, cli.ShowSubcommandHelp)
	}
	cmd.Before = clitext.RefuseHelpTopic(func(_ *cli.Context, topic string) error {
		if cmd.Command(topic) != nil {
			return nil
		}
		return unknown(topic)
	})
}

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print the shell completion script for bash, zsh or fish",
		ArgsUsage: "bash|zsh|fish",
		Description: `Load it in the running shell, e.g. source <(nodecache completion bash), or save it where
the shell looks: /etc/bash_completion.d/nodecache, _nodecache in a directory of $fpath,
~/.config/fish/completions/nodecache.fish.`,
		Action: func(c *cli.Context) error {
			shell := c.Args().First()
			if c.Args().Len() != 1 {
				return usagef("completion takes one shell: %s", strings.Join(clitext.Shells, ", "))
			}
			fish, err := c.App.ToFishCompletion()
			if err != nil {
				return withCode(exitNegative, err)
			}
			script, err := clitext.Completion(shell, fish)
			if err != nil {
				return usagef("completion: %v%s", err, strings.TrimSuffix(clitext.DidYouMean(shell, clitext.Shells), ";"))
			}
			_, err = io.WriteString(c.App.Writer, script)
			return err
		},
	}
}
