package task

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/outbox"
)

// ParkedUntil is the next_retry_at of a parked task: one whose kind was
// paused when a worker read its entry. No start and no rescuer pass takes
// it before its kind is resumed (Store.SetPaused), which makes it due at
// once and publishes it again.
var ParkedUntil = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// parkedSQL is ParkedUntil in SQL, written as migration 00010's partial
// index ingest_task_parked_idx has it, so that the planner uses the index.
const parkedSQL = `'9999-12-31 00:00:00+00'`

// Parked reports whether t is parked (its kind is paused).
func (t Task) Parked() bool {
	return (t.Status == Queued || t.Status == Retrying) && t.NextRetryAt != nil && t.NextRetryAt.Equal(ParkedUntil)
}

// unparkBatch is how many parked tasks one transaction of a resume
// releases.
const unparkBatch = 1000

// PausedKinds returns the kinds that are paused now.
func (s *Store) PausedKinds(ctx context.Context) (map[string]bool, error) {
	rows, err := s.db.Query(ctx, `SELECT kind FROM ingest_kind WHERE paused`)
	if err != nil {
		return nil, fmt.Errorf("read paused kinds: %w", err)
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read paused kinds: %w", err)
	}
	out := make(map[string]bool, len(kinds))
	for _, k := range kinds {
		out[k] = true
	}
	return out, nil
}

// parkSQL parks the due waiting tasks of $1 whose kind is paused. The
// paused kinds' rows are share-locked first: a resume (which updates the
// row) either commits before, and then nothing is parked, or waits until
// this statement committed, and then releases what it parked.
var parkSQL = `
WITH k AS (
    SELECT kind FROM ingest_kind
    WHERE paused AND kind IN (SELECT t.kind FROM ingest_task t WHERE t.id = ANY($1::uuid[]))
    ORDER BY kind FOR SHARE
), l AS (
    SELECT t.id FROM unnest($1::uuid[]) AS x(id) JOIN ingest_task t ON t.id = x.id
    WHERE t.kind IN (SELECT kind FROM k)
    ORDER BY t.id FOR NO KEY UPDATE OF t
)
UPDATE ingest_task t SET next_retry_at = ` + parkedSQL + `, updated_at = now()
FROM l WHERE t.id = l.id
  AND CASE WHEN t.status IN ` + waitingSQL + ` AND ` + due("t") + ` THEN true ELSE false END
RETURNING t.id`

// Park parks those of ids that are due QUEUED or RETRYING tasks of a
// paused kind, and returns them; the others are left alone (their kind
// was resumed meanwhile, or they are not waiting to start). Parking is no
// state change and writes no audit row.
func (s *Store) Park(ctx context.Context, ids ...uuid.UUID) ([]uuid.UUID, error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	var parked []uuid.UUID
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, parkSQL, ids)
		if err != nil {
			return err
		}
		parked, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("park %d tasks: %w", len(ids), err)
	}
	return parked, nil
}

// unparkSQL makes up to $2 parked tasks of kind $1 due at once.
var unparkSQL = `
WITH p AS (
    SELECT id FROM ingest_task
    WHERE kind = $1 AND next_retry_at = ` + parkedSQL + ` AND status IN ` + waitingSQL + `
    ORDER BY id LIMIT $2
    FOR NO KEY UPDATE
)
UPDATE ingest_task t SET next_retry_at = NULL, updated_at = now()
FROM p WHERE t.id = p.id
RETURNING t.id`

// checkKind validates a kind name given to the kind settings.
func checkKind(kind string) error {
	switch {
	case strings.TrimSpace(kind) == "":
		return &FieldError{Field: "kind", Msg: "kind is empty"}
	case len(kind) > MaxKindLength:
		return &FieldError{Field: "kind", Msg: fmt.Sprintf("kind is %d bytes, the limit is %d", len(kind), MaxKindLength)}
	case strings.ContainsRune(kind, 0):
		return &FieldError{Field: "kind", Msg: "kind holds a NUL character"}
	}
	return nil
}

// SetPaused pauses or resumes kind, as actor, and records the change in
// ingest_kind_change. Pausing takes effect in every worker within
// about a second (they read the paused kinds once a second); their tasks
// already running finish. Resuming releases every task parked meanwhile:
// each is due at once and gets a new outbox event, a thousand per
// transaction. It returns how many tasks it released.
func (s *Store) SetPaused(ctx context.Context, actor, kind string, paused bool) (released int, err error) {
	if err := checkKind(kind); err != nil {
		return 0, err
	}
	if actor == "" {
		return 0, fmt.Errorf("%w: pausing or resuming a kind needs an actor", ErrInvalidTask)
	}
	var changeID int64
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ingest_kind (kind, paused, updated_by) VALUES ($1, $2, $3)
			ON CONFLICT (kind) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now(), updated_by = EXCLUDED.updated_by`,
			kind, paused, actor); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO ingest_kind_change (kind, actor, paused) VALUES ($1, $2, $3) RETURNING id`,
			kind, actor, paused).Scan(&changeID)
	})
	if err != nil {
		return 0, fmt.Errorf("set kind %q paused=%v: %w", kind, paused, err)
	}
	if paused {
		return 0, nil
	}
	// The flag is off and committed: no task of the kind is parked from
	// now on (Park share-locks the row and re-checks it), so the loop
	// ends with every parked task released.
	for {
		var n int
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, unparkSQL, kind, unparkBatch)
			if err != nil {
				return err
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			if err != nil {
				return err
			}
			n = len(ids)
			return outbox.Insert(ctx, tx, s.cfg.Stream, ids...)
		})
		if err != nil {
			return released, fmt.Errorf("resume kind %q (%d parked tasks released so far): %w", kind, released, err)
		}
		released += n
		if n < unparkBatch {
			break
		}
	}
	if _, err := s.db.Exec(ctx, `UPDATE ingest_kind_change SET released = $2 WHERE id = $1`, changeID, released); err != nil {
		return released, fmt.Errorf("resume kind %q: record %d released tasks: %w", kind, released, err)
	}
	return released, nil
}

// KindInfo is one kind as Store.Kinds reports it.
type KindInfo struct {
	Kind      string     `json:"kind"`
	Paused    bool       `json:"paused"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
	UpdatedBy string     `json:"updated_by,omitempty"`
	// Counts are the kind's tasks by status (states without tasks are
	// left out).
	Counts map[State]int64 `json:"counts"`
	// Running counts the RUNNING tasks whose lease is live.
	Running int64 `json:"running"`
	// Parked counts the tasks waiting for the kind's resume.
	Parked int64 `json:"parked"`
}

// kindsSQL counts every kind's tasks by status, with its settings. It
// reads the whole task table: an operator's query, not one for a hot path.
var kindsSQL = `
WITH c AS (
    SELECT kind, status, count(*) AS n,
           count(*) FILTER (WHERE status = 'RUNNING' AND lease_until > now()) AS running,
           count(*) FILTER (WHERE next_retry_at = ` + parkedSQL + ` AND status IN ` + waitingSQL + `) AS parked
    FROM ingest_task WHERE $1 = '' OR kind = $1 GROUP BY kind, status
)
SELECT coalesce(c.kind, k.kind), coalesce(k.paused, false), k.updated_at, coalesce(k.updated_by, ''),
       coalesce(c.status, ''), coalesce(c.n, 0), coalesce(c.running, 0), coalesce(c.parked, 0)
FROM c FULL JOIN (SELECT * FROM ingest_kind WHERE $1 = '' OR kind = $1) k ON k.kind = c.kind
ORDER BY 1, 5`

// Kinds returns every kind that has tasks or settings, by name.
func (s *Store) Kinds(ctx context.Context) ([]KindInfo, error) { return s.kinds(ctx, "") }

// Kind returns one kind as Kinds does, and false when it has neither
// tasks nor settings.
func (s *Store) Kind(ctx context.Context, kind string) (KindInfo, bool, error) {
	ks, err := s.kinds(ctx, kind)
	if err != nil || len(ks) == 0 {
		return KindInfo{}, false, err
	}
	return ks[0], true, nil
}

func (s *Store) kinds(ctx context.Context, kind string) ([]KindInfo, error) {
	rows, err := s.db.Query(ctx, kindsSQL, kind)
	if err != nil {
		return nil, fmt.Errorf("list kinds: %w", err)
	}
	defer rows.Close()
	var out []KindInfo
	for rows.Next() {
		var (
			k                 KindInfo
			status            string
			n, running, parks int64
		)
		if err := rows.Scan(&k.Kind, &k.Paused, &k.UpdatedAt, &k.UpdatedBy, &status, &n, &running, &parks); err != nil {
			return nil, fmt.Errorf("list kinds: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].Kind != k.Kind {
			k.Counts = map[State]int64{}
			out = append(out, k)
		}
		cur := &out[len(out)-1]
		if status != "" {
			cur.Counts[State(status)] = n
		}
		cur.Running += running
		cur.Parked += parks
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list kinds: %w", err)
	}
	return out, nil
}
