package clitext

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
	"gopkg.in/yaml.v3"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// KindOf is the kind of value flag f takes.
func KindOf(f cli.Flag) Kind {
	switch f.(type) {
	case *DurationFlag, *altsrc.DurationFlag, *cli.DurationFlag:
		return Duration
	case *IntFlag, *altsrc.IntFlag, *cli.IntFlag:
		return Number
	case *BoolFlag, *altsrc.BoolFlag, *cli.BoolFlag:
		return Boolean
	}
	if s, ok := f.(interface{ IsSliceFlag() bool }); ok && s.IsSliceFlag() {
		return List
	}
	return Text
}

// CheckSettings refuses a YAML settings file whose top-level keys are not names of flags (a
// typo would otherwise be ignored silently; a close one is named: "lsiten (did you mean
// listen?)") or whose values are of the wrong kind (CheckValues: said in words, not as Go
// types). skip is a flag name that is no key (the --config flag itself). shared names the flags
// of the other commands when the file is one several commands read (NODECACHE_CONFIG): their
// keys are then ignored, not refused; nil when the file is this command's alone.
func CheckSettings(file string, flags []cli.Flag, skip string, shared []string) error {
	b, err := inputfile.Read(file, inputfile.Settings)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("not a YAML mapping of flag names to values: %w", err)
	}
	kinds, names := map[string]Kind{}, []string{}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != skip {
				kinds[n], names = KindOf(f), append(names, n)
			}
		}
	}
	var unknown []string
	for k := range doc {
		if _, ok := kinds[k]; !ok && !slices.Contains(shared, k) {
			if s := Suggest(k, append(names, shared...)); s != "" {
				k += " (did you mean " + s + "?)"
			}
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("unknown keys %s: keys are this command's flag names without dashes (see --help)", strings.Join(unknown, ", "))
	}
	return CheckValues(doc, kinds)
}

// Settings reads cmd's settings file into c through load (altsrc's loader of the file the flag
// named flag holds). The file is the one --<flag> names, checked strictly (CheckSettings); else
// the one the environment variable env names, which reaches every command of c.App (serve's
// settings and a `cache ls` in the same shell or pod): there the keys of other commands' flags
// are ignored. No file, no error. Errors name the source: `--config FILE: …` or
// `NODECACHE_CONFIG=FILE: …`.
func Settings(c *cli.Context, cmd *cli.Command, flag, env string, load cli.BeforeFunc) error {
	file, from, shared := c.String(flag), "--"+flag+" ", []string(nil)
	if v := os.Getenv(env); file == "" && v != "" {
		file, from, shared = v, env+"=", otherFlagNames(c.App, cmd)
		if err := c.Set(flag, file); err != nil {
			return fmt.Errorf("%s%s: %w", from, file, err)
		}
	}
	if file == "" {
		return nil
	}
	if err := CheckSettings(file, cmd.Flags, flag, shared); err != nil {
		return fmt.Errorf("%s%s: %w", from, file, err)
	}
	if err := load(c); err != nil {
		return fmt.Errorf("%s%s: %w", from, file, err)
	}
	return nil
}

// otherFlagNames are the flag names of app's commands other than cmd, subcommands included;
// never nil.
func otherFlagNames(app *cli.App, cmd *cli.Command) []string {
	names := []string{}
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, o := range cmds {
			if o != cmd {
				for _, f := range o.Flags {
					names = append(names, f.Names()...)
				}
			}
			walk(o.Subcommands)
		}
	}
	if app != nil {
		walk(app.Commands)
	}
	return names
}

// flagValueRE and unknownFlagRE match the flag package's reports (one dash, and no word on
// what is accepted).
var (
	flagValueRE   = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([A-Za-z0-9-]+): parse error$`)
	unknownFlagRE = regexp.MustCompile(`^flag provided but not defined: -+(.+)$`)
	needsValueRE  = regexp.MustCompile(`^flag needs an argument: -+(.+)$`)
	placeholderRE = regexp.MustCompile("`([^`]+)`")
)

// FlagError rewrites urfave/cli's flag errors in words: a value that does not parse becomes
// `--wait "abc": want a duration such as 500ms, 30s, 5m or 1h30m`; an unknown flag
// `unknown flag --lsiten: did you mean --listen?` (the closest of flags), else `... see
// <where> --help`; a flag given last without its value `--listen needs a value, e.g. --listen
// ADDR (see <where> --help)` (the placeholder of its usage). Other errors pass unchanged.
func FlagError(err error, flags []cli.Flag, where string) error {
	if m := needsValueRE.FindStringSubmatch(err.Error()); m != nil {
		value := "VALUE"
		for _, f := range flags {
			if d, ok := f.(cli.DocGenerationFlag); ok && slices.Contains(f.Names(), m[1]) {
				if p := placeholderRE.FindStringSubmatch(d.GetUsage()); p != nil {
					value = p[1]
				}
			}
		}
		return fmt.Errorf("%s needs a value, e.g. %s %s (see %s --help)", dashed(m[1]), dashed(m[1]), value, where)
	}
	if m := flagValueRE.FindStringSubmatch(err.Error()); m != nil {
		for _, f := range flags {
			if slices.Contains(f.Names(), m[2]) {
				return fmt.Errorf("--%s %q: want %s", m[2], m[1], KindOf(f).Accepts())
			}
		}
		return err
	}
	m := unknownFlagRE.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	var names []string
	for _, f := range flags {
		names = append(names, f.Names()...)
	}
	hint := "see " + where + " --help"
	if s := Suggest(m[1], names); s != "" {
		hint = "did you mean " + dashed(s) + "?"
	}
	return fmt.Errorf("unknown flag %s: %s", dashed(m[1]), hint)
}

// dashed writes a flag name as it is typed: -x for one letter, --name otherwise (the flag
// package reports either with one dash).
func dashed(name string) string {
	if len([]rune(name)) == 1 {
		return "-" + name
	}
	return "--" + name
}

// SplitList accepts repeated values and comma-separated lists alike (the environment and YAML
// settings give the latter): every element trimmed, empty ones dropped.
func SplitList(in []string) []string {
	var out []string
	for _, s := range in {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}
