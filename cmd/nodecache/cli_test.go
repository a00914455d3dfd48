package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/runtimetest"
	"github.com/nodecache/nodecache/pkg/bootstrap/bootstraptest"
)

// TestCLIMessages (issue 16): each usage message the CLI writes, asserted whole: suggestions for
// mistyped commands and flags, flag values that do not parse, settings-file keys and values of
// the wrong kind said in words (never Go type names), all with exit 2.
func TestCLIMessages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	typo := writeFile(t, dir, "typo.yaml", "lsiten: \":5000\"\n")
	kinds := writeFile(t, dir, "kinds.yaml", "listen: 5000\nupstream-timeout: abc\ntag-ttl: 5\nallow: 10.0.0.0/8\n")
	warmKinds := writeFile(t, dir, "warm.yaml", "concurrency: four\ntalos: \"yes\"\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"command", []string{"serv"}, `unknown command "serv": did you mean serve? commands: serve, gen, warm, status, agent, cache, version, completion (see nodecache --help)`},
		{"command far off", []string{"bogus"}, `unknown command "bogus"; commands: serve, gen, warm, status, agent, cache, version, completion (see nodecache --help)`},
		{"subcommand", []string{"gen", "contianerd"}, `unknown command "contianerd" for gen: did you mean containerd? want one of: talos, containerd, crio`},
		{"flag", []string{"serve", "--lsiten", ":5000"}, `unknown flag --lsiten: did you mean --listen?`},
		{"flag of a subcommand", []string{"gen", "containerd", "--dryrun"}, `unknown flag --dryrun: did you mean --dry-run?`},
		{"flag far off", []string{"serve", "--no-such-flag"}, `unknown flag --no-such-flag: see nodecache serve --help`},
		{"duration value", []string{"serve", "--upstream-timeout", "abc"}, `--upstream-timeout "abc": want a duration such as 500ms, 30s, 5m or 1h30m`},
		{"number value", []string{"warm", "--concurrency", "x", "nginx"}, `--concurrency "x": want a whole number such as 4`},
		{"settings key", []string{"serve", "--config", typo}, `--config ` + typo + `: unknown keys lsiten (did you mean listen?): keys are this command's flag names without dashes (see --help)`},
		{"settings values", []string{"serve", "--config", kinds}, `--config ` + kinds + `: key "allow": want a list (a YAML sequence such as ["a", "b"]), got the text "10.0.0.0/8"; ` +
			`key "listen": want text (quote it if it looks like a number or true/false), got the number 5000; ` +
			`key "tag-ttl": want a duration such as 500ms, 30s, 5m or 1h30m, got the number 5; ` +
			`key "upstream-timeout": want a duration such as 500ms, 30s, 5m or 1h30m, got the text "abc"`},
		{"settings values of warm", []string{"warm", "--config", warmKinds, "nginx"}, `--config ` + warmKinds + `: key "concurrency": want a whole number such as 4, got the text "four"; key "talos": want true or false, got the text "yes"`},
		{"short flag", []string{"warm", "-x"}, `unknown flag -x: see nodecache warm --help`},
		// newuser3 item 15: was "flag needs an argument: -listen" (one dash, no hint).
		{"flag without its value", []string{"serve", "--listen"}, `--listen needs a value, e.g. --listen ADDR (see nodecache serve --help)`},
		{"flag of a subcommand without its value", []string{"gen", "containerd", "--mirror"}, `--mirror needs a value, e.g. --mirror URL (see nodecache gen containerd --help)`},
		{"argument of gen talos", []string{"gen", "talos", "--mirror", "http://a:1", "extra"}, `gen talos takes no arguments, got "extra" (see nodecache gen talos --help)`},
		{"argument of cache ls", []string{"cache", "ls", "extra"}, `cache ls takes no arguments, got "extra" (see nodecache cache ls --help)`},
		{"completion shell", []string{"completion", "bsh"}, `completion: shell "bsh": want bash, zsh or fish: did you mean bash?`},
		{"completion without shell", []string{"completion"}, `completion takes one shell: bash, zsh, fish`},
		// newuser (fresh clone): version and completion printed urfave's "Incorrect Usage" and
		// their help on stdout and exited 1.
		{"flag of version", []string{"version", "--bogus"}, `unknown flag --bogus: see nodecache version --help`},
		{"flag of completion", []string{"completion", "--bogus"}, `unknown flag --bogus: see nodecache completion --help`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runApp(t, tc.args...)
			if code != exitUsage || stderr != "nodecache: "+tc.want+"\n" {
				t.Fatalf("exit %d, stderr %q\nwant exit 2 and %q", code, stderr, "nodecache: "+tc.want+"\n")
			}
			if goType := regexp.MustCompile(`\b(int|int64|string|bool|float64|interface|\[\]interface \{\})\b`); goType.MatchString(tc.want) && strings.Contains(tc.name, "settings") {
				t.Errorf("message names a Go type: %q", tc.want)
			}
		})
	}
}

// needShell returns the path of a shell the completion tests run; without it the test is
// skipped with the reason (and fails under CI=true, where .ci/build-tools.sh installs it).
func needShell(t *testing.T, name string) string {
	t.Helper()
	return runtimetest.Find(t, runtimetest.Tool{Name: name, Install: "apt-get install " + name})
}

// TestCompletionScripts: `nodecache completion bash|zsh|fish` prints scripts that complete
// commands and flags: bash and zsh by asking the binary (run here with the words typed so far),
// fish from urfave/cli's static script (fish's own complete -C).
func TestCompletionScripts(t *testing.T) {
	t.Parallel()
	path := "PATH=" + filepath.Dir(binary) + ":" + os.Getenv("PATH")
	script := func(t *testing.T, shell string) string {
		code, out, stderr := runApp(t, "completion", shell)
		if code != 0 || !strings.Contains(out, "nodecache") {
			t.Fatalf("completion %s: exit %d: %s", shell, code, stderr)
		}
		return out
	}
	run := func(t *testing.T, sh, prog, stdin string) []string {
		cmd := exec.Command(sh, "-c", prog)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Env = append(os.Environ(), path)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", sh, err, out)
		}
		return strings.Fields(string(out))
	}
	cases := []struct {
		line []string
		want string
	}{
		{[]string{"nodecache", "se"}, "serve"},
		{[]string{"nodecache", "serve", "--li"}, "--listen"},
		{[]string{"nodecache", "gen", "co"}, "containerd"},
	}
	for _, sh := range []struct {
		name string
		// prog is the shell code that, given the script on stdin, prints the candidates for line.
		prog func(line []string) string
		// exact: the candidates are want alone (bash filters them by the typed prefix); else want
		// is among them.
		exact bool
	}{
		{"bash", func(line []string) string {
			return `source /dev/stdin; COMP_WORDS=(` + strings.Join(line, " ") + `); COMP_CWORD=` + strconv.Itoa(len(line)-1) +
				`; _nodecache_complete; printf '%s\n' "${COMPREPLY[@]}"`
		}, true},
		// compadd is zsh's to filter by the typed prefix; here it lists what it is offered.
		{"zsh", func(line []string) string {
			return `compdef() { :; }; source /dev/stdin; compadd() { shift; print -l -- ${(P)1}; }; words=(` + strings.Join(line, " ") +
				`); CURRENT=` + strconv.Itoa(len(line)) + `; _nodecache`
		}, false},
		// One candidate per line, its description after a tab; files of the working directory
		// may be offered too.
		{"fish", func(line []string) string {
			return `source; complete -C "` + strings.Join(line, " ") + `" | cut -f1`
		}, false},
	} {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			bin, s := needShell(t, sh.name), script(t, sh.name)
			for _, tc := range cases {
				got := run(t, bin, sh.prog(tc.line), s)
				if sh.exact && strings.Join(got, " ") != tc.want {
					t.Errorf("%v: %q, want %q", tc.line, got, tc.want)
				}
				if !sh.exact && !slices.Contains(got, tc.want) {
					t.Errorf("%v: offered %q, want %q among them", tc.line, got, tc.want)
				}
			}
		})
	}
}

// TestLogFormat: gen, status and warm log JSON when stderr is no terminal (here a pipe) and
// console lines with --log-format console; durations in log lines read like 3s, and the time
// keeps nanoseconds without zerolog's package-level TimeFieldFormat being set.
func TestLogFormat(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	args := []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--dry-run"}
	cmd := exec.Command(binary, args...)
	out, _ := cmd.CombinedOutput()
	var line map[string]any
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "{") && json.Unmarshal([]byte(l), &line) == nil && line["message"] == "containerd version unknown" {
			break
		}
		line = nil
	}
	if line == nil {
		t.Fatalf("no JSON log line 'containerd version unknown' on a pipe:\n%s", out)
	}
	if ts, _ := line["time"].(string); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z$`).MatchString(ts) {
		t.Errorf("time %q: want RFC 3339 with fractional seconds", ts)
	}
	out, _ = exec.Command(binary, append(args, "--log-format", "console")...).CombinedOutput()
	if !regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\.\d{3} WRN containerd version unknown error=`).Match(out) {
		t.Errorf("--log-format console: no console line:\n%s", out)
	}
}

// TestDryRunDiffPatches: the diff gen --dry-run prints (alone on stdout, in text) is a unified
// diff that `patch -p1` applies under the host root, and the result is byte for byte what gen writes, here for a
// config.toml without a final newline ("\ No newline at end of file") and new hosts.toml files.
func TestDryRunDiffPatches(t *testing.T) {
	t.Parallel()
	patch := runtimetest.Find(t, runtimetest.Patch)
	config := "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\""
	files := map[string]string{"/etc/containerd/config.toml": config}
	dry, real := bootstraptest.HostRoot(t, files), bootstraptest.HostRoot(t, files)
	args := func(root string) []string {
		return []string{"gen", "containerd", "--host-root", root, "--mirror", "http://10.0.0.5:5000", "--containerd-version", "1.7.27",
			"--upstream", "docker.io", "--upstream", "ghcr.io", "--log-level", "error"}
	}
	code, stdout, stderr := runApp(t, append(args(dry), "--dry-run", "--output", "json")...)
	var rep struct{ Diff string }
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil || !strings.Contains(rep.Diff, "\\ No newline at end of file\n") {
		t.Fatalf("dry run: exit %d, diff %q\n%s", code, rep.Diff, stderr)
	}
	// newuser2 item 14: in text, stdout is the diff alone (`gen --dry-run > x.patch`), the
	// summary lines go to stderr.
	code, text, summary := runApp(t, append(args(dry), "--dry-run")...)
	if code != 0 || text != rep.Diff || !strings.Contains(summary, "would update /etc/containerd/config.toml") || !strings.Contains(summary, "containerd config: ") {
		t.Fatalf("dry run in text: exit %d\nstdout %q\nwant the diff alone %q\nstderr %q", code, text, rep.Diff, summary)
	}
	cmd := exec.Command(patch, "-p1", "--batch", "--forward", "--no-backup-if-mismatch", "-d", dry)
	cmd.Stdin = strings.NewReader(rep.Diff)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("patch: %v\n%s\ndiff:\n%s", err, out, rep.Diff)
	}
	if code, _, stderr := runApp(t, args(real)...); code != 0 {
		t.Fatalf("gen: exit %d: %s", code, stderr)
	}
	for _, p := range []string{"etc/containerd/config.toml", "etc/containerd/certs.d/docker.io/hosts.toml", "etc/containerd/certs.d/ghcr.io/hosts.toml"} {
		want, err := os.ReadFile(filepath.Join(real, p))
		if err != nil {
			t.Fatal(err)
		}
		assertFile(t, filepath.Join(dry, p), want)
	}
}

// TestZerologSettingsUntouched: no non-test source sets zerolog's package-level settings
// (time format, duration unit, field names, global level): they are shared with every library
// in the process. Timestamps come from a hook on our own logger instead. Nor does any log a
// duration with zerolog's Dur (a float of milliseconds): durations read like 3s
// (clitext.Span); the access log's duration_ms is a documented number.
func TestZerologSettingsUntouched(t *testing.T) {
	t.Parallel()
	global := regexp.MustCompile(`zerolog\.(SetGlobalLevel\(|(TimeFieldFormat|TimestampFunc|DurationFieldUnit|DurationFieldInteger|TimestampFieldName|LevelFieldName|MessageFieldName|ErrorFieldName|CallerFieldName|ErrorStackMarshaler|ErrorMarshalFunc|InterfaceMarshalFunc)\s*=[^=])`)
	checked := 0
	for _, dir := range []string{"../../cmd", "../../pkg", "../../internal"} {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			checked++
			if m := global.Find(b); m != nil {
				t.Errorf("%s sets zerolog's package-level %q", p, m)
			}
			if m := regexp.MustCompile(`\.Durs?\("[^"]*"`).Find(b); m != nil {
				t.Errorf("%s logs a duration as milliseconds: %s; use .Str(key, clitext.Span(d))", p, m)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: run from cmd/nodecache", checked)
	}
}

// TestAgentFlags (issue 8 item 5): the agent takes gen's configure flags and refuses the ones
// that make no sense for a DaemonSet (--dry-run, --remove, --output) with exit 2.
func TestAgentFlags(t *testing.T) {
	t.Parallel()
	_, help, _ := runApp(t, "agent", "--help")
	for _, f := range []string{"--migrate", "--containerd-version", "--crio-version", "--no-reload", "--registries-dir", "--crio-dir", "--mirror-ca", "--certs-dir"} {
		if !regexp.MustCompile(`(?m)^\s+` + f + `\b`).MatchString(help) {
			t.Errorf("agent --help lacks %s", f)
		}
	}
	for _, f := range []string{"--dry-run", "--remove", "--output"} {
		code, _, stderr := runApp(t, "agent", f, "x")
		if want := "nodecache: unknown flag " + f + ": see nodecache agent --help\n"; code != exitUsage || stderr != want {
			t.Errorf("agent %s: exit %d, stderr %q; want 2 and %q", f, code, stderr, want)
		}
	}
}

// TestMissingCommand (newuser F4): a missing command is a usage error: the help goes to stderr
// and the exit code is 2; asking for help (--help) prints it on stdout and exits 0. (The help
// command is TestHelp's, run as a process: in-process it would make urfave/cli's shared help
// command its own subcommand, and the fish completion of a later app recurse without end.)
func TestMissingCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args     []string
		code     int
		helpOnto string // "stdout" or "stderr"
		want     string // a line of the help
	}{
		{nil, exitUsage, "stderr", "USAGE:"},
		{[]string{"gen"}, exitUsage, "stderr", "USAGE:\n   nodecache gen"},
		{[]string{"cache"}, exitUsage, "stderr", "USAGE:\n   nodecache cache"},
		{[]string{"--help"}, exitOK, "stdout", "USAGE:"},
		{[]string{"gen", "--help"}, exitOK, "stdout", "USAGE:\n   nodecache gen"},
	} {
		t.Run(strings.Join(append([]string{"nodecache"}, tc.args...), " "), func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runApp(t, tc.args...)
			help, other := stdout, stderr
			if tc.helpOnto == "stderr" {
				help, other = stderr, stdout
			}
			if code != tc.code || !strings.Contains(help, tc.want) || other != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q\nwant exit %d and the help (%q) on %s only", code, stdout, stderr, tc.code, tc.want, tc.helpOnto)
			}
		})
	}
}

// TestFlagMetavars (newuser F5): every flag that takes a value names what it takes in the help
// (--upstream-timeout DURATION, --log-format FORMAT, --storage TYPE), never urfave/cli's "value".
func TestFlagMetavars(t *testing.T) {
	t.Parallel()
	var walk func(path string, cmds []*cli.Command)
	check := func(path string, flags []cli.Flag) {
		for _, f := range flags {
			line := fmt.Sprint(f)
			if v, ok := f.(cli.DocGenerationFlag); ok && v.TakesValue() && strings.Contains(strings.SplitN(line, "\t", 2)[0], " value") {
				t.Errorf("%s: %q has no metavar (a `WORD` in its usage)", path, line)
			}
		}
	}
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			check(path+" "+c.Name, c.Flags)
			walk(path+" "+c.Name, c.Subcommands)
		}
	}
	app := newApp()
	check("nodecache", app.Flags)
	walk("nodecache", app.Commands)
	// The help shows it too (what the user reads).
	_, help, _ := runApp(t, "serve", "--help")
	for _, want := range []string{"--upstream-timeout DURATION", "--tag-ttl DURATION", "--fill-timeout DURATION", "--log-format FORMAT", "--log-level LEVEL", "--storage TYPE"} {
		if !strings.Contains(help, want) {
			t.Errorf("serve --help lacks %q:\n%s", want, help)
		}
	}
}

// TestEnvValues (newuser F9): an environment value that does not parse is refused in the words
// of the flag form, naming the variable (exit 2), unless the flag is given on the command line,
// which wins (flag > env > file > default). Not parallel: it sets the process environment.
func TestEnvValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string // stderr, whole
	}{
		{"duration", map[string]string{"NODECACHE_UPSTREAM_TIMEOUT": "abc"}, []string{"serve"}, exitUsage,
			`nodecache: NODECACHE_UPSTREAM_TIMEOUT="abc" (--upstream-timeout): want a duration such as 500ms, 30s, 5m or 1h30m` + "\n"},
		{"every bad one", map[string]string{"NODECACHE_UPSTREAM_TIMEOUT": "abc", "NODECACHE_TAG_TTL": "5"}, []string{"serve"}, exitUsage,
			`nodecache: NODECACHE_UPSTREAM_TIMEOUT="abc" (--upstream-timeout): want a duration such as 500ms, 30s, 5m or 1h30m; ` +
				`NODECACHE_TAG_TTL="5" (--tag-ttl): want a duration such as 500ms, 30s, 5m or 1h30m` + "\n"},
		{"number", map[string]string{"NODECACHE_CONCURRENCY": "four"}, []string{"warm", "--print", "nginx"}, exitUsage,
			`nodecache: NODECACHE_CONCURRENCY="four" (--concurrency): want a whole number such as 4` + "\n"},
		{"boolean", map[string]string{"NODECACHE_TALOS": "maybe"}, []string{"warm", "--print", "nginx"}, exitUsage,
			`nodecache: NODECACHE_TALOS="maybe" (--talos): want true or false` + "\n"},
		{"flag wins over a bad duration", map[string]string{"NODECACHE_WAIT": "abc"}, []string{"warm", "--wait", "1s", "--print", "nginx"}, exitOK, ""},
		{"flag wins over a bad number", map[string]string{"NODECACHE_CONCURRENCY": "four"}, []string{"warm", "--concurrency=2", "--print", "nginx"}, exitOK, ""},
		{"flag wins over a bad boolean", map[string]string{"NODECACHE_TALOS": "maybe"}, []string{"warm", "--talos=false", "--print", "nginx"}, exitOK, ""},
		{"good value", map[string]string{"NODECACHE_CONCURRENCY": "2", "NODECACHE_WAIT": "1s"}, []string{"warm", "--print", "nginx"}, exitOK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, _, stderr := runApp(t, tc.args...)
			if code != tc.code || stderr != tc.want {
				t.Fatalf("exit %d, stderr %q\nwant exit %d and %q", code, stderr, tc.code, tc.want)
			}
		})
	}
}

// TestSharedSettingsFile (newuser F18): a settings file named by NODECACHE_CONFIG reaches every
// command, so each one reads its own keys from it and ignores the keys of other commands' flags
// (serve's listen and upstream-auth for warm), while a key no command has is still refused and
// --config, which names a file for one command, stays strict. Not parallel: it sets the process
// environment.
func TestSharedSettingsFile(t *testing.T) {
	dir := t.TempDir()
	shared := writeFile(t, dir, "shared.yaml", "listen: \":5000\"\nmax-size: 10GiB\ntalos-version: v1.12.4\n")
	typo := writeFile(t, dir, "typo.yaml", "listen: \":5000\"\nlsiten: \":5001\"\n")
	own := writeFile(t, dir, "own.yaml", "talos-version: v1.11.5\n")
	serves := writeFile(t, dir, "serve.yaml", "listen: \"127.0.0.1:25010\"\nupstream: [docker.io=http://127.0.0.1:25001]\n")
	for _, tc := range []struct {
		name, env string
		args      []string
		code      int
		stdout    string // prefix
		stderr    string // contains
	}{
		{"other commands' keys ignored, own key read", shared, []string{"warm", "--print"}, exitOK,
			"ghcr.io/siderolabs/kubelet:v1.35.0\n", ""},
		{"a key of no command refused", typo, []string{"warm", "--print", "nginx"}, exitUsage,
			"", "NODECACHE_CONFIG=" + typo + ": unknown keys lsiten (did you mean listen?)"},
		{"--config stays strict", "", []string{"warm", "--config", shared, "--print"}, exitUsage,
			"", "--config " + shared + ": unknown keys listen, max-size: keys are this command's flag names"},
		// newuser2 item 13: a value refused by another command is traced to the file.
		{"a refused value names the file it came from", serves, []string{"gen", "talos", "--mirror", "http://10.0.0.5:5000"}, exitUsage,
			"", "give docker.io alone (serve and agent take other URLs) (--upstream: from NODECACHE_CONFIG=" + serves + ")\n"},
		{"--config wins over the environment", shared, []string{"warm", "--config", own, "--print"}, exitOK,
			"ghcr.io/siderolabs/kubelet:v1.34.1\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("NODECACHE_CONFIG", tc.env)
			}
			code, stdout, stderr := runApp(t, tc.args...)
			if code != tc.code || !strings.HasPrefix(stdout, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout starting %q, stderr containing %q", code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

// TestHelpRunsNoHostBinary (issue 26): nodecache never runs a host binary to learn a runtime's
// release (it asks the daemon, then reads build information: activation.RuntimeVersion), so no
// flag's help may say it does, as --containerd-version and --crio-version once did.
func TestHelpRunsNoHostBinary(t *testing.T) {
	t.Parallel()
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			for _, f := range c.Flags {
				line := fmt.Sprint(f)
				for _, bad := range []string{"`containerd --version`", "`crio --version`", "--version` on the host"} {
					if strings.Contains(line, bad) {
						t.Errorf("%s %s: help says nodecache runs %s: %q", path, c.Name, bad, line)
					}
				}
			}
			walk(path+" "+c.Name, c.Subcommands)
		}
	}
	walk("nodecache", newApp().Commands)
}

// TestEveryCommandRefusesUnknownFlag: every command and subcommand refuses a flag it does not
// have as the contract says (docs/contracts.md): exit 2, nothing on stdout, one line naming the
// flag and the help to read.
func TestEveryCommandRefusesUnknownFlag(t *testing.T) {
	t.Parallel()
	var walk func(prefix []string, cmds []*cli.Command)
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, c := range cmds {
			path := append(append([]string(nil), prefix...), c.Name)
			walk(path, c.Subcommands)
			t.Run(strings.Join(path, "_"), func(t *testing.T) {
				t.Parallel()
				code, stdout, stderr := runApp(t, append(path, "--no-such-flag")...)
				want := "nodecache: unknown flag --no-such-flag: see nodecache " + strings.Join(path, " ") + " --help\n"
				if code != exitUsage || stdout != "" || stderr != want {
					t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing, %q", code, stdout, stderr, want)
				}
			})
		}
	}
	walk(nil, newApp().Commands)
}
