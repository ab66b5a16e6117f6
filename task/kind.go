package task

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// A parked task is a QUEUED or RETRYING task with parked_at set: a worker
// parked it because its kind was paused (Park) or at a concurrency or
// rate limit (StartLimited), and acknowledged its entry. No start and no
// rescuer pass takes it (the guard due) until a resume or a freed slot
// releases it (ReleaseParked), which clears parked_at and publishes it
// again. Its next_retry_at keeps its own due time (one that had come when
// it was parked).

// Why a parked task waits: the reason label of ingest_kind_waiting_tasks
// and Task.ParkedReason.
const (
	// ParkedPaused: its kind is paused.
	ParkedPaused = "paused"
	// ParkedLimit: its kind is not paused, and the task waits for a slot
	// or a start under the kind's concurrency or rate limit.
	ParkedLimit = "limit"
)

// ParkReason is why a parked task of a kind waits: ParkedPaused while the
// kind is paused, else ParkedLimit.
func ParkReason(kindPaused bool) string {
	if kindPaused {
		return ParkedPaused
	}
	return ParkedLimit
}

// Parked reports whether t is parked (see ParkedAt).
func (t Task) Parked() bool {
	return (t.Status == Queued || t.Status == Retrying) && t.ParkedAt != nil
}

// ParkedNote says for people why t waits: "parked (kind paused)" or
// "waiting for a slot" (ParkedReason, as Get and List fill it in), just
// "parked" when the reason was not read, and "" when t is not parked.
func (t Task) ParkedNote() string {
	switch {
	case !t.Parked():
		return ""
	case t.ParkedReason == ParkedPaused:
		return "parked (kind paused)"
	case t.ParkedReason == ParkedLimit:
		return "waiting for a slot"
	}
	return "parked"
}

// parkedSQL is the guard of a parked task, as ingest_task_parked_idx's
// predicate names it (so that the planner uses the index). a is the alias
// of ingest_task.
func parkedSQL(a string) string { return a + `.parked_at IS NOT NULL` }

// unparkBatch is how many parked tasks one transaction of a resume
// releases.
const unparkBatch = 1000

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
UPDATE ingest_task t SET parked_at = now(), updated_at = now()
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
		rows, err := pgplan.Query(ctx, s.db, parkSQL, ids)
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

// unparkSQL releases up to $2 parked tasks of kind $1 and returns their
// ids and traceparents: they are due at once (their own due time had come
// when they were parked). The guard on
// the target row is a CASE, so that no plan reads the target rows from
// ingest_task_parked_idx by id (a scan of every parked task per row; see
// targetGuard): they come through the primary key.
var unparkSQL = `
WITH p AS (
    SELECT id FROM ingest_task
    WHERE kind = $1 AND ` + parkedSQL("ingest_task") + ` AND status IN ` + waitingSQL + `
    ORDER BY id LIMIT $2
    FOR NO KEY UPDATE
)
UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
FROM p WHERE t.id = p.id AND CASE WHEN ` + parkedSQL("t") + ` THEN true ELSE false END
RETURNING t.id, coalesce(t.traceparent, ''), coalesce(t.priority, 2)`

// checkKind validates a kind name given to the kind settings: the rule of
// names (CheckName), as for the kind of a new task.
func checkKind(kind string) error {
	if strings.TrimSpace(kind) == "" {
		return &FieldError{Field: "kind", Msg: "kind is empty"}
	}
	if ferr := CheckName("kind", kind, MaxKindLength); ferr != nil {
		return ferr
	}
	return nil
}

// SetPaused pauses or resumes kind, as actor (SetKind with Paused only).
// Pausing takes effect in every worker within about a second; their
// tasks already running finish. Resuming releases the tasks parked
// meanwhile (all of them, or as many as the kind's limits let start).
// It returns how many tasks it released.
func (s *Store) SetPaused(ctx context.Context, actor, kind string, paused bool) (released int, err error) {
	return s.SetKind(ctx, actor, kind, KindUpdate{Paused: &paused})
}

// KindInfo is one kind as Store.Kinds reports it.
type KindInfo struct {
	Kind      string     `json:"kind"`
	Paused    bool       `json:"paused"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
	UpdatedBy string     `json:"updated_by,omitempty"`
	// Concurrency is the kind's concurrency limit (0: none).
	Concurrency int `json:"concurrency"`
	// Rate is the kind's rate limit as ParseRate reads it ("0": none).
	Rate string `json:"rate"`
	// SequenceOnFailure is what a DEAD task of the kind does to its
	// sequence: SequenceBlock (the default) or SequenceContinue.
	SequenceOnFailure string `json:"sequence_on_failure"`
	// BlockedSequences counts the kind's sequences whose head task is DEAD
	// and holds its successors (see Store.BlockedSequences).
	BlockedSequences int64 `json:"blocked_sequences"`
	// ConcurrencyPerGroup and RatePerGroup are the kind's per-group
	// limits (0, "0": none); GroupWindow its group window (0: the
	// default, DefaultGroupWindow).
	ConcurrencyPerGroup int    `json:"concurrency_per_group"`
	RatePerGroup        string `json:"rate_per_group"`
	GroupWindow         int    `json:"group_window"`
	// GroupWeights are the weights of the kind's groups that weigh more
	// than 1, the default (empty: none).
	GroupWeights map[string]int `json:"group_weights"`
	// Counts are the kind's tasks by status (states without tasks are
	// left out).
	Counts map[State]int64 `json:"counts"`
	// Running counts the RUNNING tasks whose lease is live.
	Running int64 `json:"running"`
	// Parked counts the tasks waiting for the kind's resume or for a free
	// slot or start under its limits.
	Parked int64 `json:"parked"`
	// StartRate is the kind's observed starts per second over the last
	// StartRateWindow.
	StartRate float64 `json:"start_rate"`
}

// StartRateWindow is the window of KindInfo.StartRate.
const StartRateWindow = 10 * time.Second

// startRateSQL counts the starts of each kind in the last $1 ms, from the
// audit rows of that window (found on the BRIN index of their created_at:
// the table is only appended to, so the window is its last pages).
const startRateSQL = `
SELECT t.kind, count(*) FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
WHERE tr.created_at >= now() - $1 * interval '1 millisecond' AND tr.to_status = 'RUNNING'
  AND ($2 = '' OR t.kind = $2)
GROUP BY t.kind`

// kindsSQL counts every kind's tasks by status, with its settings. It
// reads the whole task table: an operator's query, not one for a hot path.
var kindsSQL = `
WITH c AS (
    SELECT kind, status, count(*) AS n,
           count(*) FILTER (WHERE status = 'RUNNING' AND lease_until > now()) AS running,
           count(*) FILTER (WHERE ` + parkedSQL("ingest_task") + ` AND status IN ` + waitingSQL + `) AS parked
    FROM ingest_task WHERE $1 = '' OR kind = $1 GROUP BY kind, status
)
SELECT coalesce(c.kind, k.kind), coalesce(k.paused, false), k.updated_at, coalesce(k.updated_by, ''),
       coalesce(k.concurrency, 0), coalesce(k.rate_count, 0), coalesce(k.rate_period_ms, 1000),
       coalesce(k.sequence_on_failure, 'block'), coalesce(c.status, ''), coalesce(c.n, 0), coalesce(c.running, 0), coalesce(c.parked, 0),
       coalesce(k.concurrency_per_group, 0), coalesce(k.rate_per_group_count, 0), coalesce(k.rate_per_group_period_ms, 1000),
       coalesce(k.group_window, 0), coalesce(k.group_weights, '{}')
FROM c FULL JOIN (SELECT * FROM ingest_kind WHERE $1 = '' OR kind = $1) k ON k.kind = c.kind
ORDER BY 1, 9`

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
			rate, groupRate   Rate
			periodMS, gMS     int64
		)
		if err := rows.Scan(&k.Kind, &k.Paused, &k.UpdatedAt, &k.UpdatedBy, &k.Concurrency, &rate.Count, &periodMS,
			&k.SequenceOnFailure, &status, &n, &running, &parks, &k.ConcurrencyPerGroup, &groupRate.Count, &gMS, &k.GroupWindow, &k.GroupWeights); err != nil {
			return nil, fmt.Errorf("list kinds: %w", err)
		}
		rate.Per = time.Duration(periodMS) * time.Millisecond
		k.Rate = rate.String()
		groupRate.Per = time.Duration(gMS) * time.Millisecond
		k.RatePerGroup = groupRate.String()
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
	rows, err = s.db.Query(ctx, startRateSQL, StartRateWindow.Milliseconds(), kind)
	if err != nil {
		return nil, fmt.Errorf("list kinds: start rates: %w", err)
	}
	index := make(map[string]int, len(out))
	for i, k := range out {
		index[k.Kind] = i
	}
	var name string
	var starts int64
	_, err = pgx.ForEachRow(rows, []any{&name, &starts}, func() error {
		if i, ok := index[name]; ok {
			out[i].StartRate = float64(starts) / StartRateWindow.Seconds()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list kinds: start rates: %w", err)
	}
	blocked, err := s.BlockedSequenceCounts(ctx, kind)
	if err != nil {
		return nil, fmt.Errorf("list kinds: %w", err)
	}
	for k, n := range blocked {
		if i, ok := index[k]; ok {
			out[i].BlockedSequences = n
		}
	}
	return out, nil
}
