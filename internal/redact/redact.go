// Package redact removes secrets from text before it is shown: passwords in
// connection strings (URL form and key=value form) and known secret values
// (API tokens) anywhere in a message.
package redact

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Mask replaces a secret in redacted output.
const Mask = "xxxxx"

// DSN returns a connection string (postgres://, redis://, rediss://, http://,
// or a libpq key=value string) with its password and any secret-looking
// query parameter replaced by Mask. Text it cannot parse is returned with
// anything after a "://user:" up to "@" masked, so it never echoes a
// password it failed to recognise.
func DSN(s string) string {
	if s == "" {
		return s
	}
	// The masks below cover the places a password belongs; the scrubber
	// then removes any other copy of it from the value (a second, broken
	// "user:password" further on, say).
	scrub := NewScrubber(Secrets(s)...)
	scrub.Add(maskedParts(s)...)
	return scrub.String(mask(s))
}

// maskedParts returns every piece of s that one of mask's user-info
// patterns takes for a password, wherever it matches: a value mask does
// not parse as a URL ("/:pw@://pw") must not show another copy of what it
// masked.
func maskedParts(s string) []string {
	res := []*regexp.Regexp{userinfoRe, looseUserinfoRe}
	if !schemeRe.MatchString(s) {
		res = append(res, bareUserinfoRe)
	}
	var out []string
	for _, re := range res {
		for _, m := range re.FindAllStringSubmatch(s, -1) {
			out = append(out, strings.TrimSuffix(strings.TrimPrefix(m[0], m[1]), "@"))
		}
	}
	return out
}

// mask masks the password of s where a DSN puts it: the user info of a
// URL (or of a value missing its scheme), password= values, and secret
// query parameters.
func mask(s string) string {
	if !schemeRe.MatchString(s) {
		// No scheme: "user:password@host" (a URL missing its
		// "postgres://") shows no password either.
		s = bareUserinfoRe.ReplaceAllString(s, "${1}"+Mask+"@")
	}
	if strings.Contains(s, "://") {
		// Trust the parse only for a real "scheme://": in "A#://:pw@" the
		// "://:pw@" is a fragment, with no user info to redact.
		if u, err := url.Parse(s); err == nil && u.Scheme != "" && strings.HasPrefix(s, u.Scheme+"://") {
			s = redactURL(u)
		} else {
			// Unparsed, the password may hold "@" itself: mask up to the
			// last one.
			s = userinfoLastRe.ReplaceAllString(s, "${1}"+Mask+"@")
		}
		// Whatever the parser made of it, never show "://user:password@",
		// nor a "user:password@" after a "/" or a space ("/:pw@://").
		s = userinfoRe.ReplaceAllString(s, "${1}"+Mask+"@")
		return looseUserinfoRe.ReplaceAllString(s, "${1}"+Mask+"@")
	}
	return kvPasswordRe.ReplaceAllString(s, "${1}"+Mask)
}

// userinfoRe matches the password part of "scheme://user:password@". The
// user part may hold anything but ":" and "@" (spaces and "/" included:
// "postgres:// :pw@…" is no URL, and must not show its password either).
var userinfoRe = regexp.MustCompile(`(://[^:@]*:)[^@]*@`)

// userinfoLastRe is userinfoRe up to the last "@" of the value: the
// user info of a URL ends at its last "@" (as net/url parses it), and an
// unescaped "@" in a password must not end the mask early.
var userinfoLastRe = regexp.MustCompile(`(://[^:@/]*:).*@`)

// looseUserinfoRe matches "user:password@" after a "/", a space or an
// "@": a value that no parser takes for a URL may still hold one that a
// driver reads ("/:pw@://", "@:pw@://").
var looseUserinfoRe = regexp.MustCompile(`([/\s@][^:/@\s]*:)[^@\s]*@`)

// schemeRe matches a URL scheme and "://" at the start of a value.
var schemeRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// bareUserinfoRe matches "user:password@" at the start of a value without
// a scheme. The user part may hold anything but ":", "/" and "@", spaces
// included (" :pw@" must not show its password either).
var bareUserinfoRe = regexp.MustCompile(`^([^:/@]*:)[^@]*@`)

// kvPasswordRe matches password=... in a libpq key=value connection string
// (quoted or not).
var kvPasswordRe = regexp.MustCompile(`(?i)(\b(?:password|sslpassword)\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

func redactURL(u *url.URL) string {
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		changed := false
		for k := range q {
			if secretParam(k) {
				q[k] = []string{Mask}
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

// secretParam reports whether a query parameter name looks like it holds a
// secret.
func secretParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"password", "passwd", "secret", "token", "key", "auth", "signature", "sig"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// Scrubber replaces known secret values in arbitrary text.
type Scrubber struct {
	secrets []string
}

// NewScrubber returns a Scrubber for the given secrets; empty strings and
// secrets shorter than 4 bytes (too likely to match ordinary text; they are
// still masked in DSNs) are ignored.
func NewScrubber(secrets ...string) *Scrubber {
	s := &Scrubber{}
	s.Add(secrets...)
	return s
}

// Add adds secrets to be scrubbed. Their URL-escaped forms are scrubbed
// too, and so is each piece of a secret between the characters at which a
// connection-string parser splits ("@", ":", "/", "?", "#"): a password
// with an unescaped "@" that a driver split at its first "@" shows its tail
// as a host name ("lookup ssSECRET@127.0.0.1: no such host").
func (s *Scrubber) Add(secrets ...string) {
	for _, v := range secrets {
		s.add(v)
		for _, esc := range []string{url.QueryEscape(v), url.PathEscape(v)} {
			if esc != v {
				s.add(esc)
			}
		}
		if pieces := strings.FieldsFunc(v, splitsURL); len(pieces) > 1 {
			for _, p := range pieces {
				s.add(p)
			}
		}
	}
	// Longest first: a secret is replaced whole before any piece of it.
	slices.SortStableFunc(s.secrets, func(a, b string) int { return len(b) - len(a) })
}

// add adds v unless it is too short to scrub or known already.
func (s *Scrubber) add(v string) {
	if len(v) >= 4 && !slices.Contains(s.secrets, v) {
		s.secrets = append(s.secrets, v)
	}
}

// splitsURL reports whether a URL or DSN parser may split a value at r.
func splitsURL(r rune) bool { return strings.ContainsRune("@:/?#", r) }

// String returns text with every known secret replaced by Mask.
func (s *Scrubber) String(text string) string {
	if s == nil {
		return text
	}
	for _, v := range s.secrets {
		text = strings.ReplaceAll(text, v, Mask)
	}
	return text
}

// Secrets returns the secret parts of a connection string or URL: the
// password of its user info, password= values, and secret-looking query
// parameters. Feed them to a Scrubber.
func Secrets(dsn string) []string {
	var out []string
	if dsn == "" {
		return nil
	}
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			if m := userinfoLastRe.FindStringSubmatch(dsn); m != nil {
				full := m[0]
				out = append(out, strings.TrimSuffix(strings.TrimPrefix(full, m[1]), "@"))
			}
			return out
		}
		if u.User != nil {
			if p, ok := u.User.Password(); ok && p != "" {
				out = append(out, p)
			}
		}
		for k, vs := range u.Query() {
			if secretParam(k) {
				for _, v := range vs {
					if v != "" {
						out = append(out, v)
					}
				}
			}
		}
		return out
	}
	for _, m := range kvPasswordRe.FindAllStringSubmatch(dsn, -1) {
		v := m[2]
		if strings.HasPrefix(v, "'") && strings.HasSuffix(v, "'") && len(v) >= 2 {
			v = strings.ReplaceAll(v[1:len(v)-1], `\'`, `'`)
		}
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}
