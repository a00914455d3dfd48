package test

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// TestDocLinks: every relative link of README.md and docs/*.md names a file or directory of the
// repository, and every #anchor names a heading of its target (the page itself for a bare
// #anchor) by the slug GitHub gives that heading. Links to other sites are not fetched.
func TestDocLinks(t *testing.T) {
	t.Parallel()
	fsys := os.DirFS(repoRoot)
	docs, err := fs.Glob(fsys, "docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{"README.md"}, docs...)
	if len(docs) < 2 {
		t.Fatalf("found %v: want README.md and the pages under docs/", docs)
	}
	links := 0
	for _, doc := range docs {
		n, problems := checkDocLinks(fsys, doc)
		links += n
		for _, p := range problems {
			t.Errorf("%s: %s", doc, p)
		}
	}
	if links < 10 {
		t.Errorf("only %d relative links found in %v: the link pattern no longer matches", links, docs)
	}
}

// TestDocLinksChecker runs the checker of TestDocLinks over documents held in memory, so that a
// checker which accepts everything fails here.
func TestDocLinksChecker(t *testing.T) {
	t.Parallel()
	page := "# Title\n\n## Upstream credentials\n\n## `cache ls|rm`: the inventory\n\n## Notes\n\n## Notes\n"
	for _, tc := range []struct {
		name string
		doc  string
		want []string // substrings, one per problem, in order; none: the document is clean
	}{
		{"file", "[x](page.md) and [dir](sub)", nil},
		{"missing file", "see [x](nothere.md).", []string{`"docs/nothere.md": no such file`}},
		{"anchor", "[x](page.md#upstream-credentials)", nil},
		{"anchor of a heading with code and punctuation", "[x](page.md#cache-lsrm-the-inventory)", nil},
		{"second heading of the same text", "[x](page.md#notes-1)", nil},
		{"third heading that is not there", "[x](page.md#notes-2)", []string{`"notes-2"`}},
		{"missing anchor", "[x](page.md#upstream-credential)", []string{`"upstream-credential"`}},
		{"anchor in upper case", "[x](page.md#Upstream-Credentials)", []string{`"Upstream-Credentials"`}},
		{"anchor on this page", "## Here and there\n\n[x](#here-and-there)", nil},
		{"missing anchor on this page", "## Here\n\n[x](#there)", []string{`"there"`}},
		{"anchor of a heading in a code block", "```\n# comment\n```\n\n[x](#comment)", []string{`"comment"`}},
		{"link in a code block", "```sh\necho [x](gone.md)\n```\n\n    [y](gone.md)\n", nil},
		{"link in a code span", "`[x](gone.md)`", nil},
		{"anchor on a file that is no page", "[x](sub#part)", []string{"not a Markdown page"}},
		{"out of the repository", "[x](../../etc/passwd)", []string{"outside the repository"}},
		{"reference definition", "[x][r]\n\n[r]: nothere.md\n", []string{`"docs/nothere.md": no such file`}},
		{"absolute URLs", "[x](https://example.com/a.md#b) <https://example.com> [m](mailto:a@b.c)", nil},
		{"two problems", "[a](gone.md) [b](page.md#gone)", []string{`"gone.md"`, `"gone"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{
				"docs/doc.md":      {Data: []byte(tc.doc)},
				"docs/page.md":     {Data: []byte(page)},
				"docs/sub/file.go": {Data: []byte("package sub\n")},
			}
			_, got := checkDocLinks(fsys, "docs/doc.md")
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d: %q, want it to mention %s", i, got[i], w)
				}
			}
		})
	}
}

// TestHeadingSlug: GitHub's anchor for a heading: the text as rendered (code spans and links
// reduced to their text, emphasis marks dropped), lower case, punctuation other than - and _
// removed, each space a -.
func TestHeadingSlug(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ heading, want string }{
		{"Quick start", "quick-start"},
		{"Kubernetes: a regional tier (large clusters)", "kubernetes-a-regional-tier-large-clusters"},
		{"status and agent: is the node really pulling through the cache?", "status-and-agent-is-the-node-really-pulling-through-the-cache"},
		{"`nodecache cache ls|rm`", "nodecache-cache-lsrm"},
		{"gen: point the node's runtime at the mirror", "gen-point-the-nodes-runtime-at-the-mirror"},
		{"**Bold** and [a link](x.md)", "bold-and-a-link"},
		{"snake_case and --flags", "snake_case-and---flags"},
		{"Exit codes ##", "exit-codes"},
		{"Cold pull → response", "cold-pull--response"},
	} {
		t.Run(tc.heading, func(t *testing.T) {
			t.Parallel()
			if got := headingSlug(tc.heading); got != tc.want {
				t.Errorf("headingSlug(%q) = %q, want %q", tc.heading, got, tc.want)
			}
		})
	}
}

// TestCodeCitesDocPages: where code, chart or CI files cite a page of this repository's docs —
// `(docs/PAGE.md, "Heading")`, the form the comments use — the page exists and, when a heading is
// quoted, has that heading. (A citation of another project's docs names the project first:
// "containerd docs/hosts.md" is not checked.)
func TestCodeCitesDocPages(t *testing.T) {
	t.Parallel()
	fsys := os.DirFS(repoRoot)
	cited := 0
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != "." && (strings.HasPrefix(name, ".") && name != ".ci" || name == "testdata" || name == "docs") {
				return fs.SkipDir
			}
			return nil
		}
		switch path.Ext(p) {
		case ".go", ".yaml", ".yml", ".sh":
		default:
			if base := path.Base(p); base != "Makefile" && base != ".golangci.yml" && base != "run" {
				return nil
			}
		}
		raw, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(raw), "\n") {
			for _, m := range docCitation.FindAllStringSubmatch(line, -1) {
				cited++
				page := "docs/" + m[1]
				text, err := fs.ReadFile(fsys, page)
				if err != nil {
					t.Errorf("%s:%d cites %s, which does not exist", p, i+1, page)
					continue
				}
				if m[2] != "" && !slices.Contains(headingSlugs(string(text)), headingSlug(m[2])) {
					t.Errorf("%s:%d cites %s, %q, which is no heading of that page (headings: %s)", p, i+1, page, m[2], strings.Join(headingSlugs(string(text)), " "))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited < 10 {
		t.Errorf("only %d citations of docs pages found: the pattern no longer matches the comments", cited)
	}
}

// docCitation is a citation of a page of this repository's docs: "docs/PAGE.md" right after
// "(", ";", ":" or the start of a comment, and the quoted heading that may follow it.
var docCitation = regexp.MustCompile(`(?:^|[(;:]\s*|(?://|#)\s*)docs/([a-z0-9-]+\.md)(?:, "([^"]+)")?`)

var (
	// inlineLink is the destination of an inline link or image: "](dest)" or `](dest "title")`.
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refDefinition is a link reference definition: "[label]: dest".
	refDefinition = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	// atxHeading is a heading line: one to six #, a space, the text, optional closing #s.
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$`)
	// scheme starts an absolute URL (https:, mailto:).
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// checkDocLinks reads the Markdown page doc of fsys (paths are slash-separated, relative to the
// repository root) and returns how many relative links it holds and one problem per link that
// does not resolve: a target that does not exist or lies outside fsys, an anchor that is no
// heading slug of its target page, or an anchor on a target that is not a Markdown page.
// Fenced and indented code blocks and code spans hold no links.
func checkDocLinks(fsys fs.FS, doc string) (int, []string) {
	raw, err := fs.ReadFile(fsys, doc)
	if err != nil {
		return 0, []string{err.Error()}
	}
	var problems []string
	n := 0
	for _, dest := range linkDestinations(string(raw)) {
		if dest == "" || scheme.MatchString(dest) || strings.HasPrefix(dest, "//") {
			continue
		}
		n++
		target, anchor, _ := strings.Cut(dest, "#")
		if p, err := url.PathUnescape(target); err == nil {
			target = p
		}
		file := doc
		if target != "" {
			file = path.Join(path.Dir(doc), target)
			if !fs.ValidPath(file) {
				problems = append(problems, fmt.Sprintf("link %q: %q is outside the repository", dest, file))
				continue
			}
			if _, err := fs.Stat(fsys, file); err != nil {
				problems = append(problems, fmt.Sprintf("link %q: %q: no such file or directory", dest, file))
				continue
			}
		}
		if anchor == "" {
			continue
		}
		if !strings.HasSuffix(file, ".md") {
			problems = append(problems, fmt.Sprintf("link %q: %q is not a Markdown page, so #%s names no heading", dest, file, anchor))
			continue
		}
		page, err := fs.ReadFile(fsys, file)
		if err != nil {
			problems = append(problems, fmt.Sprintf("link %q: %v", dest, err))
			continue
		}
		if slugs := headingSlugs(string(page)); !slices.Contains(slugs, anchor) {
			problems = append(problems, fmt.Sprintf("link %q: %s has no heading whose anchor is %q (anchors: %s)", dest, file, anchor, strings.Join(slugs, " ")))
		}
	}
	return n, problems
}

// linkDestinations returns the destination of every inline link, image and reference
// definition of a Markdown text, outside code.
func linkDestinations(md string) []string {
	var out []string
	for _, line := range proseLines(md) {
		if m := refDefinition.FindStringSubmatch(line); m != nil {
			out = append(out, m[1])
			continue
		}
		for _, m := range inlineLink.FindAllStringSubmatch(stripCodeSpans(line), -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// headingSlugs returns the anchors of a page's headings in order, a repeated slug suffixed with
// -1, -2, … as GitHub does.
func headingSlugs(md string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range proseLines(md) {
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := headingSlug(m[1])
		if k := seen[s]; k > 0 {
			seen[s] = k + 1
			s = fmt.Sprintf("%s-%d", s, k)
		} else {
			seen[s] = 1
		}
		out = append(out, s)
	}
	return out
}

var (
	headingLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	trailingHashes  = regexp.MustCompile(`\s+#+\s*$`)
	emphasisMarkers = strings.NewReplacer("*", "", "~", "")
)

// headingSlug is the anchor GitHub gives a heading's text.
func headingSlug(text string) string {
	text = trailingHashes.ReplaceAllString(text, "")
	text = headingLink.ReplaceAllString(text, "$1")
	text = emphasisMarkers.Replace(strings.ReplaceAll(text, "`", ""))
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// proseLines returns the lines of a Markdown text that are not code: fenced blocks (``` or ~~~,
// closed by a fence of the same character at least as long) and indented blocks (four spaces or
// a tab, after a blank line, outside a list) are left out.
func proseLines(md string) []string {
	var out []string
	fence := ""
	prevBlank, inList, inIndented := true, false, false
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]+" \t") == "" {
				fence = ""
			}
			continue
		}
		if f := fenceOpening(trimmed); f != "" && len(line)-len(trimmed) <= 3 {
			fence = f
			continue
		}
		blank := strings.TrimSpace(line) == ""
		indented := strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t")
		switch {
		case blank:
		case indented && !inList && (prevBlank || inIndented):
			inIndented = true
			prevBlank = false
			continue
		case !indented:
			inIndented = false
			inList = listItem.MatchString(line) || (inList && !prevBlank)
		}
		prevBlank = blank
		out = append(out, line)
	}
	return out
}

// listItem starts a list item: "- ", "* ", "+ " or "1. ".
var listItem = regexp.MustCompile(`^ {0,3}(?:[-*+]|\d+[.)])\s`)

// fenceOpening returns the fence a line opens (``` or ~~~, or longer), "" when it opens none.
func fenceOpening(trimmed string) string {
	for _, c := range []string{"`", "~"} {
		n := len(trimmed) - len(strings.TrimLeft(trimmed, c))
		if n >= 3 {
			return strings.Repeat(c, n)
		}
	}
	return ""
}

// stripCodeSpans removes the code spans of one line: a run of backticks up to the next run of
// exactly as many. A run that is never closed is text.
func stripCodeSpans(line string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(line, '`')
		if i < 0 {
			b.WriteString(line)
			return b.String()
		}
		b.WriteString(line[:i])
		n := backticks(line[i:])
		rest := line[i+n:]
		closed := false
		for j := 0; j < len(rest); {
			if rest[j] != '`' {
				j++
				continue
			}
			m := backticks(rest[j:])
			if m == n {
				line, closed = rest[j+m:], true
				break
			}
			j += m
		}
		if !closed {
			b.WriteString(line[i : i+n])
			line = rest
		}
	}
}

// backticks is the length of the run of backticks s starts with.
func backticks(s string) int { return len(s) - len(strings.TrimLeft(s, "`")) }
