package dlq

import (
	"errors"
	"strconv"
	"strings"
)

// ErrBadEntryID is the error of an entry id that is not one (see
// ValidEntryID).
var ErrBadEntryID = errors.New("bad entry id")

// ValidEntryID reports whether id is a stream entry id Redis accepts:
// MS-SEQ, or MS alone, both unsigned 64-bit decimal numbers. Anything else
// is no entry of any stream: Replay reports it EntryNotFound and List
// refuses it as After, where Redis would answer an error.
func ValidEntryID(id string) bool {
	ms, seq, hasSeq := strings.Cut(id, "-")
	if !decimal64(ms) {
		return false
	}
	return !hasSeq || decimal64(seq)
}

func decimal64(s string) bool {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return false
	}
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}
