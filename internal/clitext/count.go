package clitext

import (
	"strconv"
	"strings"
)

// Count writes n and noun, the noun in the plural unless n is 1: "0 images", "1 image",
// "2 images", "1 of " + Count(2, "blob") for "1 of 2 blobs". noun is the singular of a regular
// English noun: "-s", "-x", "-sh" and "-ch" take "es" ("process" → "processes"), a consonant and
// "y" become "ies" ("registry" → "registries"), every other noun takes "s". Every count
// nodecache prints goes through it (issue 26: "1 images", "1 blobs fetched").
func Count[N ~int | ~int64](n N, noun string) string {
	s := strconv.FormatInt(int64(n), 10) + " "
	if n == 1 {
		return s + noun
	}
	return s + Plural(noun)
}

// Plural is the plural of the regular English noun noun (see Count).
func Plural(noun string) string {
	switch {
	case strings.HasSuffix(noun, "s"), strings.HasSuffix(noun, "x"), strings.HasSuffix(noun, "sh"), strings.HasSuffix(noun, "ch"):
		return noun + "es"
	case len(noun) > 1 && noun[len(noun)-1] == 'y' && !strings.ContainsRune("aeiou", rune(noun[len(noun)-2])):
		return noun[:len(noun)-1] + "ies"
	}
	return noun + "s"
}
