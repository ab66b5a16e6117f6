package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// RunNowOutcome is what RunNow did.
type RunNowOutcome string

const (
	// RunNowDone: the task was QUEUED or RETRYING, due later, and is due
	// now, with a new outbox event due at once.
	RunNowDone RunNowOutcome = "DUE"
	// RunNowNotWaiting: the task is RUNNING or terminal; nothing changed.
	RunNowNotWaiting RunNowOutcome = "NOT_WAITING"
	// RunNowAlreadyDue: the task waits but is due already (a worker
	// starts it as soon as one is free); nothing changed.
	RunNowAlreadyDue RunNowOutcome = "ALREADY_DUE"
	// RunNowParked: the task is parked (due, but its kind is paused or at
	// a limit); nothing changed. Run-now does not force a task past its kind's pause
	// or limits: resume the kind, or raise the limit.
	RunNowParked RunNowOutcome = "PARKED"
	// RunNowHeld: the task is held by its dependencies (Task.WaitingFor
	// > 0); nothing changed. It runs when they have ended.
	RunNowHeld RunNowOutcome = "HELD"
)

// RunNowResult is the outcome of RunNow.
type RunNowResult struct {
	Outcome RunNowOutcome
	// Status is the task's state (unchanged by RunNow).
	Status State
	// NextRetryAt is when the task was due before the call (nil: due).
	NextRetryAt *time.Time
}

// RunNowMessage is the audit message of a run-now.
const RunNowMessage = "run now"

// runNowSQL makes task $1 due now for actor $2, in one statement: a QUEUED
// or RETRYING task, not parked, due later, gets next_retry_at = now() (and
// due_at = now(): its latency is measured from the run-now) and an audit row (from and to its unchanged state, message RunNowMessage,
// worker the actor: no state changes, but the operator's action is in the
// task's trail); its outbox rows not yet published (a delayed task's row,
// due later) are deleted and a new row to stream $3, due now, is
// inserted, so the task is published at once and no stale row publishes
// it again later. An entry of the task already in Redis, claimable later,
// is left: the start guard skips it once the task has run. The guard is on
// the UPDATE, re-checked on the row's latest version. The last SELECT
// returns the task's state before the statement and whether it changed
// (no row: unknown id).
var runNowSQL = `
WITH l AS (
    SELECT id, status, next_retry_at, parked_at, waiting_for FROM ingest_task WHERE id = $1
), u AS (
    UPDATE ingest_task t SET next_retry_at = now(), due_at = now(), updated_at = now()
    WHERE t.id = $1 AND t.status IN ` + waitingSQL + ` AND NOT ` + parkedSQL("t") + ` AND ` + notHeld("t") + ` AND t.next_retry_at > now()
    RETURNING t.id, t.status, t.attempt_count
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, status, status, attempt_count, '` + RunNowMessage + `', $2 FROM u
), stale AS (
    DELETE FROM outbox_row e USING u
    WHERE e.task_id = u.id AND e.status IN ('NEW', 'RETRYING')
), fresh AS (
    INSERT INTO outbox_row (task_id, stream) SELECT id, $3 FROM u
)
SELECT l.status, l.next_retry_at, ` + parkedSQL("l") + `, NOT ` + notHeld("l") + `, EXISTS (SELECT 1 FROM u) FROM l`

// RunNow makes task id, QUEUED or RETRYING and due later, due now on
// behalf of actor (recorded as the audit row's worker), and publishes it at
// once (a task with a group takes its turn in its group's window: the
// relay parks it when the window has no room, as it does a delayed task
// falling due). See RunNowOutcome for the refusals; it returns ErrNotFound for an
// unknown id.
func (s *Store) RunNow(ctx context.Context, actor string, id uuid.UUID) (RunNowResult, error) {
	if actor == "" {
		return RunNowResult{}, fmt.Errorf("%w: run-now needs an actor", ErrInvalidTask)
	}
	var res RunNowResult
	var parked, held, changed bool
	err := s.retry(ctx, func() error {
		return s.db.QueryRow(ctx, runNowSQL, id, actor, s.cfg.Stream).Scan(&res.Status, &res.NextRetryAt, &parked, &held, &changed)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return RunNowResult{}, fmt.Errorf("run task %s now: %w", id, ErrNotFound)
	}
	if err != nil {
		return RunNowResult{}, fmt.Errorf("run task %s now: %w", id, err)
	}
	switch {
	case changed:
		res.Outcome = RunNowDone
	case res.Status != Queued && res.Status != Retrying:
		res.Outcome = RunNowNotWaiting
	case held:
		res.Outcome = RunNowHeld
	case parked:
		res.Outcome = RunNowParked
	default:
		res.Outcome = RunNowAlreadyDue
	}
	return res, nil
}

// Refusal explains why RunNow left task id alone ("" when it did not):
// the one wording of the API, the CLI and the dashboard.
func (r RunNowResult) Refusal(id uuid.UUID) string {
	switch r.Outcome {
	case RunNowDone:
		return ""
	case RunNowParked:
		return fmt.Sprintf("task %s is parked: its kind is paused or at a limit; resume the kind or raise its limit (run-now does not override them)", id)
	case RunNowHeld:
		return fmt.Sprintf("task %s waits for its dependencies; it runs when they have ended (run-now does not override them)", id)
	case RunNowAlreadyDue:
		return fmt.Sprintf("task %s is %s and already due; it starts as soon as a worker is free", id, r.Status)
	default:
		return fmt.Sprintf("task %s is %s; only a QUEUED or RETRYING task waiting for a later time can be run now", id, r.Status)
	}
}
