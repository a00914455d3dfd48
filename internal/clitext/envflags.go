package clitext

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
)

// DurationFlag, IntFlag and BoolFlag are altsrc's flags whose environment variable yields to the
// command line, so that the precedence flag > env > file > default holds for a malformed value
// too: urfave/cli parses the variable while it sets the flags up, before it reads the command
// line, and refuses a value that does not parse even when the flag is given. Here such a value
// is passed over while the flags are set up, and EnvError refuses it afterwards unless the flag
// was given on the command line.
type (
	DurationFlag struct{ *altsrc.DurationFlag }
	IntFlag      struct{ *altsrc.IntFlag }
	BoolFlag     struct{ *altsrc.BoolFlag }
)

// Apply sets the flag up in set (cli.Flag), passing over a malformed environment value.
func (f *DurationFlag) Apply(set *flag.FlagSet) error {
	return applyEnvLast(&f.EnvVars, Duration, func() error { return f.DurationFlag.Apply(set) })
}

// Apply sets the flag up in set (cli.Flag), passing over a malformed environment value.
func (f *IntFlag) Apply(set *flag.FlagSet) error {
	return applyEnvLast(&f.EnvVars, Number, func() error { return f.IntFlag.Apply(set) })
}

// Apply sets the flag up in set (cli.Flag), passing over a malformed environment value.
func (f *BoolFlag) Apply(set *flag.FlagSet) error {
	return applyEnvLast(&f.EnvVars, Boolean, func() error { return f.BoolFlag.Apply(set) })
}

// applyEnvLast runs apply with the flag's environment variables hidden when the one urfave/cli
// would read holds a value that does not parse as k.
func applyEnvLast(envs *[]string, k Kind, apply func() error) error {
	if _, _, bad := badEnv(*envs, k); bad {
		saved := *envs
		*envs = nil
		defer func() { *envs = saved }()
	}
	return apply()
}

// badEnv returns the first of envs that is set (the one urfave/cli reads) and its value, and
// whether that value is not empty and does not parse as k (as urfave/cli would parse it).
func badEnv(envs []string, k Kind) (name, value string, bad bool) {
	for _, name := range envs {
		value, ok := os.LookupEnv(name)
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		if value == "" {
			return name, value, false
		}
		var err error
		switch k {
		case Duration:
			_, err = time.ParseDuration(value)
		case Number:
			_, err = strconv.ParseInt(value, 0, 64)
		case Boolean:
			_, err = strconv.ParseBool(value)
		}
		return name, value, err != nil
	}
	return "", "", false
}

// EnvError refuses the environment values of flags that do not parse, each in the words of the
// flag form: `NODECACHE_UPSTREAM_TIMEOUT="abc" (--upstream-timeout): want a duration such as
// 500ms, 30s, 5m or 1h30m`. A flag given on the command line wins, and its variable is not
// looked at. Call it once the command line is parsed and before a settings file is read (its
// values count as set, too).
func EnvError(c *cli.Context, flags []cli.Flag) error {
	var msgs []string
	for _, f := range flags {
		e, ok := f.(interface{ GetEnvVars() []string })
		if !ok {
			continue
		}
		name, value, bad := badEnv(e.GetEnvVars(), KindOf(f))
		if !bad || c.IsSet(f.Names()[0]) {
			continue
		}
		msgs = append(msgs, fmt.Sprintf("%s=%q (--%s): want %s", name, value, f.Names()[0], KindOf(f).Accepts()))
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}
