// Package clitext holds the words nodecache's command line says to people: what a flag or a
// settings-file key accepts, the "did you mean" suggestion for a mistyped name, and the shell
// completion scripts. cmd/nodecache wires them into urfave/cli.
package clitext

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/xrash/smetrics"
)

// Kind is the kind of value a flag takes.
type Kind int

// Kinds of flag values.
const (
	Text Kind = iota
	Duration
	Number
	Boolean
	List
)

// Accepts says in words what a value of kind k looks like.
func (k Kind) Accepts() string {
	switch k {
	case Duration:
		return "a duration such as 500ms, 30s, 5m or 1h30m"
	case Number:
		return "a whole number such as 4"
	case Boolean:
		return "true or false"
	case List:
		return `a list (a YAML sequence such as ["a", "b"])`
	default:
		return "text (quote it if it looks like a number or true/false)"
	}
}

// minSimilarity is the Jaro-Winkler similarity below which no suggestion is made: "lsiten" is
// 0.96 from "listen", "bogus" 0.5 from "serve".
const minSimilarity = 0.8

// Suggest returns the candidate most like typed, or "" when none is close enough to be what was
// meant (Jaro-Winkler similarity, the measure urfave/cli's own suggestions use).
func Suggest(typed string, candidates []string) string {
	best, score := "", 0.0
	for _, c := range candidates {
		if s := smetrics.JaroWinkler(typed, c, 0.7, 4); s > score {
			best, score = c, s
		}
	}
	if score < minSimilarity {
		return ""
	}
	return best
}

// CheckValues checks the values of a settings file (keys are flag names) against the kinds of
// the flags they set and returns one error naming every key whose value is of the wrong kind,
// saying what it accepts and what it got, in words. Keys not in kinds are left to the caller.
func CheckValues(doc map[string]any, kinds map[string]Kind) error {
	var bad []string
	for key, v := range doc {
		k, ok := kinds[key]
		if !ok || fits(k, v) {
			continue
		}
		if items := badItems(k, v); items != "" {
			bad = append(bad, fmt.Sprintf("key %q: %s; want text in each item of the list (quote it if it looks like a number or true/false)", key, items))
			continue
		}
		bad = append(bad, fmt.Sprintf("key %q: want %s, got %s", key, k.Accepts(), describe(v)))
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%s", strings.Join(bad, "; "))
}

func fits(k Kind, v any) bool {
	switch k {
	case Text:
		_, ok := v.(string)
		return ok
	case Duration:
		s, ok := v.(string)
		if !ok {
			return false
		}
		_, err := time.ParseDuration(s)
		return err == nil
	case Number:
		_, ok := v.(int)
		return ok
	case Boolean:
		_, ok := v.(bool)
		return ok
	case List:
		l, ok := v.([]any)
		if !ok {
			return false
		}
		for _, e := range l {
			if _, ok := e.(string); !ok {
				return false
			}
		}
		return true
	}
	return false
}

// badItems names the items of a list value that are not text ("item 2 is the number 5"), or
// returns "" when v is not a list or k is not List.
func badItems(k Kind, v any) string {
	l, ok := v.([]any)
	if k != List || !ok {
		return ""
	}
	var items []string
	for i, e := range l {
		if _, ok := e.(string); !ok {
			items = append(items, fmt.Sprintf("item %d is %s", i+1, describe(e)))
		}
	}
	return strings.Join(items, ", ")
}

// describe names a YAML value's kind in words, with the value when it is short.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "nothing (an empty value)"
	case string:
		return fmt.Sprintf("the text %q", v)
	case bool:
		return fmt.Sprintf("%v (a true/false value)", v)
	case int, int64, uint64:
		return fmt.Sprintf("the number %v", v)
	case float64:
		return fmt.Sprintf("the number %v", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping (nested keys)"
	default:
		return "a value of another kind"
	}
}

// Bytes formats n bytes in binary units with one decimal: "512 B", "1.0 KiB", "1.5 MiB", up to
// EiB. Every measured size nodecache prints (warm's reports and progress, cache ls) goes
// through it.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Span renders a duration the way people read it in messages and log lines: Go's notation,
// rounded to what matters and without trailing zero units: "<1ms" below a millisecond (never
// microseconds with decimals), whole milliseconds below a second ("350ms"), tenths of a second
// below a minute ("1.2s", "3s"), whole seconds above ("2m30s", "5m", "1h"). Zero is "0s"; a
// negative duration is "-" and its magnitude. Every duration nodecache prints goes through it
// (docs/settings.md, "Logs"); the access log's duration_ms stays a number.
func Span(d time.Duration) string {
	var s string
	switch {
	case d == 0:
		return "0s"
	case d < 0:
		return "-" + Span(-d)
	case d < time.Millisecond:
		return "<1ms"
	case d < time.Second:
		s = d.Round(time.Millisecond).String()
	case d < time.Minute:
		s = d.Round(100 * time.Millisecond).String()
	default:
		s = d.Round(time.Second).String()
	}
	// time.Duration.String writes "5m0s" and "1h0m0s"; people write 5m and 1h.
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Renderer is what a command prints (a report): it renders itself as text and as JSON.
type Renderer interface {
	WriteText(w io.Writer) error
	WriteJSON(w io.Writer) error
}

// Render writes rep as JSON when output is "json" (--output json), else as text.
func Render(w io.Writer, output string, rep Renderer) error {
	if output == "json" {
		return rep.WriteJSON(w)
	}
	return rep.WriteText(w)
}

// RenderSplit is Render for a report that keeps its main text apart from its summary lines
// (a dry run's diff on stdout, what it would do on stderr): with text output such a report
// (WriteTextSplit) writes the main text on out and the summary on summary; others are Rendered
// on out.
func RenderSplit(out, summary io.Writer, output string, rep Renderer) error {
	if s, ok := rep.(interface {
		WriteTextSplit(out, summary io.Writer) error
	}); ok && output != "json" {
		return s.WriteTextSplit(out, summary)
	}
	return Render(out, output, rep)
}

// CheckOutput refuses an --output value other than text or json, saying what is accepted.
func CheckOutput(o string) error {
	if o != "text" && o != "json" {
		return fmt.Errorf("--output %q: want text or json", o)
	}
	return nil
}
