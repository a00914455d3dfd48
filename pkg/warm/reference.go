package warm

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/nodecache/nodecache/pkg/refusal"
)

// ErrRefused is refusal.ErrRefused, kept for callers that test errors.Is(err, warm.ErrRefused).
// warm refuses input before sending anything — a reference, platform or version that fails the
// character check or the grammar, a flag out of range, a file it cannot use — with a
// *refusal.Error naming the flag or value: `--platform "linux" refused: want os/arch[/variant],
// e.g. linux/amd64 or linux/arm64` (refusal.Value). The CLI exits 2 for it.
var ErrRefused = refusal.ErrRefused

// maxReferenceLen bounds a reference: a 255-character name (distribution's
// reference.NameTotalLengthMax), ":" and a 128-character tag, "@" and a sha512 digest.
const maxReferenceLen = 255 + 1 + 128 + 1 + 7 + 128

// Reference is an image reference as warm uses it: normalised by the distribution reference
// grammar (github.com/distribution/reference), with the registry host and repository split out.
type Reference struct {
	// Input is the reference as given, e.g. "nginx".
	Input string
	// Registry is the registry host as written in references, e.g. "docker.io", "ghcr.io",
	// "localhost:5000". It is sent as ?ns= or used as the path prefix.
	Registry string
	// Repository is the repository path under Registry, e.g. "library/nginx".
	Repository string
	// Tag is the tag, "latest" when the input had neither tag nor digest, "" when the input had
	// only a digest.
	Tag string
	// Digest is the manifest digest from the input, if any. When set it wins over Tag: the
	// manifest is requested by digest.
	Digest digest.Digest
}

// String returns the normalised reference: registry/repository[:tag][@digest],
// e.g. "docker.io/library/nginx:latest".
func (r Reference) String() string {
	s := r.Registry + "/" + r.Repository
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest.String()
	}
	return s
}

// manifestRef is what the manifest is requested by: the digest when there is one, else the tag.
func (r Reference) manifestRef() string {
	if r.Digest != "" {
		return r.Digest.String()
	}
	return r.Tag
}

// ParseReference checks s by character class and then parses the whole of it with the
// distribution reference grammar (reference.ParseNormalizedNamed). Accepted forms: name,
// name:tag, name@digest, name:tag@digest (the digest wins). A short name is normalised the way
// docker and containerd do it ("nginx" -> "docker.io/library/nginx:latest").
//
// The character check runs first and accepts only ASCII letters, digits and ". _ - : / @": it
// refuses control characters (newline included), whitespace, shell metacharacters and anything
// else before any pattern sees the value, because a pattern applied per line accepts
// "v1.35.6\nid". Errors are refusals naming the value (refusal.Value("image reference", s, …)).
func ParseReference(s string) (Reference, error) {
	refuse := func(reason string) (Reference, error) {
		return Reference{}, refusal.Value("image reference", s, reason)
	}
	if err := checkChars(s, maxReferenceLen); err != "" {
		return refuse(err + "; a reference is name[:tag][@digest] made of letters, digits and . _ - : / @")
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return refuse(fmt.Sprintf("not a reference by the distribution grammar (name[:tag][@digest]): %v", err))
	}
	named = reference.TagNameOnly(named)
	r := Reference{Input: s, Registry: reference.Domain(named), Repository: reference.Path(named)}
	if t, ok := named.(reference.Tagged); ok {
		r.Tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		r.Digest = d.Digest()
		if !r.Digest.Algorithm().Available() {
			return refuse(fmt.Sprintf("digest algorithm %q is not supported; use sha256, sha384 or sha512", r.Digest.Algorithm()))
		}
	}
	return r, nil
}

// checkChars is the character-class check run before any grammar: it returns "" when s is
// non-empty, at most maxLen bytes and only ASCII letters, digits and ". _ - : / @"; otherwise it
// says which character (and where) is refused.
func checkChars(s string, maxLen int) string {
	if s == "" {
		return "empty value"
	}
	if len(s) > maxLen {
		return fmt.Sprintf("%d bytes long, at most %d accepted", len(s), maxLen)
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			continue
		case c == '.', c == '_', c == '-', c == ':', c == '/', c == '@':
			continue
		}
		return fmt.Sprintf("%s %s at byte %d", charClass(c), strconv.QuoteRune(c), i)
	}
	return ""
}

// charClass names why a rune is refused.
func charClass(c rune) string {
	switch {
	case c == utf8.RuneError:
		return "invalid UTF-8"
	case unicode.IsControl(c):
		return "control character"
	case unicode.IsSpace(c):
		return "whitespace"
	case c < utf8.RuneSelf && isShellMeta(byte(c)):
		return "shell metacharacter"
	case c >= utf8.RuneSelf:
		return "non-ASCII character"
	default:
		return "character"
	}
}

func isShellMeta(c byte) bool {
	switch c {
	case '|', '&', ';', '<', '>', '(', ')', '$', '`', '\\', '"', '\'', '*', '?', '[', ']', '#', '~', '=', '%', '!', '{', '}', '^', ',':
		return true
	}
	return false
}
