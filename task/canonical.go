package task

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// Canonical returns the canonical form of a JSON value: no insignificant
// white space, object keys sorted, numbers as written. Two payloads that
// mean the same JSON have the same canonical form (and payload_sha).
//
// The form is the one encoding/json gives the value decoded (with
// UseNumber) and encoded again without HTML escaping: strings unescaped
// where JSON allows, U+2028 and U+2029 escaped, bytes that are not UTF-8
// replaced by U+FFFD, a repeated key's last value kept. Most payloads
// need none of that: they are copied as they are, with their white space
// dropped and their keys sorted, in one pass (canonicalPlain); the others
// are decoded and encoded again. Both give the same bytes, so a payload's
// payload_sha does not depend on which way it took.
func Canonical(payload []byte) ([]byte, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, fmt.Errorf("is empty (want a JSON value)")
	}
	if out, ok := canonicalPlain(payload); ok {
		return out, nil
	}
	return canonicalDecoded(payload)
}

// canonicalDecoded is Canonical by decoding payload and encoding it again:
// it takes any payload, and gives the error of one that is not JSON.
func canonicalDecoded(payload []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("is not a single JSON value")
	}
	if containsNULInJSON(v) {
		return nil, fmt.Errorf("contains a \\u0000 character, which Postgres jsonb cannot store")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func containsNULInJSON(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsRune(x, 0)
	case []any:
		for _, e := range x {
			if containsNULInJSON(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if strings.ContainsRune(k, 0) || containsNULInJSON(e) {
				return true
			}
		}
	}
	return false
}

// canonicalPlain is Canonical in one pass over payload, for JSON whose
// canonical form is its own bytes without white space and with its keys
// sorted. It reports false for anything it would have to interpret (an
// escape in a string, bytes that are not UTF-8, U+2028 or U+2029, a key
// repeated in an object, nesting deeper than plainDepth) and for anything
// that is not JSON: canonicalDecoded takes those.
func canonicalPlain(payload []byte) ([]byte, bool) {
	c := plainCanon{in: payload, out: make([]byte, 0, len(payload))}
	if !c.value() {
		return nil, false
	}
	c.space()
	if c.i != len(c.in) {
		return nil, false
	}
	return c.out, true
}

// plainDepth is the deepest nesting canonicalPlain takes.
const plainDepth = 200

// plainCanon is canonicalPlain's state: the input, how far it is read,
// the output and the nesting.
type plainCanon struct {
	in    []byte
	i     int
	out   []byte
	depth int
}

// space skips JSON's white space.
func (c *plainCanon) space() {
	for c.i < len(c.in) {
		switch c.in[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// value copies the value at c.i.
func (c *plainCanon) value() bool {
	c.space()
	if c.i >= len(c.in) {
		return false
	}
	switch b := c.in[c.i]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		s, ok := c.str()
		c.out = append(c.out, s...)
		return ok
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return false
}

// str returns the string at c.i, its quotes included, when it is plain:
// no escape, no control character, valid UTF-8 without U+2028 or U+2029.
func (c *plainCanon) str() ([]byte, bool) {
	in, start := c.in, c.i
	for j := start + 1; j < len(in); {
		b := in[j]
		if plainASCII[b] {
			j++
			continue
		}
		switch {
		case b == '"':
			c.i = j + 1
			return in[start:c.i], true
		case b < utf8.RuneSelf: // a backslash or a control character
			return nil, false
		default:
			r, size := utf8.DecodeRune(in[j:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return nil, false
			}
			j += size
		}
	}
	return nil, false
}

// plainASCII holds the bytes a plain string copies as they are: ASCII
// from the space on, less the quote and the backslash.
var plainASCII = func() (t [256]bool) {
	for b := ' '; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// number copies the number at c.i, checked against JSON's grammar.
func (c *plainCanon) number() bool {
	start, j := c.i, c.i
	digits := func() int {
		n := 0
		for j < len(c.in) && '0' <= c.in[j] && c.in[j] <= '9' {
			j++
			n++
		}
		return n
	}
	if c.in[j] == '-' {
		j++
	}
	switch {
	case j < len(c.in) && c.in[j] == '0':
		j++
	case digits() == 0:
		return false
	}
	if j < len(c.in) && c.in[j] == '.' {
		j++
		if digits() == 0 {
			return false
		}
	}
	if j < len(c.in) && (c.in[j] == 'e' || c.in[j] == 'E') {
		j++
		if j < len(c.in) && (c.in[j] == '+' || c.in[j] == '-') {
			j++
		}
		if digits() == 0 {
			return false
		}
	}
	c.out = append(c.out, c.in[start:j]...)
	c.i = j
	return true
}

// literal copies true, false or null.
func (c *plainCanon) literal(word string) bool {
	if !bytes.HasPrefix(c.in[c.i:], []byte(word)) {
		return false
	}
	c.out = append(c.out, word...)
	c.i += len(word)
	return true
}

// enter copies the opener of the array or object at c.i: not ok when it
// is nested deeper than plainDepth, empty when it closes at once (then
// written whole).
func (c *plainCanon) enter(opener, closer byte) (empty, ok bool) {
	if c.depth++; c.depth > plainDepth {
		return false, false
	}
	c.i++
	c.out = append(c.out, opener)
	c.space()
	if c.i < len(c.in) && c.in[c.i] == closer {
		c.i++
		c.out = append(c.out, closer)
		c.depth--
		return true, true
	}
	return false, true
}

// array copies the array at c.i.
func (c *plainCanon) array() bool {
	if empty, ok := c.enter('[', ']'); empty || !ok {
		return ok
	}
	for {
		if !c.value() {
			return false
		}
		c.space()
		if c.i >= len(c.in) {
			return false
		}
		switch c.in[c.i] {
		case ',':
			c.i++
			c.out = append(c.out, ',')
		case ']':
			c.i++
			c.out = append(c.out, ']')
			c.depth--
			return true
		default:
			return false
		}
	}
}

// member is an object member copied by object: its key (unquoted) and
// where it was written in the output.
type member struct {
	key      []byte
	from, to int
}

// object copies the object at c.i with its members in the order of their
// keys (encoding/json sorts a map's keys byte by byte).
func (c *plainCanon) object() bool {
	open := len(c.out)
	if empty, ok := c.enter('{', '}'); empty || !ok {
		return ok
	}
	var buf [8]member
	ms := buf[:0]
	sorted := true
	for {
		c.space()
		if c.i >= len(c.in) || c.in[c.i] != '"' {
			return false
		}
		from := len(c.out)
		key, ok := c.str()
		if !ok {
			return false
		}
		c.out = append(c.out, key...)
		c.space()
		if c.i >= len(c.in) || c.in[c.i] != ':' {
			return false
		}
		c.i++
		c.out = append(c.out, ':')
		if !c.value() {
			return false
		}
		m := member{key: key[1 : len(key)-1], from: from, to: len(c.out)}
		if n := len(ms); n > 0 {
			switch cmp := bytes.Compare(ms[n-1].key, m.key); {
			case cmp == 0:
				return false // a repeated key: the last value wins
			case cmp > 0:
				sorted = false
			}
		}
		ms = append(ms, m)
		c.space()
		if c.i >= len(c.in) {
			return false
		}
		if c.in[c.i] == ',' {
			c.i++
			c.out = append(c.out, ',')
			continue
		}
		if c.in[c.i] != '}' {
			return false
		}
		c.i++
		break
	}
	if !sorted {
		written := slices.Clone(c.out[open+1:])
		slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) })
		c.out = c.out[:open+1]
		for k, m := range ms {
			if k > 0 {
				if bytes.Equal(ms[k-1].key, m.key) {
					return false // a repeated key
				}
				c.out = append(c.out, ',')
			}
			c.out = append(c.out, written[m.from-open-1:m.to-open-1]...)
		}
	}
	c.out = append(c.out, '}')
	c.depth--
	return true
}
