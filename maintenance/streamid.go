package maintenance

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ingest-worker/ingest/stream"
)

// streamID is a parsed Redis stream entry id "ms-seq".
type streamID struct{ ms, seq uint64 }

func parseStreamID(s string) (streamID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		seq = "0"
	}
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if err1 != nil || err2 != nil {
		return streamID{}, fmt.Errorf("bad stream entry id %q", s)
	}
	return streamID{a, b}, nil
}

func (id streamID) String() string { return fmt.Sprintf("%d-%d", id.ms, id.seq) }

func (id streamID) less(o streamID) bool {
	return id.ms < o.ms || (id.ms == o.ms && id.seq < o.seq)
}

// next is the smallest id greater than id.
func (id streamID) next() streamID {
	if id.seq == math.MaxUint64 {
		return streamID{id.ms + 1, 0}
	}
	return streamID{id.ms, id.seq + 1}
}

// isNoSuchKey reports whether err says the stream does not exist (XINFO
// on a missing key): stream.IsNoStream, under a name that the functions
// with a parameter called stream can call.
var isNoSuchKey = stream.IsNoStream
