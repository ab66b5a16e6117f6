package task

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The statements of this file keep the low water of the unfinished tasks
// (migration 00025), which the leader raises (package maintenance).
// liveTasks reads the unfinished tasks as the recent ids (at or above the
// low water, not lingering) and the lingering tasks, under the invariant:
// every unfinished task with an id below the low water is lingering. No
// index names finished_at, so a completion is a HOT update.
//
// A raise takes two steps, which may be passes apart:
//
//  1. PublishLowWater publishes a cutoff in the sequence
//     ingest_task_pending_ms, which every insert of a task reads in its
//     own statement (outside its snapshot) to create a task with an id
//     below it lingering, and records the virtual transactions that then
//     held a writer's lock on ingest_task: the inserts that may have read
//     the cutoff before.
//  2. AdvanceLowWater, once none of those is open, marks lingering every
//     unfinished task between the low water and the cutoff that is not
//     yet, and raises the low water to the cutoff, in one transaction:
//     a reader that sees the new low water sees the marks.
//
// An insert that read the old cutoff holds its lock until its transaction
// ends, so it was recorded in step 1 and step 2 sees its tasks; an insert
// that locked the table after step 1 read the new cutoff and marked its
// tasks itself. Redrive makes a task lingering (redriveSQL).

// lowWaterReadSQL reads the low water, the pending cutoff (NULL: none)
// and whether a transaction it waits for is still open.
const lowWaterReadSQL = `
SELECT w.low, w.pending, EXISTS (SELECT 1 FROM pg_locks l WHERE l.virtualtransaction = ANY(w.pending_wait))
FROM ingest_task_low_water w WHERE w.one`

// lowWaterCutoffSQL is the cutoff for a lag of $1 ms: the smallest UUIDv7
// of the millisecond $1 ms before the database's now(), and that
// millisecond.
var lowWaterCutoffSQL = `
SELECT ` + idAtSQL("c.ms") + `, c.ms
FROM (SELECT ` + nowMinusMSSQL("$1::bigint") + ` AS ms) c`

// publishCutoffSQL sets the sequence the inserts read to the cutoff's
// millisecond $1, never lowering it. A sequence is not transactional: the
// value holds from now on, for statements of every snapshot.
const publishCutoffSQL = `SELECT setval('ingest_task_pending_ms', greatest($1::bigint, coalesce(pg_sequence_last_value('ingest_task_pending_ms'), 0)))`

// recordPendingSQL records the cutoff $1 as pending, with the virtual
// transactions that hold a lock on ingest_task that lets them write
// (RowExclusiveLock or stronger; prepared transactions too), unless a
// cutoff is pending already or the low water is not below $1. It runs
// after publishCutoffSQL: a transaction that takes its lock later reads
// the new cutoff.
const recordPendingSQL = `
UPDATE ingest_task_low_water SET pending = $1, pending_wait = (
    SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}') FROM pg_locks l
    WHERE l.locktype = 'relation' AND l.relation = 'ingest_task'::regclass
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
      AND l.mode NOT IN ('AccessShareLock', 'RowShareLock') AND l.pid IS DISTINCT FROM pg_backend_pid())
WHERE one AND pending IS NULL AND low < $1
RETURNING cardinality(pending_wait)`

// markLingeringSQL marks lingering the unfinished tasks in [$1, $2) that
// are not yet: on the primary key, the tasks created between two raises.
const markLingeringSQL = `
UPDATE ingest_task SET lingering = true
WHERE id >= $1 AND id < $2 AND finished_at IS NULL AND lingering IS NULL`

// raiseLowWaterSQL raises the low water to the pending cutoff $1.
const raiseLowWaterSQL = `
UPDATE ingest_task_low_water SET low = pending, pending = NULL, pending_wait = NULL, advanced_at = now()
WHERE one AND pending = $1`

// clearLingeringSQL clears lingering on up to $1 finished tasks (on
// ingest_task_lingering_idx), skipping rows locked by their workers, so
// that the index holds little more than the old unfinished tasks. A task
// redriven meanwhile is unfinished again under the row lock and is left.
const clearLingeringSQL = `
UPDATE ingest_task t SET lingering = NULL
FROM (SELECT id FROM ingest_task WHERE lingering AND finished_at IS NOT NULL ORDER BY id LIMIT $1 FOR NO KEY UPDATE SKIP LOCKED) c
WHERE t.id = c.id AND t.lingering AND t.finished_at IS NOT NULL`

// LowWater is the state of the low water.
type LowWater struct {
	// Low: every unfinished task with an id below it is lingering.
	Low uuid.UUID
	// Pending is the cutoff published and not applied yet (uuid.Nil:
	// none); Waiting, whether a transaction it waits for is still open.
	Pending uuid.UUID
	Waiting bool
}

// ReadLowWater returns the state of the low water.
func ReadLowWater(ctx context.Context, db DB) (LowWater, error) {
	var w LowWater
	var pending *uuid.UUID
	if err := db.QueryRow(ctx, lowWaterReadSQL).Scan(&w.Low, &pending, &w.Waiting); err != nil {
		return LowWater{}, fmt.Errorf("read the low water: %w", err)
	}
	if pending != nil {
		w.Pending = *pending
	}
	return w, nil
}

// PublishLowWater publishes the cutoff lag before the database's now()
// as pending (step 1 above), unless one is pending already or the low
// water is not below it. It returns the cutoff it published (uuid.Nil:
// none) and how many transactions it waits for.
func PublishLowWater(ctx context.Context, db DB, lag time.Duration) (uuid.UUID, int, error) {
	var cutoff uuid.UUID
	var ms int64
	if err := db.QueryRow(ctx, lowWaterCutoffSQL, lag.Milliseconds()).Scan(&cutoff, &ms); err != nil {
		return uuid.Nil, 0, fmt.Errorf("publish a low-water cutoff: %w", err)
	}
	w, err := ReadLowWater(ctx, db)
	if err != nil {
		return uuid.Nil, 0, err
	}
	if w.Pending != uuid.Nil || bytes.Compare(w.Low[:], cutoff[:]) >= 0 {
		return uuid.Nil, 0, nil
	}
	if _, err := db.Exec(ctx, publishCutoffSQL, ms); err != nil {
		return uuid.Nil, 0, fmt.Errorf("publish low-water cutoff %s: %w", cutoff, err)
	}
	var n int
	switch err := db.QueryRow(ctx, recordPendingSQL, cutoff).Scan(&n); {
	case errors.Is(err, pgx.ErrNoRows):
		return uuid.Nil, 0, nil // published by another leader meanwhile
	case err != nil:
		return uuid.Nil, 0, fmt.Errorf("record low-water cutoff %s: %w", cutoff, err)
	}
	return cutoff, n, nil
}

// AdvanceLowWater raises the low water to the pending cutoff (step 2
// above) once no transaction it waits for is open. It returns whether it
// did, the new low water and how many tasks it marked lingering; without
// a pending cutoff, or while one it waits for is open, it does nothing.
func AdvanceLowWater(ctx context.Context, db DB) (bool, uuid.UUID, int64, error) {
	var low uuid.UUID
	var marked int64
	var advanced bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var pending *uuid.UUID
		var waiting bool
		if err := tx.QueryRow(ctx, lowWaterReadSQL+` FOR UPDATE`).Scan(&low, &pending, &waiting); err != nil {
			return err
		}
		if pending == nil || waiting {
			return nil
		}
		tag, err := tx.Exec(ctx, markLingeringSQL, low, *pending)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, raiseLowWaterSQL, *pending); err != nil {
			return err
		}
		advanced, low, marked = true, *pending, tag.RowsAffected()
		return nil
	})
	if err != nil {
		return false, uuid.Nil, 0, fmt.Errorf("raise the low water: %w", err)
	}
	return advanced, low, marked, nil
}

// ClearLingering clears lingering on up to limit finished tasks and
// returns how many.
func ClearLingering(ctx context.Context, db DB, limit int) (int64, error) {
	tag, err := db.Exec(ctx, clearLingeringSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("clear lingering on finished tasks: %w", err)
	}
	return tag.RowsAffected(), nil
}
