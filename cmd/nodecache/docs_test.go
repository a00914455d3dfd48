package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cliReference is the command reference generated from the command definitions.
const cliReference = "../../docs/cli.md"

// TestCLIReferenceIsCurrent fails when docs/cli.md is not what the command definitions generate
// (urfave/cli's Markdown of every command, flag, default and environment variable). Regenerate it
// with `go generate ./cmd/nodecache`.
func TestCLIReferenceIsCurrent(t *testing.T) {
	t.Parallel()
	md, err := newApp().ToMarkdown()
	if err != nil {
		t.Fatal(err)
	}
	want := "<!-- Generated from the command definitions by `go generate ./cmd/nodecache`; do not edit. -->\n\n" +
		"Every flag can also be set in the environment as NODECACHE_<FLAG> (upper case, - as _, e.g. NODECACHE_LISTEN) " +
		"and as a key of the YAML file named by --config; a flag wins over the environment, which wins over the file.\n\n" + md
	if os.Getenv("NODECACHE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(cliReference, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(cliReference)
	if err != nil {
		t.Fatalf("%v: generate it with go generate ./cmd/nodecache", err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: regenerate it with go generate ./cmd/nodecache (first difference at line %d)", filepath.Base(cliReference), firstDiffLine(string(got), want))
	}
	for _, s := range []string{"## serve", "### containerd", "--log-format", "NODECACHE_LISTEN", "## completion", "**--listen**"} {
		if !strings.Contains(want, s) {
			t.Errorf("the reference lacks %q", s)
		}
	}
}

func firstDiffLine(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}
