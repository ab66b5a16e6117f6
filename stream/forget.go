package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// EntryRef names one published entry: its stream key and entry id, as an
// outbox row records them (outbox_event.stream and stream_id).
type EntryRef struct {
	Stream string
	ID     string
}

// IsNoStream reports whether err says the stream key does not exist (XINFO
// on a missing key: "ERR no such key"; servers before Redis 6 say "ERR The
// XINFO ...").
func IsNoStream(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(strings.ToLower(msg), "no such key") || strings.HasPrefix(msg, "ERR The XINFO")
}

// IsMissing reports whether err says the stream or its consumer group does
// not exist: IsNoStream, or a NOGROUP error anywhere in the text (a Lua
// script's error wraps the command's).
func IsMissing(err error) bool {
	return IsNoStream(err) || (err != nil && strings.Contains(err.Error(), "NOGROUP"))
}

// Forget removes entries whose tasks were deleted from their streams, for
// good: each is acknowledged in every consumer group of its stream (XACK,
// so that it leaves the pending entries lists and no reclaimer claims it)
// and deleted from the stream (XDEL, so that no group reads it later). A
// worker that reads an entry of no task dead-letters it as poison; after
// Forget no worker reads these. It reads the groups of every stream in one
// pipelined round trip (XINFO GROUPS) and removes the entries in a second
// one; entries of a stream that does not exist, or that are gone already,
// are skipped. It returns how many entries it deleted from their streams.
//
// On Redis Cluster the commands of one stream go to its slot; a pipeline
// over several streams is split by slot by the client.
func Forget(ctx context.Context, rdb redis.UniversalClient, refs []EntryRef) (int, error) {
	byStream := map[string][]string{}
	var streams []string
	for _, r := range refs {
		if _, ok := byStream[r.Stream]; !ok {
			streams = append(streams, r.Stream)
		}
		byStream[r.Stream] = append(byStream[r.Stream], r.ID)
	}
	if len(streams) == 0 {
		return 0, nil
	}
	infos := make([]*redis.XInfoGroupsCmd, len(streams))
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range streams {
			infos[i] = p.XInfoGroups(ctx, s)
		}
		return nil
	})
	var dels []*redis.IntCmd
	var errs []error
	pipe := rdb.Pipeline()
	for i, s := range streams {
		groups, err := infos[i].Result()
		switch {
		case IsNoStream(err):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("xinfo groups %s: %w", s, err))
			continue
		}
		ids := byStream[s]
		for _, g := range groups {
			pipe.XAck(ctx, s, g.Name, ids...)
		}
		dels = append(dels, pipe.XDel(ctx, s, ids...))
	}
	if len(dels) > 0 {
		cmds, _ := pipe.Exec(ctx)
		for _, c := range cmds {
			if err := c.Err(); err != nil && !IsNoGroup(err) {
				errs = append(errs, fmt.Errorf("%s %s: %w", c.Name(), c.Args()[1], err))
			}
		}
	}
	n := 0
	for _, d := range dels {
		n += int(d.Val())
	}
	return n, errors.Join(errs...)
}
