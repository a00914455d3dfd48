package bootstrap

import (
	"fmt"
	"strings"

	"github.com/neticdk/go-stdlib/diff"
	"github.com/neticdk/go-stdlib/diff/myers"
)

// diffContext is the number of unchanged lines shown around a change, as diff -u.
const diffContext = 3

// maxDiffLines bounds the lines compared; a larger file is reported instead of diffed.
const maxDiffLines = 75_000

// noNewline marks, inside the edit script, a last line without "\n", so that "x" and "x\n"
// differ as they do for patch.
const noNewline = "\x00"

// Diff renders the changes as one unified diff (--dry-run) that patch -p1 applies from the
// host root: "--- a<path>" / "+++ b<path>" headers, /dev/null for a created or removed file, 3
// lines of context, and "\ No newline at end of file" after a last line without one, as GNU
// diff writes it. Unchanged entries contribute nothing; a restore is shown as the file going
// back to its backup's content (backup given as New).
func Diff(changes []Change) (string, error) {
	var sb strings.Builder
	for _, c := range changes {
		if !c.Changed() {
			continue
		}
		from, to := "a"+c.Path, "b"+c.Path
		switch c.Action {
		case ActionCreate:
			from = "/dev/null"
		case ActionRemove:
			to = "/dev/null"
		}
		d, err := unifiedDiff(string(c.Old), string(c.New), from, to)
		if err != nil {
			return "", fmt.Errorf("diff %s: %w", c.Path, err)
		}
		sb.WriteString(d)
	}
	return sb.String(), nil
}

// diffLines splits s into lines without their "\n"; a last line without one carries noNewline.
func diffLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.Split(s, "\n")
	if lines[len(lines)-1] == "" {
		return lines[:len(lines)-1]
	}
	lines[len(lines)-1] += noNewline
	return lines
}

// editScript captures the library's edit script instead of formatting it.
type editScript struct{ edits []diff.Line }

func (e *editScript) Format(edits []diff.Line, _ diff.FormatOptions) string {
	e.edits = edits
	return ""
}

// unifiedDiff is the unified diff of a and b with the given header names ("" when equal).
func unifiedDiff(a, b, from, to string) (string, error) {
	if a == b {
		return "", nil
	}
	al, bl := diffLines(a), diffLines(b)
	if len(al)+len(bl) > maxDiffLines {
		return "", fmt.Errorf("%d lines: too large to diff (at most %d)", len(al)+len(bl), maxDiffLines)
	}
	script := &editScript{}
	if _, err := myers.DiffStrings(al, bl, myers.WithFormatter(script), myers.WithLinearSpace(true),
		myers.WithSmallInputThreshold(0), myers.WithLargeInputThreshold(maxDiffLines)); err != nil {
		return "", err
	}
	edits := script.edits
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", from, to)
	// aAt and bAt are the 0-based line numbers in a and b where edits[i] starts.
	aAt, bAt := make([]int, len(edits)+1), make([]int, len(edits)+1)
	for i, e := range edits {
		aAt[i+1], bAt[i+1] = aAt[i], bAt[i]
		if e.Kind != diff.Insert {
			aAt[i+1]++
		}
		if e.Kind != diff.Delete {
			bAt[i+1]++
		}
	}
	for i := 0; i < len(edits); {
		if edits[i].Kind == diff.Equal {
			i++
			continue
		}
		start := max(0, i-diffContext)
		end := i // one past the last change of the hunk
		for j := i; j < len(edits); j++ {
			if edits[j].Kind != diff.Equal {
				end = j + 1
			} else if j-end >= 2*diffContext {
				break
			}
		}
		stop := min(len(edits), end+diffContext)
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n", hunkRange(aAt[start], aAt[stop]-aAt[start]), hunkRange(bAt[start], bAt[stop]-bAt[start]))
		for _, e := range edits[start:stop] {
			prefix := map[diff.OpKind]string{diff.Equal: " ", diff.Delete: "-", diff.Insert: "+"}[e.Kind]
			text, cut := strings.CutSuffix(e.Text, noNewline)
			sb.WriteString(prefix + text + "\n")
			if cut {
				sb.WriteString("\\ No newline at end of file\n")
			}
		}
		i = stop
	}
	return sb.String(), nil
}

// hunkRange is "start,count" of a hunk header: 1-based start, or the line before an empty
// range (0 for an empty file).
func hunkRange(at, count int) string {
	if count == 0 {
		return fmt.Sprintf("%d,0", at)
	}
	return fmt.Sprintf("%d,%d", at+1, count)
}
