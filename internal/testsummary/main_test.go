package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nodecache/nodecache/internal/runtimetest"
)

// writeModule writes a throwaway module whose tests pass, fail, skip (with and without a reason,
// as a subtest, with a multi-line reason) and a package that does not compile.
func writeModule(t *testing.T, withFailures, withCrash bool) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.test/sum\n\ngo 1.26\n",
		"a/a_test.go": `package a

import "testing"

func TestPass(t *testing.T) { t.Log("quiet when passing") }

func TestSkipReason(t *testing.T) { t.Skip("needs the thing: set THING") }

func TestSkipBare(t *testing.T) { t.SkipNow() }

func TestSkipMultiline(t *testing.T) { t.Log("first"); t.Skip("line one\nline two") }

func TestTable(t *testing.T) {
	for _, n := range []string{"x", "y"} {
		t.Run(n, func(t *testing.T) {
			if n == "y" {
				t.Skip("y is not here")
			}
		})
	}
}

func TestSameOne(t *testing.T) { t.Skip("the same thing is missing") }

func TestSameTwo(t *testing.T) { t.Skip("the same thing is missing") }

func TestMany(t *testing.T) {
	for _, n := range []string{"1", "2", "3", "4", "5"} {
		t.Run(n, func(t *testing.T) { t.Skip("many are missing") })
	}
}
`,
	}
	if withFailures {
		files["b/b_test.go"] = `package b

import "testing"

func TestFails(t *testing.T) { t.Log("context for the reader"); t.Error("boom: want 1, got 2") }

func TestPasses(t *testing.T) {}
`
		files["c/c_test.go"] = "package c\n\nimport \"testing\"\n\nfunc TestX(t *testing.T) { undefinedThing() }\n"
	}
	if withCrash {
		files = map[string]string{
			"go.mod": files["go.mod"],
			"d/d_test.go": `package d

import (
	"testing"
	"time"
)

func TestFine(t *testing.T) {}

func TestCrash(t *testing.T) {
	t.Parallel()
	go func() { panic("kaboom") }()
	time.Sleep(5 * time.Second)
}

func TestWaiting(t *testing.T) {
	t.Parallel()
	t.Log("waiting")
	time.Sleep(5 * time.Second)
}
`,
		}
	}
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRunRealGoTest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		withFailures bool
		withCrash    bool
		wantCode     int
		wantTail     []string
		wantContains []string
	}{
		{
			name:     "passes and skips",
			wantCode: 0,
			wantTail: []string{
				"skip: example.test/sum/a.TestSkipReason: needs the thing: set THING",
				"skip: example.test/sum/a.TestSkipBare: no reason given",
				"skip: example.test/sum/a.TestSkipMultiline: line one line two",
				"skip: example.test/sum/a.TestTable/y: y is not here",
				// Issue 26: one line per reason, with a count.
				"skip: 2 tests: the same thing is missing (example.test/sum/a.TestSameOne, example.test/sum/a.TestSameTwo)",
				"skip: 5 tests: many are missing (example.test/sum/a.TestMany/1, example.test/sum/a.TestMany/2, example.test/sum/a.TestMany/3 and 2 more)",
				"4 passed, 0 failed, 11 skipped",
			},
			wantContains: []string{"ok  \texample.test/sum/a"},
		},
		{
			name:         "failures keep their output and the exit code",
			withFailures: true,
			wantCode:     1,
			wantTail: []string{
				"skip: 5 tests: many are missing (example.test/sum/a.TestMany/1, example.test/sum/a.TestMany/2, example.test/sum/a.TestMany/3 and 2 more)",
				"5 passed, 2 failed, 11 skipped",
			},
			wantContains: []string{
				"context for the reader", "boom: want 1, got 2", "--- FAIL: TestFails",
				"undefinedThing", "fail: example.test/sum/b.TestFails", "fail: example.test/sum/c [build failed]",
			},
		},
		{
			name:      "a crash leaves tests without a result",
			withCrash: true,
			wantCode:  1,
			wantTail: []string{
				"fail: example.test/sum/d.TestCrash [no result]",
				"fail: example.test/sum/d.TestWaiting [no result]",
				"",
				"1 passed, 2 failed, 0 skipped",
			},
			wantContains: []string{"--- NO RESULT: TestCrash", "panic: kaboom", "--- NO RESULT: TestWaiting"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := writeModule(t, tc.withFailures, tc.withCrash)
			var out, errOut bytes.Buffer
			code := run([]string{"--", "go", "test", "-C", dir, "-json", "-count=1", "./..."}, &out, &errOut)
			got := out.String()
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.wantCode, got, errOut.String())
			}
			lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
			if len(lines) < len(tc.wantTail) {
				t.Fatalf("output too short:\n%s", got)
			}
			tail := lines[len(lines)-len(tc.wantTail):]
			for i := range tail {
				if tail[i] != tc.wantTail[i] {
					t.Fatalf("line %d from the end = %q, want %q\nwhole output:\n%s", len(tail)-i, tail[i], tc.wantTail[i], got)
				}
			}
			for _, s := range tc.wantContains {
				if !strings.Contains(got+errOut.String(), s) {
					t.Errorf("output lacks %q:\n%s\nstderr:\n%s", s, got, errOut.String())
				}
			}
			if strings.Contains(got, "quiet when passing") {
				t.Errorf("a passing test's log was printed:\n%s", got)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "want a command") {
		t.Fatalf("no command: exit %d, %q", code, errOut.String())
	}
	if code := run([]string{"--", "/nonexistent/go"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "start /nonexistent/go") {
		t.Fatalf("missing command: exit %d, %q", code, errOut.String())
	}
}

func TestSkipReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		lines []string
		want  string
	}{
		{"none", []string{"=== RUN   TestA\n", "--- SKIP: TestA (0.00s)\n"}, "no reason given"},
		{"last message wins", []string{"=== RUN   TestA\n", "    a_test.go:3: setup\n", "    a_test.go:4: no daemon\n", "--- SKIP: TestA (0.00s)\n"}, "no daemon"},
		{"continuation", []string{"    a_test.go:4: one\n        two\n", "    --- SKIP: TestA/b (0.00s)\n"}, "one two"},
		{"no location", []string{"    plain words: here\n"}, "plain words: here"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := skipReason(tc.lines); got != tc.want {
				t.Fatalf("skipReason = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestMakeTargetsSummarize (issue 26): `make test` and `make test-deploy` both run their go test
// through this summary (`make test-deploy` printed neither its skips nor a count line before).
// make -n prints the recipes without running them.
func TestMakeTargetsSummarize(t *testing.T) {
	t.Parallel()
	makeTool := runtimetest.Find(t, runtimetest.Tool{Name: "make", Install: "apt-get install make"})
	for _, target := range []string{"test", "test-deploy"} {
		out, err := exec.Command(makeTool, "-n", "-C", filepath.Join("..", ".."), target).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		if !regexp.MustCompile(`(?m)bin/testsummary .*-- \\?\s*\S*go test -json `).Match(out) {
			t.Errorf("make %s does not run go test -json through bin/testsummary:\n%s", target, out)
		}
	}
}
