package task

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/pgsession"
)

// CancelChannel is the Postgres NOTIFY channel on which Cancel announces
// the id of a RUNNING task whose cancel it requested; every worker LISTENs
// on it (ListenCancels) and cancels the handler if the task runs there.
const CancelChannel = "ingest_cancel"

// MaxCancelReasonBytes bounds the reason given to Cancel.
const MaxCancelReasonBytes = 1024

// CancelOutcome is what Cancel did.
type CancelOutcome string

const (
	// CancelDone: the task is CANCELLED now. It was QUEUED or RETRYING
	// (due or not), or RUNNING under an expired lease (its worker is taken
	// for dead; a late completion of that run is a conflict).
	CancelDone CancelOutcome = "CANCELLED"
	// CancelRequested: the task is RUNNING under a live lease; the cancel
	// is recorded in the row and announced on CancelChannel. The worker
	// running it cancels the handler's context (at the latest at its next
	// lease renewal) and the run's completion writes CANCELLED. Asking
	// again keeps the first request's reason and actor.
	CancelRequested CancelOutcome = "REQUESTED"
	// CancelRefused: the task is already terminal (SUCCEEDED, DEAD or
	// CANCELLED); nothing changed.
	CancelRefused CancelOutcome = "TERMINAL"
)

// CancelResult is the outcome of Cancel.
type CancelResult struct {
	Outcome CancelOutcome
	// Task is the row after the call (without its payload).
	Task Task
}

// cancelSQL cancels task $1 for actor $2 with reason $3 (NULL: none), in
// one statement, run after the row is locked (see Cancel): a waiting task, or a RUNNING
// one under an expired lease, goes CANCELLED with its audit row; a RUNNING
// one gets the cancel request and a NOTIFY on CancelChannel (delivered at
// commit). The row is locked first and the guard repeated on the target
// as in the other transitions. The first branch returns the changed row,
// the second the refused (terminal) one.
var cancelSQL = `
WITH l AS (
    SELECT t.* FROM ingest_task t WHERE t.id = $1 FOR NO KEY UPDATE
), u AS (
    UPDATE ingest_task t SET
        status              = CASE WHEN ` + cancelNow("l") + ` THEN 'CANCELLED' ELSE t.status END,
        next_retry_at       = CASE WHEN ` + cancelNow("l") + ` THEN NULL ELSE t.next_retry_at END,
        parked_at           = CASE WHEN ` + cancelNow("l") + ` THEN NULL ELSE t.parked_at END,
        finished_at         = CASE WHEN ` + cancelNow("l") + ` THEN now() ELSE t.finished_at END,
        lease_owner         = CASE WHEN ` + cancelNow("l") + ` THEN NULL ELSE t.lease_owner END,
        lease_until         = CASE WHEN ` + cancelNow("l") + ` THEN NULL ELSE t.lease_until END,
        cancel_reason       = CASE WHEN t.cancel_requested_at IS NULL THEN $3 ELSE t.cancel_reason END,
        cancel_requested_by = CASE WHEN t.cancel_requested_at IS NULL THEN $2 ELSE t.cancel_requested_by END,
        cancel_requested_at = coalesce(t.cancel_requested_at, now()),
        updated_at          = now()
    FROM l
    WHERE t.id = l.id AND l.status NOT IN ` + terminalSQL + `
      AND CASE WHEN t.status NOT IN ` + terminalSQL + ` THEN true ELSE false END
    RETURNING t.*, l.status AS from_status
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, from_status, status, attempt_count, ` + cancelMessage("u") + `, cancel_requested_by
    FROM u WHERE status = 'CANCELLED'
), notify AS (
    SELECT pg_notify('` + CancelChannel + `', id::text) FROM u WHERE status = 'RUNNING'
)
SELECT ` + taskColumnsNoPayload + `, true, (SELECT count(*) FROM notify) FROM u
UNION ALL
SELECT ` + taskColumnsNoPayload + `, false, 0 FROM l WHERE id NOT IN (SELECT id FROM u)`

// cancelNow is the guard of a cancel that ends the task at once: it is
// waiting (QUEUED or RETRYING, due or not), or RUNNING under an expired
// lease. a is the alias of ingest_task.
func cancelNow(a string) string {
	return `(` + a + `.status IN ('QUEUED', 'RETRYING') OR (` + expiredLease(a) + `))`
}

// Cancel cancels task id on behalf of actor (recorded as the audit row's
// worker, e.g. "api:<consumer>", "cli:<user>"), with an optional reason
// (the audit message is "cancelled: <reason>"). See CancelOutcome for what
// it does in each state; it returns ErrNotFound for an unknown id.
func (s *Store) Cancel(ctx context.Context, actor, reason string, id uuid.UUID) (CancelResult, error) {
	if actor == "" {
		return CancelResult{}, fmt.Errorf("%w: cancel needs an actor", ErrInvalidTask)
	}
	if len(reason) > MaxCancelReasonBytes {
		return CancelResult{}, &FieldError{Field: "reason", Msg: fmt.Sprintf("reason is %d bytes, the limit is %d", len(reason), MaxCancelReasonBytes)}
	}
	if ferr := CheckText("reason", reason); ferr != nil {
		return CancelResult{}, ferr
	}
	var arg *string
	if reason = strings.TrimSpace(truncateError(reason)); reason != "" {
		arg = &reason
	}
	var res CancelResult
	// The row is locked by a statement of its own first: cancelSQL then
	// runs with a snapshot taken after the lock, so the version it reads as
	// the target row is the locked one. In one statement, the target row's
	// latest version (which the UPDATE writes from) can differ from the
	// version the CTE locked and decided on, and a waiting task could get a
	// cancel request instead of being cancelled.
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockTasksSQL, []uuid.UUID{id}); err != nil {
			return err
		}
		var changed bool
		var notified int
		t, err := scanTask(tx.QueryRow(ctx, cancelSQL, id, actor, arg), &changed, &notified)
		if err != nil {
			return err
		}
		res = CancelResult{Task: t}
		switch {
		case !changed:
			res.Outcome = CancelRefused
		case t.Status == Cancelled:
			res.Outcome = CancelDone
		default:
			res.Outcome = CancelRequested
		}
		return nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return CancelResult{}, fmt.Errorf("cancel task %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return CancelResult{}, fmt.Errorf("cancel task %s: %w", id, err)
	}
	return res, nil
}

// ErrNoListen is returned by ListenCancels when the store's DB cannot open
// a dedicated connection (it is not a *pgxpool.Pool and Config.Listen
// names no connection), or when Config.Listen.None says there is no
// session to LISTEN on.
var ErrNoListen = errors.New("task store: LISTEN needs a *pgxpool.Pool")

// listenApplicationName names the cancel listener's connection in
// pg_stat_activity.
const listenApplicationName = "ingest-cancel-listener"

// ListenCancels opens a dedicated connection from the store's pool,
// LISTENs on CancelChannel, calls listening once it does, and then calls
// fn with the task id of every cancel request until the connection fails
// or ctx is cancelled (it returns the error; the caller reconnects).
// Notifications sent while no connection listens are lost: a worker also
// learns of cancel requests from Renew.
func (s *Store) ListenCancels(ctx context.Context, listening func(), fn func(uuid.UUID)) error {
	return s.listen(ctx, CancelChannel, listenApplicationName, listening, func(payload string) {
		if id, err := uuid.Parse(payload); err == nil {
			fn(id)
		}
	})
}

// listen opens a dedicated connection (Config.Listen, else one like the
// pool's, named appName in pg_stat_activity), LISTENs on channel, calls
// listening once it does, and then calls fn with the payload of every
// notification until the connection fails or ctx is cancelled (it returns
// the error; the caller reconnects).
func (s *Store) listen(ctx context.Context, channel, appName string, listening func(), fn func(payload string)) error {
	if !s.cfg.Listen.Enabled() {
		return fmt.Errorf("%w: %w", ErrNoListen, pgsession.ErrNone)
	}
	pool, ok := s.db.(*pgxpool.Pool)
	if !ok && s.cfg.Listen.Conn == nil {
		return ErrNoListen
	}
	conn, err := s.cfg.Listen.Connect(ctx, pool, appName)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen %s: %w", channel, err)
	}
	listening()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		fn(n.Payload)
	}
}
