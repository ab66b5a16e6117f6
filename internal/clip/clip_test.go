package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		max  int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"aé", 2, "a"}, // é is two bytes: not split
		{"€x", 2, ""},  // € is three bytes
		{"", 0, ""},
	} {
		if got := String(tc.s, tc.max); got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.s, tc.max, got, tc.want)
		}
	}
}

func TestPGText(t *testing.T) {
	if got, want := PGText("bad \xff\xfe and \x00", 100), "bad \uFFFD\uFFFD and \uFFFD"; got != want {
		t.Errorf("PGText = %q, want %q", got, want)
	}
	got := PGText(strings.Repeat("\xff", 1000), 100)
	if len(got) > 100 || !utf8.ValidString(got) || got != strings.Repeat("\uFFFD", 33) {
		t.Errorf("PGText of 1000 invalid bytes = %q", got)
	}
	if s := "plain"; PGText(s, 10) != s {
		t.Error("valid text changed")
	}
}
