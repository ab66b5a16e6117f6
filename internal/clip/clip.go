// Package clip cuts strings to a byte limit without splitting a UTF-8
// sequence, and makes text storable in Postgres (valid UTF-8, no NUL). It
// also owns the one limit of stored error texts (MaxErrorBytes).
package clip

import (
	"strings"
	"unicode/utf8"
)

// MaxErrorBytes is the limit every stored error text is cut to: a task's
// last_error and error_message, an outbox row's last_error, a DLQ entry's
// last_error.
const MaxErrorBytes = 4096

// Error makes an error message storable: valid Postgres text of at most
// MaxErrorBytes.
func Error(msg string) string { return PGText(msg, MaxErrorBytes) }

// String returns s cut to at most max bytes at a rune boundary.
func String(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// PGText returns s as valid Postgres text of at most max bytes: each
// invalid byte and each NUL becomes U+FFFD, then it is cut at a rune
// boundary.
func PGText(s string, max int) string {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		var b strings.Builder
		b.Grow(len(s))
		for _, r := range s { // an invalid byte ranges as one utf8.RuneError
			if r == 0 {
				r = utf8.RuneError
			}
			b.WriteRune(r)
		}
		s = b.String()
	}
	return String(s, max)
}
