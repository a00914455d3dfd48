package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
)

// Every flag can also be set from the environment as NODECACHE_<FLAG_NAME_IN_UPPER_SNAKE> and from
// the YAML file named by --config (keys are flag names). Precedence: flag > env > file > default.

const configFlag = "config"

func envVars(name string) []string {
	return []string{"NODECACHE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

func stringFlag(name, value, usage string) cli.Flag {
	return altsrc.NewStringFlag(&cli.StringFlag{Name: name, Value: value, Usage: usage, EnvVars: envVars(name)})
}

func stringSliceFlag(name string, value []string, usage string) cli.Flag {
	f := &cli.StringSliceFlag{Name: name, Usage: usage, EnvVars: envVars(name)}
	if len(value) > 0 {
		f.Value = cli.NewStringSlice(value...)
	}
	return altsrc.NewStringSliceFlag(f)
}

func boolFlag(name, usage string) cli.Flag {
	return altsrc.NewBoolFlag(&cli.BoolFlag{Name: name, Usage: usage, EnvVars: envVars(name)})
}

func intFlag(name string, value int, usage string) cli.Flag {
	return altsrc.NewIntFlag(&cli.IntFlag{Name: name, Value: value, Usage: usage, EnvVars: envVars(name)})
}

func durationFlag(name string, value time.Duration, usage string) cli.Flag {
	return altsrc.NewDurationFlag(&cli.DurationFlag{Name: name, Value: value, Usage: usage, EnvVars: envVars(name)})
}

// withConfig adds --config and the flag > env > file > default precedence to a command, and turns
// flag errors into exit code 2.
func withConfig(cmd *cli.Command) *cli.Command {
	cmd.Flags = append(cmd.Flags, &cli.StringFlag{
		Name:    configFlag,
		Usage:   "YAML settings `FILE`; keys are flag names (e.g. \"listen: :5000\", lists as YAML sequences)",
		EnvVars: envVars(configFlag),
	})
	load := altsrc.InitInputSourceWithContext(cmd.Flags, altsrc.NewYamlSourceFromFlagFunc(configFlag))
	known := map[string]bool{}
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			known[n] = true
		}
	}
	takesArgs := cmd.ArgsUsage != ""
	cmd.Before = func(c *cli.Context) error {
		if !takesArgs && c.Args().Present() {
			return usagef("%s takes no arguments, got %q (flags go before arguments; see nodecache %s --help)", cmd.Name, c.Args().First(), cmd.Name)
		}
		file := c.String(configFlag)
		if file == "" {
			return nil
		}
		if err := checkConfigKeys(file, known); err != nil {
			return usagef("--config %s: %v", file, err)
		}
		if err := load(c); err != nil {
			return usagef("--config %s: %v", file, err)
		}
		return nil
	}
	cmd.OnUsageError = usageError
	return cmd
}

// checkConfigKeys refuses a settings file whose top-level keys are not flag names of the
// command (a typo would otherwise be ignored silently).
func checkConfigKeys(file string, known map[string]bool) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("not a YAML mapping of flag names to values: %w", err)
	}
	var unknown []string
	for k := range doc {
		if !known[k] || k == configFlag {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("unknown keys %s: keys are this command's flag names without dashes (see --help)", strings.Join(unknown, ", "))
	}
	return nil
}

func logFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag("log-format", "json", "log line format: json or console"),
		stringFlag("log-level", "info", "lowest level logged: trace, debug, info, warn, error"),
	}
}

// newLogger builds the process logger from --log-format and --log-level; it writes to stderr.
func newLogger(c *cli.Context) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(strings.ToLower(c.String("log-level")))
	if err != nil || c.String("log-level") == "" {
		return zerolog.Nop(), usagef("--log-level %q: want one of trace, debug, info, warn, error", c.String("log-level"))
	}
	var l zerolog.Logger
	switch c.String("log-format") {
	case "json":
		l = zerolog.New(os.Stderr)
	case "console":
		l = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05.000", NoColor: !isTerminal(os.Stderr)})
	default:
		return zerolog.Nop(), usagef("--log-format %q: want json or console", c.String("log-format"))
	}
	return l.Level(level).With().Timestamp().Logger(), nil
}

// isTerminal reports whether f is a terminal (colours and progress bars only there): go-isatty,
// so /dev/null and other character devices that are not terminals do not count.
func isTerminal(f *os.File) bool {
	return isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())
}

// outputFormat validates --output.
func outputFormat(c *cli.Context) (string, error) {
	switch o := c.String("output"); o {
	case "text", "json":
		return o, nil
	default:
		return "", usagef("--output %q: want text or json", o)
	}
}
