package stream

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// PriorityShare is how the consumer shares its reads of new entries among
// the priority streams (docs/FAIRNESS.md "Priorities"): of every
// PriorityShare reads, PriorityShare-1 serve the streams highest priority
// first (an entry of priority 3 is read only when there are not enough
// of priorities 1 and 2 for the free slots), and one serves them lowest
// priority first. So, while higher priorities keep arriving, the lowest
// non-empty level still gets the first entries of one read in
// PriorityShare; no level starves.
const PriorityShare = 8

//go:embed read.lua
var readLua string

var readScript = redis.NewScript(readLua)

// HashTag returns the Redis Cluster hash tag of key, "" when it has none:
// the text between the first '{' and the first '}' after it, when not
// empty. Keys with the same tag are in the same slot.
func HashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return ""
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return ""
	}
	return key[open+1 : open+1+end]
}

// priorityReader reads new entries from the stream of every priority of
// one task stream, in the order of PriorityShare, and qualifies their ids
// (QualifyID).
type priorityReader struct {
	rdb      redis.UniversalClient
	group    string
	consumer string
	keys     []string // highest priority first
	prio     map[string]int
	// scripted: the keys share one slot (a single Redis, or a hash tag on
	// Redis Cluster), so one script reads them all; otherwise one
	// XREADGROUP per key.
	scripted bool
	reads    uint64
}

func newPriorityReader(cfg Config, rdb redis.UniversalClient) *priorityReader {
	r := &priorityReader{rdb: rdb, group: cfg.Group, consumer: cfg.Consumer, keys: Keys(cfg.Stream), prio: map[string]int{}}
	for _, p := range Priorities {
		r.prio[Key(cfg.Stream, p)] = p
	}
	_, cluster := rdb.(*redis.ClusterClient)
	r.scripted = !cluster || HashTag(cfg.Stream) != ""
	return r
}

// order returns the keys in the order of the next read: lowest priority
// first on one read in PriorityShare, highest first on the others.
func (r *priorityReader) order() []string {
	r.reads++
	if r.reads%PriorityShare != 0 {
		return r.keys
	}
	rev := slices.Clone(r.keys)
	slices.Reverse(rev)
	return rev
}

// readNew reads up to n new entries without blocking.
func (r *priorityReader) readNew(ctx context.Context, n int) ([]redis.XMessage, error) {
	keys := r.order()
	var res []redis.XStream
	if r.scripted {
		var err error
		if res, err = r.runScript(ctx, keys, n); err != nil {
			return nil, fmt.Errorf("read %s (all priorities): %w", r.keys[1], err)
		}
	} else {
		for _, k := range keys {
			got, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: r.group, Consumer: r.consumer,
				Streams: []string{k, ">"}, Count: int64(n), Block: -1}).Result()
			if err != nil && err != redis.Nil {
				return r.qualify(res), fmt.Errorf("xreadgroup %s >: %w", k, err)
			}
			for _, s := range got {
				n -= len(s.Messages)
			}
			res = append(res, got...)
			if n <= 0 {
				break
			}
		}
	}
	return r.qualify(res), nil
}

// runScript runs read.lua (EVALSHA, EVAL when the script is not loaded)
// and parses its XREADGROUP-shaped reply.
func (r *priorityReader) runScript(ctx context.Context, keys []string, n int) ([]redis.XStream, error) {
	args := func(cmd, script string) []any {
		a := make([]any, 0, 6+len(keys))
		a = append(a, cmd, script, len(keys))
		for _, k := range keys {
			a = append(a, k)
		}
		return append(a, r.group, r.consumer, n)
	}
	cmd := redis.NewXStreamSliceCmd(ctx, args("evalsha", readScript.Hash())...)
	_ = r.rdb.Process(ctx, cmd)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		cmd = redis.NewXStreamSliceCmd(ctx, args("eval", readLua)...)
		_ = r.rdb.Process(ctx, cmd)
	}
	res, err := cmd.Result()
	if err == redis.Nil {
		return nil, nil
	}
	return res, err
}

// block waits up to block for a new entry of any priority's stream (one
// XREADGROUP, COUNT 1: at most one entry per stream).
func (r *priorityReader) block(ctx context.Context, block time.Duration) ([]redis.XMessage, error) {
	keys := r.keys
	streams := make([]string, 0, 2*len(keys))
	streams = append(streams, keys...)
	for range keys {
		streams = append(streams, ">")
	}
	res, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: r.group, Consumer: r.consumer,
		Streams: streams, Count: 1, Block: block}).Result()
	if err == redis.Nil {
		return nil, nil // BLOCK timed out
	}
	if err != nil {
		return nil, fmt.Errorf("xreadgroup %s >: %w", strings.Join(keys, " "), err)
	}
	return r.qualify(res), nil
}

// readOwn reads up to n of this consumer's pending entries of stream key
// after id ("0" to start), qualified.
func (r *priorityReader) readOwn(ctx context.Context, key, after string, n int) ([]redis.XMessage, error) {
	res, err := r.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: r.group, Consumer: r.consumer,
		Streams: []string{key, after}, Count: int64(n), Block: -1}).Result()
	if err == redis.Nil {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("xreadgroup %s %s: %w", key, after, err)
	}
	return r.qualify(res), nil
}

// qualify flattens a reply into messages with qualified ids.
func (r *priorityReader) qualify(res []redis.XStream) []redis.XMessage {
	var msgs []redis.XMessage
	for _, s := range res {
		p := r.prio[s.Stream]
		for _, m := range s.Messages {
			m.ID = QualifyID(p, m.ID)
			msgs = append(msgs, m)
		}
	}
	return msgs
}
