// Command testsummary runs `go test -json …` and prints what a reader of `go test` needs: the
// `ok`/`FAIL` line of every package, the complete output of every failing test and of every
// build that failed, and at the end one `skip: <test>: <reason>` line per skip reason (`skip: <N>
// tests: <reason> (<tests>)` for a reason several tests gave) followed by exactly `N passed,
// N failed, N skipped`.
//
// Usage (what `make test` runs):
//
//	go run ./internal/testsummary [-v] -- go test -json [go test flags] ./...
//
// Counts include subtests. A test without a result when its package ends (the binary crashed or
// timed out first) is a failure marked [no result], printed with its output (the crash
// included); in a package that passed, it passed. A package that failed without a failing test
// (a build failure, a panic in TestMain) counts as one failed test named after the package. The exit
// status is 1 when anything failed or the command itself failed, 2 for a usage error, else 0.
// With -v every line of test output is printed as it arrives, as `go test -v` would.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testsummary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbose := fs.Bool("v", false, "print every line of test output as it arrives")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cmdArgs := fs.Args()
	if len(cmdArgs) == 0 {
		fmt.Fprintln(stderr, "testsummary: want a command after --, e.g. -- go test -json ./...")
		return 2
	}
	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...) //nolint:gosec // the command line is ours (Makefile)
	cmd.Stderr = stderr
	cmd.Stdin = os.Stdin
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(stderr, "testsummary: %v\n", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "testsummary: start %s: %v\n", cmdArgs[0], err)
		return 1
	}
	s := newSummary(stdout, *verbose)
	readErr := s.read(out)
	waitErr := cmd.Wait()
	code := 0
	if readErr != nil {
		fmt.Fprintf(stdout, "testsummary: reading test events: %v\n", readErr)
		code = 1
	}
	var exit *exec.ExitError
	switch {
	case errors.As(waitErr, &exit):
		if s.failed() == 0 {
			fmt.Fprintf(stdout, "testsummary: %s exited with status %d\n", strings.Join(cmdArgs, " "), exit.ExitCode())
		}
		code = 1
	case waitErr != nil:
		fmt.Fprintf(stdout, "testsummary: %v\n", waitErr)
		code = 1
	}
	s.finish()
	if s.failed() > 0 {
		code = 1
	}
	return code
}

// event is one line of `go test -json` (cmd/test2json's TestEvent, and the build events that
// `go test -json` interleaves: Action build-output / build-fail with ImportPath).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string
	FailedBuild string
}

type testKey struct{ pkg, test string }

type skipped struct {
	name, reason string
}

type summary struct {
	w       io.Writer
	verbose bool
	module  string // module path prefix trimmed from package names, e.g. "github.com/x/y/"

	output     map[testKey][]string // buffered output per test, printed when it fails
	pkgFailed  map[string]bool      // a test of the package failed
	passed     int
	failedList []string
	skips      []skipped
}

func newSummary(w io.Writer, verbose bool) *summary {
	return &summary{
		w: w, verbose: verbose, module: modulePrefix(),
		output: map[testKey][]string{}, pkgFailed: map[string]bool{},
	}
}

// modulePrefix is the main module's path plus "/", so package names print as pkg/x; empty when
// `go env GOMOD` cannot say (names then print in full).
func modulePrefix() string {
	out, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		return ""
	}
	m := strings.TrimSpace(string(out))
	if m == "" || strings.Contains(m, "\n") {
		return ""
	}
	return m + "/"
}

func (s *summary) failed() int { return len(s.failedList) }

// read consumes the event stream until EOF. Lines that are not JSON are printed as they are.
func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			fmt.Fprintf(s.w, "%s\n", line)
			continue
		}
		s.handle(ev)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read go test output: %w", err)
	}
	return nil
}

func (s *summary) name(pkg, test string) string {
	p := strings.TrimPrefix(pkg, s.module)
	if test == "" {
		return p
	}
	return p + "." + test
}

func (s *summary) handle(ev event) {
	switch ev.Action {
	case "build-output":
		fmt.Fprint(s.w, ev.Output)
		return
	case "build-fail":
		return
	}
	if ev.Test == "" {
		s.handlePackage(ev)
		return
	}
	k := testKey{ev.Package, ev.Test}
	switch ev.Action {
	case "output":
		if s.verbose {
			fmt.Fprint(s.w, ev.Output)
		}
		s.output[k] = append(s.output[k], ev.Output)
	case "pass":
		s.passed++
		delete(s.output, k)
	case "skip":
		s.skips = append(s.skips, skipped{name: s.name(ev.Package, ev.Test), reason: skipReason(s.output[k])})
		delete(s.output, k)
	case "fail":
		s.failedList = append(s.failedList, s.name(ev.Package, ev.Test))
		s.pkgFailed[ev.Package] = true
		if !s.verbose {
			fmt.Fprint(s.w, strings.Join(s.output[k], ""))
		}
		delete(s.output, k)
	}
}

// handlePackage prints the package's own lines (`ok  pkg 1.2s`, `FAIL pkg`, a panic outside any
// test, build failures) except the bare PASS/FAIL markers, and counts a package that failed
// without a failed test.
func (s *summary) handlePackage(ev event) {
	switch ev.Action {
	case "output":
		if s.verbose || (ev.Output != "PASS\n" && ev.Output != "FAIL\n" && !strings.HasPrefix(ev.Output, "=== ")) {
			fmt.Fprint(s.w, ev.Output)
		}
	case "pass":
		// A package that passed passed every test, also those whose result line test2json
		// could not read.
		for _, k := range s.open(ev.Package) {
			s.passed++
			delete(s.output, k)
		}
	case "fail":
		// Tests without a result in a failed package: the binary ended before them (a panic,
		// a crash, a timeout). Each is a failure; its output is printed, the crash included.
		for _, k := range s.open(ev.Package) {
			if !s.verbose {
				fmt.Fprintf(s.w, "--- NO RESULT: %s (the test binary ended first)\n", k.test)
				for _, l := range s.output[k] {
					if !strings.HasPrefix(l, "=== ") {
						fmt.Fprint(s.w, l)
					}
				}
			}
			s.failedList = append(s.failedList, s.name(k.pkg, k.test)+" [no result]")
			s.pkgFailed[ev.Package] = true
			delete(s.output, k)
		}
		if !s.pkgFailed[ev.Package] {
			what := s.name(ev.Package, "")
			if ev.FailedBuild != "" {
				what += " [build failed]"
			}
			s.failedList = append(s.failedList, what)
			s.pkgFailed[ev.Package] = true
		}
	}
}

// open returns the tests of pkg that started but have no result yet, sorted.
func (s *summary) open(pkg string) []testKey {
	var keys []testKey
	for k := range s.output {
		if k.pkg == pkg {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b testKey) int { return strings.Compare(a.test, b.test) })
	return keys
}

// skipReason is the last message a test logged before its --- SKIP line (t.Skip's message), with
// the file:line prefix removed and continuation lines joined; "no reason given" when it logged
// nothing.
func skipReason(lines []string) string {
	var entries [][]string
	for _, l := range strings.SplitAfter(strings.Join(lines, ""), "\n") {
		l = strings.TrimRight(l, "\n")
		switch {
		case l == "", strings.HasPrefix(l, "=== "), strings.HasPrefix(strings.TrimSpace(l), "--- "):
		case strings.HasPrefix(l, "        ") && len(entries) > 0:
			entries[len(entries)-1] = append(entries[len(entries)-1], strings.TrimSpace(l))
		default:
			entries = append(entries, []string{stripLocation(strings.TrimSpace(l))})
		}
	}
	if len(entries) == 0 {
		return "no reason given"
	}
	return strings.Join(entries[len(entries)-1], " ")
}

// stripLocation removes testing's "file_test.go:12: " prefix.
func stripLocation(l string) string {
	file, rest, ok := strings.Cut(l, ": ")
	if !ok {
		return l
	}
	name, line, ok := strings.Cut(file, ".go:")
	if !ok || name == "" || strings.ContainsAny(name, " \t") || strings.Trim(line, "0123456789") != "" {
		return l
	}
	return rest
}

// finish prints the failed tests, one skip line per skipped test and the counts line.
func (s *summary) finish() {
	// Output of tests that never ended (the binary died) is printed so nothing is lost.
	keys := make([]testKey, 0, len(s.output))
	for k := range s.output {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b testKey) int { return strings.Compare(a.pkg+"\x00"+a.test, b.pkg+"\x00"+b.test) })
	for _, k := range keys {
		if !s.verbose {
			fmt.Fprint(s.w, strings.Join(s.output[k], ""))
		}
	}
	if len(s.failedList) > 0 {
		fmt.Fprintln(s.w)
	}
	for _, f := range s.failedList {
		fmt.Fprintf(s.w, "fail: %s\n", f)
	}
	if len(s.failedList) > 0 || len(s.skips) > 0 {
		fmt.Fprintln(s.w)
	}
	for _, g := range groupSkips(s.skips) {
		fmt.Fprintln(s.w, g)
	}
	fmt.Fprintf(s.w, "%d passed, %d failed, %d skipped\n", s.passed, len(s.failedList), len(s.skips))
}

// groupSkips is one line per skip reason, in the order the reasons first came: `skip: <test>:
// <reason>` for a reason one test gave, `skip: <N> tests: <reason> (<test>, <test>, <test> and
// <N-3> more)` for one that several gave — 50 tests stopped by one missing daemon are one line.
func groupSkips(skips []skipped) []string {
	var order []string
	names := map[string][]string{}
	for _, sk := range skips {
		if _, seen := names[sk.reason]; !seen {
			order = append(order, sk.reason)
		}
		names[sk.reason] = append(names[sk.reason], sk.name)
	}
	const shown = 3
	lines := make([]string, 0, len(order))
	for _, reason := range order {
		n := names[reason]
		if len(n) == 1 {
			lines = append(lines, fmt.Sprintf("skip: %s: %s", n[0], reason))
			continue
		}
		list := strings.Join(n[:min(len(n), shown)], ", ")
		if len(n) > shown {
			list += fmt.Sprintf(" and %d more", len(n)-shown)
		}
		lines = append(lines, fmt.Sprintf("skip: %d tests: %s (%s)", len(n), reason, list))
	}
	return lines
}
