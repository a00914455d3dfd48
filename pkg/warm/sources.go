package warm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// Source is one image warm fetches and where it was named.
type Source struct {
	// Reference is the normalised reference, e.g. "docker.io/library/nginx:latest".
	Reference string `json:"reference"`
	// From lists where it was named, in order: "--talos v1.13.8 (kubelet)", "images.txt:3",
	// "argument 2". A reference named twice is warmed once and lists both.
	From []string `json:"from"`
}

// ImageList is what `warm --print` shows: the references that would be warmed, in order.
type ImageList struct {
	// Talos is the Talos join set when --talos chose some of the images.
	Talos *TalosJoinSet `json:"talos,omitempty"`
	// Images are the references with their sources.
	Images []Source `json:"images"`
	// Notes say what the sources could not follow exactly (e.g. which release's defaults a
	// machine config was completed with).
	Notes []string `json:"notes,omitempty"`
}

// WriteText writes one normalised reference per line.
func (l *ImageList) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, s := range l.Images {
		b.WriteString(s.Reference + "\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write image list: %w", err)
	}
	return nil
}

// WriteJSON writes l as indented JSON with a trailing newline.
func (l *ImageList) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(l); err != nil {
		return fmt.Errorf("write image list: %w", err)
	}
	return nil
}

// input is one reference as written, and where.
type input struct {
	text, from string
}

// maxListLine bounds one line of an image list (bytes); a reference is far shorter.
const maxListLine = 4096

// readImageList reads an image list: one reference per line, surrounding spaces and tabs
// trimmed, blank lines and lines starting with # skipped. name labels the lines as NAME:LINE
// ("-" for standard input). Only the line syntax is checked here; the references are checked by
// ParseReference like arguments. Errors: a line longer than maxListLine bytes, a read error.
func readImageList(r io.Reader, name string) ([]input, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), maxListLine)
	var out []input
	n := 0
	for sc.Scan() {
		n++
		line := strings.Trim(sc.Text(), " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, input{text: line, from: fmt.Sprintf("%s:%d", name, n)})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return out, refusal.Value("--images-from", fmt.Sprintf("%s:%d", name, n+1), fmt.Sprintf("line longer than %d bytes; want one reference per line", maxListLine))
		}
		return out, fmt.Errorf("read --images-from %s: %w", name, err)
	}
	return out, nil
}

// listError is a refused reference from an image list, reported as NAME:LINE: reason.
type listError struct {
	from string
	err  error
}

func (e *listError) Error() string { return e.from + ": " + e.err.Error() }
func (e *listError) Unwrap() error { return e.err }

// sources parses inputs in order, drops duplicates (after normalisation; the first keeps its
// place, every source is listed) and returns the references with their sources. Each refused
// input is an error; list lines name their NAME:LINE.
func sources(inputs []input) ([]Reference, []Source, []error) {
	var (
		refs []Reference
		srcs []Source
		errs []error
		seen = map[string]int{}
	)
	for _, in := range inputs {
		ref, err := ParseReference(in.text)
		if err != nil {
			if !strings.HasPrefix(in.from, "argument ") && !strings.HasPrefix(in.from, "--") {
				err = &listError{from: in.from, err: err}
			}
			errs = append(errs, err)
			continue
		}
		key := ref.String()
		if i, ok := seen[key]; ok {
			srcs[i].From = append(srcs[i].From, in.from)
			continue
		}
		seen[key] = len(refs)
		refs = append(refs, ref)
		srcs = append(srcs, Source{Reference: key, From: []string{in.from}})
	}
	return refs, srcs, errs
}
