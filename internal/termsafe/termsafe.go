// Package termsafe makes text from the database, Redis or a request safe
// to show to a person: on a terminal (the CLI's tables and messages) and
// on the dashboard's pages. It owns the one definition of a character that
// must not reach a screen as it is (Unsafe) and the one way of showing it
// instead, as a visible escape (String, Text, JSON).
//
// A control character can move the cursor, clear the screen or retitle a
// terminal (ESC [ 2 J, ESC ] 0 ; ... BEL); a Unicode bidirectional control
// reorders what follows it ("abc" U+202E "def" reads "abcfed"). Escaped,
// each shows as what it is: \x1b, \u202e.
package termsafe

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Unsafe reports whether r must not be written to a screen as it is: a C0
// control (U+0000–U+001F), DEL (U+007F), a C1 control (U+0080–U+009F), a
// bidirectional control (U+061C, U+200E, U+200F, U+202A–U+202E,
// U+2066–U+2069) or a line or paragraph separator (U+2028, U+2029). An
// invalid UTF-8 byte decodes as utf8.RuneError, which is safe to show: the
// functions below check for invalid bytes themselves.
func Unsafe(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f,
		r >= 0x202a && r <= 0x202e,
		r >= 0x2066 && r <= 0x2069,
		r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

// Safe reports whether s is valid UTF-8 without an Unsafe character: what
// String returns unchanged.
func Safe(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if Unsafe(r) {
			return false
		}
	}
	return true
}

// String returns s for one line of a terminal: every Unsafe character
// (new lines and tabs included) and every invalid UTF-8 byte is written as
// a visible escape (\n, \t, \x1b, \u202e, \xff); the rest is unchanged, so
// a Safe string is returned as it is. Backslashes are not escaped: the
// result is for reading, not for parsing back.
func String(s string) string { return escape(s, false) }

// Text is String for text that may span lines (an error message, a
// payload on a page): new lines and tabs are kept, everything else
// String escapes is escaped.
func Text(s string) string { return escape(s, true) }

func escape(s string, keepLines bool) string {
	i := firstUnsafe(s, keepLines)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(hex2(s[i]))
		case keepLines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case Unsafe(r):
			b.WriteString(escapeRune(r))
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// firstUnsafe returns the index of the first byte of s that escape
// changes, or -1.
func firstUnsafe(s string, keepLines bool) int {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 || c == 0x7f) && !(keepLines && (c == '\n' || c == '\t')) {
				return i
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || Unsafe(r) {
			return i
		}
		i += size
	}
	return -1
}

// escapeRune writes an Unsafe rune as Go writes it in a string literal:
// \n, \t, \r, \a, \b, \f, \v; \xHH below U+0080 and for DEL; \uHHHH above.
func escapeRune(r rune) string {
	switch r {
	case '\a':
		return `\a`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	case '\v':
		return `\v`
	}
	if r < 0x80 {
		return `\x` + hex2(byte(r))
	}
	h := strconv.FormatInt(int64(r), 16)
	return `\u` + strings.Repeat("0", 4-len(h)) + h
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xf]})
}

// JSON returns a JSON document with every Unsafe character that is not
// already escaped written as a \uXXXX escape. The document means the same
// (a JSON encoder escapes the controls below U+0020 itself, but not DEL,
// the C1 controls or the bidirectional ones); only its bytes change, so
// printing it cannot drive a terminal. Outside strings a JSON document
// holds none of these characters, so no string's boundaries move.
func JSON(doc []byte) []byte {
	i := 0
	for i < len(doc) {
		r, size := utf8.DecodeRune(doc[i:])
		if r >= 0x7f && Unsafe(r) {
			break
		}
		i += size
	}
	if i == len(doc) {
		return doc
	}
	out := make([]byte, 0, len(doc)+16)
	out = append(out, doc[:i]...)
	for i < len(doc) {
		r, size := utf8.DecodeRune(doc[i:])
		if r >= 0x7f && Unsafe(r) {
			h := strconv.FormatInt(int64(r), 16)
			out = append(out, `\u`...)
			out = append(out, strings.Repeat("0", 4-len(h))...)
			out = append(out, h...)
		} else {
			out = append(out, doc[i:i+size]...)
		}
		i += size
	}
	return out
}
