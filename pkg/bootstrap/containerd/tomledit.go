package containerd

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// tomlDoc is a user's TOML file located by parsed key: every table header and key/value with its
// byte range, so an edit changes only the bytes it must and keeps comments, order, quoting and
// everything else (docs/contracts.md, "Files nodecache owns and edits").
type tomlDoc struct {
	data    []byte
	headers []tomlHeader
	keys    []tomlKey
	edits   []splice
}

type tomlHeader struct {
	path  []string
	array bool
	start int // first byte of the header's line
	end   int // byte after the header's line (past the newline)
	// bodyEnd is the byte after the line of the last key/value that belongs to this header
	// (== end when the table has no keys).
	bodyEnd int
	indent  string
	quote   []byte // quote characters used by each header key part (0 when bare)
}

type tomlKey struct {
	path     []string // full path: header path + dotted key
	header   int      // index into headers, -1 for the root table
	start    int      // first byte of the line
	end      int      // byte after the line holding the end of the expression
	valStart int      // value bytes (scalars only; -1 otherwise)
	valEnd   int
	kind     unstable.Kind
	inline   bool // value is an inline table or array of tables written inline
	indent   string
	quote    byte // quote of a string value ('"' or '\'')
}

type splice struct {
	start, end int
	text       string
}

// parseTOMLDoc records where each table header and key/value expression of data lies, so that
// edits can splice the bytes and keep everything else as written.
func parseTOMLDoc(data []byte) (*tomlDoc, error) {
	d := &tomlDoc{data: data}
	p := unstable.Parser{}
	p.Reset(data)
	cur := []string(nil)
	curHeader := -1
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			h, err := tableHeader(data, e)
			if err != nil {
				return nil, err
			}
			d.headers = append(d.headers, h)
			curHeader = len(d.headers) - 1
			cur = h.path
		case unstable.KeyValue:
			k := keyValue(data, e, cur, curHeader)
			d.keys = append(d.keys, k)
			if curHeader >= 0 {
				d.headers[curHeader].bodyEnd = k.end
			}
		}
	}
	if err := p.Error(); err != nil {
		return nil, err
	}
	return d, nil
}

// tableHeader is where the [table] or [[array table]] header e lies in data, with its key's
// parts and their quotes.
func tableHeader(data []byte, e *unstable.Node) (tomlHeader, error) {
	var parts []string
	var quotes []byte
	first, last := -1, -1
	for it := e.Key(); it.Next(); {
		k := it.Node()
		parts = append(parts, string(k.Data))
		raw := data[k.Raw.Offset : k.Raw.Offset+k.Raw.Length]
		q := byte(0)
		if len(raw) > 0 && (raw[0] == '"' || raw[0] == '\'') {
			q = raw[0]
		}
		quotes = append(quotes, q)
		if first < 0 {
			first = int(k.Raw.Offset)
		}
		last = int(k.Raw.Offset + k.Raw.Length)
	}
	if first < 0 {
		return tomlHeader{}, errors.New("table header without key")
	}
	start := lineStart(data, first)
	end := lineEnd(data, last)
	return tomlHeader{path: parts, array: e.Kind == unstable.ArrayTable, start: start, end: end, bodyEnd: end,
		indent: leadingSpace(data[start:first]), quote: quotes}, nil
}

// keyValue is where the key/value expression e lies in data, under the table cur (header
// curHeader, -1 for the root table).
func keyValue(data []byte, e *unstable.Node, cur []string, curHeader int) tomlKey {
	var parts []string
	first := -1
	for it := e.Key(); it.Next(); {
		k := it.Node()
		parts = append(parts, string(k.Data))
		if first < 0 {
			first = int(k.Raw.Offset)
		}
	}
	v := e.Value()
	exprEnd := int(e.Raw.Offset + e.Raw.Length)
	k := tomlKey{
		path:   append(slices.Clone(cur), parts...),
		header: curHeader,
		start:  lineStart(data, first),
		end:    lineEnd(data, exprEnd),
		kind:   v.Kind,
		inline: v.Kind == unstable.InlineTable,
	}
	k.indent = leadingSpace(data[k.start:first])
	k.valStart, k.valEnd = -1, -1
	if v.Kind != unstable.Array && v.Kind != unstable.InlineTable && v.Raw.Length > 0 {
		k.valStart, k.valEnd = int(v.Raw.Offset), int(v.Raw.Offset+v.Raw.Length)
		if v.Kind == unstable.String {
			k.quote = data[k.valStart]
		}
	}
	return k
}

func lineStart(b []byte, off int) int {
	i := bytes.LastIndexByte(b[:off], '\n')
	return i + 1
}

// lineEnd returns the byte after the newline ending the line that holds off-1's byte (or len(b)).
func lineEnd(b []byte, off int) int {
	if off > 0 && off <= len(b) && b[off-1] == '\n' {
		return off
	}
	i := bytes.IndexByte(b[off:], '\n')
	if i < 0 {
		return len(b)
	}
	return off + i + 1
}

func leadingSpace(b []byte) string {
	n := 0
	for n < len(b) && (b[n] == ' ' || b[n] == '\t') {
		n++
	}
	return string(b[:n])
}

func hasPrefix(p, prefix []string) bool {
	return len(p) >= len(prefix) && slices.Equal(p[:len(prefix)], prefix)
}

// header returns the index of the [table] header with exactly path p, or -1.
func (d *tomlDoc) header(p []string) int {
	return slices.IndexFunc(d.headers, func(h tomlHeader) bool { return !h.array && slices.Equal(h.path, p) })
}

// setString sets key in table to value: the value bytes of an existing key are replaced; else a
// line is inserted after the table's header; else a new table is added after the last table under
// near (or at the end of the file). A key written inside an inline table is refused.
func (d *tomlDoc) setString(table []string, key, value string, near []string) error {
	if !utf8.ValidString(value) {
		return fmt.Errorf("%q is not valid UTF-8, which TOML requires", value)
	}
	full := append(slices.Clone(table), key)
	for _, k := range d.keys {
		switch {
		case slices.Equal(k.path, full):
			if k.kind != unstable.String || k.valStart < 0 {
				return fmt.Errorf("%s is not a string", dotted(full))
			}
			d.edits = append(d.edits, splice{k.valStart, k.valEnd, quoteString(value, k.quote)})
			return nil
		case k.inline && hasPrefix(full, k.path):
			return fmt.Errorf("%s is written as an inline table; set %s by hand", dotted(k.path), dotted(full))
		}
	}
	if i := d.header(table); i >= 0 {
		h := d.headers[i]
		indent := h.indent + d.nesting()
		if j := slices.IndexFunc(d.keys, func(k tomlKey) bool { return k.header == i }); j >= 0 {
			indent = d.keys[j].indent
		}
		d.edits = append(d.edits, splice{h.end, h.end, indent + bareOrQuoted(key) + " = " + quoteString(value, 0) + "\n"})
		return nil
	}
	// A new table: after the last table under near, else at the end.
	at, indent, q := len(d.data), "", byte('"')
	for _, h := range d.headers {
		if hasPrefix(h.path, near) {
			at, indent = h.bodyEnd, h.indent
			if len(h.quote) > 1 && h.quote[1] != 0 {
				q = h.quote[1]
			}
		}
	}
	keyIndent := indent
	for _, k := range d.keys {
		if k.header >= 0 && hasPrefix(k.path, near) {
			keyIndent = k.indent
			break
		}
	}
	var sb strings.Builder
	if at > 0 && d.data[at-1] != '\n' {
		sb.WriteString("\n")
	}
	sb.WriteString("\n" + indent + "[" + headerPath(table, q) + "]\n")
	sb.WriteString(keyIndent + bareOrQuoted(key) + " = " + quoteString(value, 0) + "\n")
	d.edits = append(d.edits, splice{at, at, sb.String()})
	return nil
}

// nesting is how much deeper than its header the file indents a table's keys (the first keyed
// table decides; "" when the file does not indent).
func (d *tomlDoc) nesting() string {
	for _, k := range d.keys {
		if k.header < 0 {
			continue
		}
		if hi := d.headers[k.header].indent; strings.HasPrefix(k.indent, hi) {
			return k.indent[len(hi):]
		}
		return ""
	}
	return ""
}

// deleteTree removes every table header under prefix (with the keys of its body) and every
// key/value whose path is under prefix. Comments and blank lines between tables stay.
func (d *tomlDoc) deleteTree(prefix []string) error {
	for _, k := range d.keys {
		if k.inline && len(k.path) < len(prefix) && hasPrefix(prefix, k.path) {
			return fmt.Errorf("%s is written as an inline table; remove %s by hand", dotted(k.path), dotted(prefix))
		}
	}
	for _, h := range d.headers {
		if hasPrefix(h.path, prefix) {
			d.edits = append(d.edits, splice{h.start, h.bodyEnd, ""})
		}
	}
	for _, k := range d.keys {
		if !hasPrefix(k.path, prefix) {
			continue
		}
		if k.header >= 0 && hasPrefix(d.headers[k.header].path, prefix) {
			continue // removed with its header
		}
		d.edits = append(d.edits, splice{k.start, k.end, ""})
	}
	return nil
}

// bytes returns the document with all edits applied, checked to parse as TOML.
func (d *tomlDoc) bytes() ([]byte, error) {
	edits := slices.Clone(d.edits)
	sort.SliceStable(edits, func(i, j int) bool { return edits[i].start < edits[j].start })
	var out bytes.Buffer
	pos := 0
	for _, e := range edits {
		if e.start < pos {
			if e.start == e.end && e.text == "" {
				continue
			}
			return nil, fmt.Errorf("overlapping edits at byte %d", e.start)
		}
		out.Write(d.data[pos:e.start])
		out.WriteString(e.text)
		pos = e.end
	}
	out.Write(d.data[pos:])
	var check map[string]any
	if err := toml.Unmarshal(out.Bytes(), &check); err != nil {
		return nil, fmt.Errorf("edited file would not parse: %w", err)
	}
	return out.Bytes(), nil
}

func dotted(p []string) string {
	parts := make([]string, len(p))
	for i, s := range p {
		parts[i] = bareOrQuoted(s)
	}
	return strings.Join(parts, ".")
}

func headerPath(p []string, q byte) string {
	parts := make([]string, len(p))
	for i, s := range p {
		if isBare(s) {
			parts[i] = s
		} else {
			parts[i] = quoteString(s, q)
		}
	}
	return strings.Join(parts, ".")
}

func isBare(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func bareOrQuoted(s string) string {
	if isBare(s) {
		return s
	}
	return quoteString(s, '"')
}

// quoteString renders s as a TOML string: a literal '...' when like is '\” and s allows it,
// else a basic "..." string with the escapes TOML requires.
func quoteString(s string, like byte) string {
	if like == '\'' && !strings.ContainsAny(s, "'\n\r") && !hasControl(s) {
		return "'" + s + "'"
	}
	var sb strings.Builder
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			sb.WriteString(`\"`)
		case r == '\\':
			sb.WriteString(`\\`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, `\u%04X`, r)
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}
