package reclaim

import (
	"context"
	"fmt"
	"time"

	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// republishTimeout bounds one republish transaction.
const republishTimeout = 10 * time.Second

// handleDeleted republishes the tasks of deleted entry ids from Postgres
// (task.RepublishDeleted: a new outbox event for each task that still has
// to run) and returns how many tasks it republished. Ids it could not
// handle (Postgres error) go to the backlog and are retried next round.
//
// XAUTOCLAIM has already removed the ids from the PEL, so the write is not
// cut short by ctx (shutdown): it gets republishTimeout of its own.
//
// The ids are message ids (stream.QualifyID) of any priority's stream;
// the new outbox events go to the task stream, whose relay publishes each
// to its task's priority stream again.
func (r *Reclaimer) handleDeleted(ctx context.Context, qids []string) int {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), republishTimeout)
	defer cancel()
	per := map[int][]string{}
	for _, q := range qids {
		p, id := stream.SplitID(q)
		per[p] = append(per[p], id)
	}
	republished := 0
	for _, p := range stream.Priorities {
		ids := per[p]
		if len(ids) == 0 {
			continue
		}
		key := stream.Key(r.cfg.Stream, p)
		tasks, matched, err := task.RepublishDeleted(ctx, r.db, key, r.cfg.Stream, ids)
		if err != nil {
			r.metrics.add(resultError, 1)
			r.logger.Error("republish tasks of deleted stream entries: retrying next round",
				"ids", len(ids), "message_id", ids[0], "err", fmt.Errorf("republish %d deleted entries of %s: %w", len(ids), key, err))
			back := make([]string, len(ids))
			for i, id := range ids {
				back[i] = stream.QualifyID(p, id)
			}
			r.toBacklog(back)
			continue
		}
		if unknown := len(ids) - matched; unknown > 0 {
			r.logger.Warn("deleted stream entries without an outbox event: not republished", "stream", key, "ids", unknown)
		}
		for _, id := range tasks {
			r.logger.Debug("republished task of a deleted stream entry", "task_id", id)
		}
		republished += len(tasks)
	}
	return republished
}

func (r *Reclaimer) toBacklog(ids []string) {
	r.backlog = append(r.backlog, ids...)
	if over := len(r.backlog) - maxBacklog; over > 0 {
		r.logger.Error("too many deleted stream entries to republish: dropping the oldest (the rescuer republishes their tasks)",
			"ids", over, "message_id", r.backlog[0])
		r.backlog = append([]string(nil), r.backlog[over:]...)
	}
}
