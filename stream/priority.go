package stream

import (
	"fmt"
	"strconv"
	"strings"
)

// Task priorities (docs/FAIRNESS.md "Priorities"): 1 is the highest, 4 the
// lowest; a task created without one has DefaultPriority.
const (
	HighestPriority = 1
	DefaultPriority = 2
	LowestPriority  = 4
)

// Priorities lists every priority, highest first.
var Priorities = []int{1, 2, 3, 4}

// ValidPriority reports whether p is a priority (0 is not: callers map
// "none given" to DefaultPriority first).
func ValidPriority(p int) bool { return p >= HighestPriority && p <= LowestPriority }

// Key returns the stream that carries the tasks of priority p published to
// the task stream base: base itself for the default priority (and for 0,
// "none given"), base + ":p1", ":p3" or ":p4" for the others. The suffix
// keeps base's {hash tag}, so on Redis Cluster every level of one task
// stream lives in one slot, and one read or script can name them all.
//
// Key is the one place that names the priority streams.
func Key(base string, p int) string {
	if p == 0 || p == DefaultPriority {
		return base
	}
	return base + ":p" + strconv.Itoa(p)
}

// Keys returns the streams of every priority of base, highest first (so
// Keys(base)[1] is base).
func Keys(base string) []string {
	keys := make([]string, len(Priorities))
	for i, p := range Priorities {
		keys[i] = Key(base, p)
	}
	return keys
}

// QualifyID returns the message id the worker uses for entry id of the
// stream of priority p: id itself for the default priority, "p<p>/"+id
// for the others. Entry ids are only unique within one stream; qualified,
// the ids of all the levels of one task stream are unique together, and
// SplitID recovers the stream.
func QualifyID(p int, id string) string {
	if p == 0 || p == DefaultPriority {
		return id
	}
	return "p" + strconv.Itoa(p) + "/" + id
}

// SplitID is the inverse of QualifyID: the priority of a qualified message
// id and its entry id. An id without a valid prefix is the default
// priority's.
func SplitID(qid string) (p int, id string) {
	head, rest, ok := strings.Cut(qid, "/")
	if !ok || len(head) != 2 || head[0] != 'p' {
		return DefaultPriority, qid
	}
	p = int(head[1] - '0')
	if !ValidPriority(p) {
		return DefaultPriority, qid
	}
	return p, rest
}

// byStream groups qualified message ids by the stream of base they belong
// to, in the order of Keys(base); streams with no id are left out.
func byStream(base string, qids []string) []streamIDs {
	var per [LowestPriority + 1][]string
	for _, q := range qids {
		p, id := SplitID(q)
		per[p] = append(per[p], id)
	}
	var out []streamIDs
	for _, p := range Priorities {
		if len(per[p]) > 0 {
			out = append(out, streamIDs{stream: Key(base, p), priority: p, ids: per[p]})
		}
	}
	return out
}

// streamIDs is the entry ids of one stream.
type streamIDs struct {
	stream   string
	priority int
	ids      []string
}

// PriorityOf returns the priority whose stream of base is key, or an error
// naming key when it is none of them.
func PriorityOf(base, key string) (int, error) {
	for _, p := range Priorities {
		if Key(base, p) == key {
			return p, nil
		}
	}
	return 0, fmt.Errorf("stream %q is no priority stream of %q", key, base)
}
