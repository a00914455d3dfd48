package clitext

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"

	"github.com/nodecache/nodecache/internal/inputfile"
)

// Origins tells, for one run of a command, which of its settings came from outside its command
// line: an environment variable (NODECACHE_<FLAG>) or a key of the settings file that the
// environment names for every command (NODECACHE_CONFIG). Explain adds that to an error naming
// such a flag, so a value the user never typed is traced to where it was set.
type Origins struct {
	env  map[string]string // flag name -> the variable its value came from
	file map[string]bool   // flag names whose value came from the shared file
	set  map[string]bool   // flag names given on the command line or by the environment
	// from is "NODECACHE_CONFIG=FILE" when the shared file is read, else "".
	from string
	// others are the shared file's keys of other commands' flags, with their values.
	others map[string]any
}

// NewOrigins records where cmd's settings come from. Call it in Before, once the command line is
// parsed and before the settings file is loaded (a file value then counts as set). configFlag
// is the --config flag and configEnv the variable naming the shared file; a file named with
// --config is the user's own choice on the command line and is not traced.
func NewOrigins(c *cli.Context, cmd *cli.Command, configFlag, configEnv string) *Origins {
	o := &Origins{env: map[string]string{}, file: map[string]bool{}, set: map[string]bool{}, others: map[string]any{}}
	for _, f := range cmd.Flags {
		name := f.Names()[0]
		o.set[name] = c.IsSet(name)
		e, ok := f.(interface{ GetEnvVars() []string })
		if !ok {
			continue
		}
		for _, v := range e.GetEnvVars() {
			if val, set := os.LookupEnv(v); set && strings.TrimSpace(val) != "" && c.IsSet(name) && holds(c, name, KindOf(f), val) {
				o.env[name] = v
				break
			}
		}
	}
	file := os.Getenv(configEnv)
	if c.String(configFlag) != "" || file == "" {
		return o
	}
	b, err := inputfile.Read(file, inputfile.Settings)
	var doc map[string]any
	if err != nil || yaml.Unmarshal(b, &doc) != nil {
		return o // Settings refuses the file with the reason
	}
	o.from = configEnv + "=" + file
	for k, v := range doc {
		switch f := flagNamed(cmd.Flags, k); {
		case f == nil:
			o.others[k] = v
		case !c.IsSet(k):
			o.file[f.Names()[0]] = true
		}
	}
	return o
}

// holds reports whether the flag's value in c is what the environment value val gives (so the
// command line did not replace it).
func holds(c *cli.Context, name string, k Kind, val string) bool {
	val = strings.TrimSpace(val)
	switch k {
	case Duration:
		d, err := time.ParseDuration(val)
		return err == nil && c.Duration(name) == d
	case Number:
		n, err := strconv.ParseInt(val, 0, 64)
		return err == nil && int64(c.Int(name)) == n
	case Boolean:
		b, err := strconv.ParseBool(val)
		return err == nil && c.Bool(name) == b
	case List:
		var parts []string
		for _, p := range strings.Split(val, ",") {
			parts = append(parts, strings.TrimSpace(p))
		}
		return slices.Equal(c.StringSlice(name), parts)
	}
	return c.String(name) == val
}

func flagNamed(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}

// Explain returns err with where the flags it names (as --flag) got their values, when that
// was not the command line: "(--upstream: from NODECACHE_CONFIG=/etc/nodecache.yaml)",
// "(--mirror: from NODECACHE_MIRROR)". A flag it names that kept its default while the shared
// file sets another command's key of a related name (serve's listen for --listen-url) gets a
// hint to set the key this command reads. nil and errors naming no such flag are returned as
// they are; the result wraps err.
func (o *Origins) Explain(err error) error {
	if o == nil || err == nil {
		return err
	}
	msg := err.Error()
	notes := append(o.originNotes(msg), o.keyHints(msg)...)
	if len(notes) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(slices.Compact(notes), "; "))
}

// originNotes say where each flag msg names got its value, when from the environment or the
// file, in flag order.
func (o *Origins) originNotes(msg string) []string {
	var notes []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range o.env {
			if !yield(n) {
				return
			}
		}
		for n := range o.file {
			if !yield(n) {
				return
			}
		}
	}) {
		if !namesFlag(msg, name) {
			continue
		}
		if v, ok := o.env[name]; ok {
			notes = append(notes, fmt.Sprintf("--%s: from %s", name, v))
		} else {
			notes = append(notes, fmt.Sprintf("--%s: from %s", name, o.from))
		}
	}
	return notes
}

// keyHints are the hints for the flags msg names that kept their default while the file sets
// another command's key of a related name, in key order.
func (o *Origins) keyHints(msg string) []string {
	var notes []string
	for _, key := range slices.Sorted(func(yield func(string) bool) {
		for k := range o.others {
			if !yield(k) {
				return
			}
		}
	}) {
		for _, name := range relatedFlags(msg, key) {
			if given, ours := o.set[name]; !ours || given || o.file[name] {
				continue // another command's flag, or a value the user gave
			}
			notes = append(notes, fmt.Sprintf("%s sets %s: %v, another command's key, but not %s, which this command reads: add %s to it", o.from, key, o.others[key], name, name))
		}
	}
	return notes
}

// namesFlag reports whether msg names --name as a whole flag (not --name-more).
func namesFlag(msg, name string) bool {
	needle := "--" + name
	for i := strings.Index(msg, needle); i >= 0; {
		end := i + len(needle)
		if end == len(msg) || !(msg[end] == '-' || msg[end] >= 'a' && msg[end] <= 'z' || msg[end] >= '0' && msg[end] <= '9') {
			return true
		}
		j := strings.Index(msg[end:], needle)
		if j < 0 {
			return false
		}
		i = end + j
	}
	return false
}

// relatedFlags are the flags msg names whose name extends key or that key extends by a dash
// part (listen-url and listen).
func relatedFlags(msg, key string) []string {
	var out []string
	rest := msg
	for {
		i := strings.Index(rest, "--")
		if i < 0 {
			return out
		}
		rest = rest[i+2:]
		end := strings.IndexFunc(rest, func(r rune) bool { return !(r == '-' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') })
		if end < 0 {
			end = len(rest)
		}
		name := rest[:end]
		if name != key && (strings.HasPrefix(name, key+"-") || strings.HasPrefix(key, name+"-")) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
}
