package main

import (
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/nodecache/nodecache/internal/clitext"
)

// Every flag can also be set from the environment as NODECACHE_<FLAG_NAME_IN_UPPER_SNAKE> and from
// the YAML file named by --config (keys are flag names). Precedence: flag > env > file > default.
// Each flag is bound to a field of the command's typed config (Destination); list flags are
// copied into theirs once the settings file is read.

const configFlag = "config"

func envVars(name string) []string {
	return []string{"NODECACHE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

func stringFlag(dst *string, name, value, usage string, aliases ...string) cli.Flag {
	return altsrc.NewStringFlag(&cli.StringFlag{Name: name, Aliases: aliases, Value: value, Usage: usage, EnvVars: envVars(name), Destination: dst})
}

func boolFlag(dst *bool, name, usage string) cli.Flag {
	return &clitext.BoolFlag{BoolFlag: altsrc.NewBoolFlag(&cli.BoolFlag{Name: name, Usage: usage, EnvVars: envVars(name), Destination: dst})}
}

func intFlag(dst *int, name string, value int, usage string) cli.Flag {
	return &clitext.IntFlag{IntFlag: altsrc.NewIntFlag(&cli.IntFlag{Name: name, Value: value, Usage: usage, EnvVars: envVars(name), Destination: dst})}
}

func durationFlag(dst *time.Duration, name string, value time.Duration, usage string) cli.Flag {
	return &clitext.DurationFlag{DurationFlag: altsrc.NewDurationFlag(&cli.DurationFlag{Name: name, Value: value, Usage: usage, EnvVars: envVars(name), Destination: dst})}
}

// listFlag is a repeatable string flag bound to dst (set by withConfig's Before).
type listFlag struct {
	*altsrc.StringSliceFlag
	dst *[]string
}

func stringSliceFlag(dst *[]string, name string, value []string, usage string) cli.Flag {
	f := &cli.StringSliceFlag{Name: name, Usage: usage, EnvVars: envVars(name)}
	if len(value) > 0 {
		f.Value = cli.NewStringSlice(value...)
	}
	return &listFlag{StringSliceFlag: altsrc.NewStringSliceFlag(f), dst: dst}
}

// withConfig adds --config and the flag > env > file > default precedence to a command, binds
// the list flags, and turns flag errors into exit code 2.
func withConfig(cmd *cli.Command) *cli.Command {
	env := envVars(configFlag)[0] // read by clitext.Settings, not as EnvVars: see there
	cmd.Flags = append(cmd.Flags, &cli.StringFlag{
		Name:  configFlag,
		Usage: "YAML settings `FILE`; keys are this command's flag names (lists as YAML sequences). $" + env + " names one file for every command, which ignores the keys of other commands' flags",
	})
	load := altsrc.InitInputSourceWithContext(cmd.Flags, altsrc.NewYamlSourceFromFlagFunc(configFlag))
	takesArgs, action := cmd.ArgsUsage != "", cmd.Action
	var origins *clitext.Origins // where values not on the command line came from, for errors
	cmd.Action = func(c *cli.Context) error { return origins.Explain(action(c)) }
	cmd.Before = func(c *cli.Context) error {
		if !takesArgs && c.Args().Present() {
			return usagef("%s takes no arguments, got %q (see %s --help)", strings.TrimPrefix(c.Command.HelpName, "nodecache "), c.Args().First(), c.Command.HelpName)
		}
		if err := clitext.EnvError(c, cmd.Flags); err != nil {
			return usagef("%v", err)
		}
		origins = clitext.NewOrigins(c, cmd, configFlag, env)
		if err := clitext.Settings(c, cmd, configFlag, env, load); err != nil {
			return usagef("%v", err)
		}
		for _, f := range cmd.Flags {
			if l, ok := f.(*listFlag); ok {
				*l.dst = c.StringSlice(l.Name)
			}
		}
		return nil
	}
	return cmd
}

// logConfig is --log-format and --log-level; out is where lines go (default os.Stderr).
type logConfig struct {
	format, level string
	out           *os.File
}

// logFlags are --log-format and --log-level. serve and agent log JSON by default (for log
// collectors); gen, status and warm (human) log console lines when stderr is a terminal and
// JSON otherwise.
func logFlags(lc *logConfig, human bool) []cli.Flag {
	format, usage := "json", "log line `FORMAT`: json or console"
	if human {
		format, usage = "", "log line `FORMAT`: json or console (default: console when stderr is a terminal, else json)"
	}
	return []cli.Flag{
		stringFlag(&lc.format, "log-format", format, usage),
		stringFlag(&lc.level, "log-level", "info", "lowest `LEVEL` logged: trace, debug, info, warn, error"),
	}
}

// logger builds the process logger (clitext.NewLogger) on out, default stderr.
func (lc logConfig) logger() (zerolog.Logger, error) {
	out := lc.out
	if out == nil {
		out = os.Stderr
	}
	l, err := clitext.NewLogger(lc.format, lc.level, out)
	return l, withCode(exitUsage, err)
}

// outputFormat validates --output (clitext.CheckOutput); a bad one exits 2.
func outputFormat(o string) error { return withCode(exitUsage, clitext.CheckOutput(o)) }
