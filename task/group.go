package task

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Groups (a tenant, a customer, a source): NewTask.GroupKey names the
// group of a task, and a kind's ConcurrencyPerGroup and RatePerGroup hold
// for each of its groups as its Concurrency and Rate hold for the kind,
// across all processes, combined with them (a start needs room under
// both). The tasks without a group are one group, written '' in the
// group tables. The machinery is the kind's (limit.go): the same
// reservation, parking and release, with a slot table
// (ingest_group_slot) and a rate log (ingest_group_rate) per group; the
// reservations of a kind whose only limits are per group are serialized
// by group (lockStartGroupsSQL), those of any other limited kind by the
// kind's row.

// Fair scheduling: at most a kind's group window (its group_window, or
// DefaultGroupWindow) of a group's tasks are in the stream or running at
// once. A due task created beyond its group's window, or while its group
// has parked tasks, is created parked, without an outbox event. The end
// of a run of a group hands its room in the window on at once: the
// statement that records the end (its audit rows' trigger,
// ingest_task_ended, migration 00026) releases as many of the group's
// oldest parked tasks as it ended runs, with their outbox events, in the
// same transaction (for kinds neither paused nor limited, or whose only
// limit is concurrency_per_group, migration 00036: their window is at
// most that limit; the other kinds' releases go through ReleaseParked).
// Releases (ReleaseParked, through
// unparkGroupsSQL: the leader's releaser every 100 ms, a change of the
// kind) fill what room is left, serving the kind's groups round-robin. So
// the stream holds at most a window of each group's tasks, and a task of
// a quiet group waits behind at most a window of each busier group's
// tasks, whatever their backlog. A delayed task takes no room until it
// falls due, and is held to its window then: the outbox relay's pass
// calls ingest_task_hold_due (migration 00032), which parks it when its
// group has no room, before publishing it. So is a task of a group that
// the end of its dependencies or its sequence predecessor releases
// (ingest_task_end_edges gives it a due time), and a redriven one
// (redriveSQL): the relay's hold covers every task that becomes due after
// its create. Tasks without a group are never held back.
//
// Weights: a kind's group_weights gives a group a weight from 1 to
// MaxGroupWeight (a group not listed weighs 1). Its window is the kind's
// group window times its weight, and each round of a release takes up to
// its weight of its parked tasks, so that groups that keep the kind busy
// share its starts in proportion to their weights.

// DefaultGroupWindow is the group window of a kind whose group_window is
// 0: enough tasks of one group in flight to keep a few workers' handler
// slots busy between two releases.
const DefaultGroupWindow = 100

// GroupWindowRange bounds a kind's group window (0: DefaultGroupWindow).
var GroupWindowRange = Range{Field: "group_window", Min: 0, Max: MaxConcurrency}

// MaxGroupKeyLength is the longest group key accepted.
const MaxGroupKeyLength = 200

// Limits on a kind's group weights.
const (
	// MaxGroupWeight is the largest weight of a group.
	MaxGroupWeight = 100
	// MaxWeightedGroups is the most groups of one kind with a weight
	// other than 1.
	MaxWeightedGroups = 1000
)

// GroupWeightRange bounds the weight of a group (1: the default).
var GroupWeightRange = Range{Field: "group_weights", Min: 1, Max: MaxGroupWeight}

// checkGroupWeights checks a change of a kind's group weights: group keys
// as CheckGroupKey has them, weights in GroupWeightRange, at most
// MaxWeightedGroups of them. Its errors name group_weights.
func checkGroupWeights(w map[string]int) error {
	if len(w) > MaxWeightedGroups {
		return &FieldError{Field: "group_weights", Msg: fmt.Sprintf("group_weights names %d groups, at most %d may have a weight", len(w), MaxWeightedGroups)}
	}
	for g, n := range w {
		if g == "" {
			return &FieldError{Field: "group_weights", Msg: "group_weights: a group key is empty (the tasks without a group weigh 1)"}
		}
		if ferr := CheckGroupKey(g); ferr != nil {
			return &FieldError{Field: "group_weights", Msg: "group_weights: " + ferr.Msg}
		}
		if !GroupWeightRange.Contains(int64(n)) {
			return &FieldError{Field: "group_weights", Msg: fmt.Sprintf("group_weights: the weight of %q must be a whole number from %d to %d (1: the default), got %d",
				g, GroupWeightRange.Min, GroupWeightRange.Max, n)}
		}
	}
	return nil
}

// ConcurrencyPerGroupRange bounds a kind's per-group concurrency limit
// (0: none).
var ConcurrencyPerGroupRange = Range{Field: "concurrency_per_group", Min: 0, Max: MaxConcurrency}

// CheckGroupKey checks a new task's group key: at most MaxGroupKeyLength
// bytes, a name as CheckName has them, and no surrounding white space
// (two keys that print alike are one tenant). "" is no group.
func CheckGroupKey(key string) *FieldError {
	if ferr := CheckName("group_key", key, MaxGroupKeyLength); ferr != nil {
		return ferr
	}
	if len(key) > 0 && (key[0] == ' ' || key[len(key)-1] == ' ') {
		return &FieldError{Field: "group_key", Msg: "group_key must not begin or end with a space"}
	}
	return nil
}

// ParseGroupRate reads a per-group rate limit as ParseRate reads a
// kind's, its errors naming rate_per_group.
func ParseGroupRate(text string) (Rate, error) {
	r, err := ParseRate(text)
	var ferr *FieldError
	if errors.As(err, &ferr) {
		ferr.Field = "rate_per_group"
		ferr.Msg = "rate_per_group: " + ferr.Msg
	}
	return r, err
}

// rateColumns checks a rate setting of field (rate or rate_per_group)
// and returns its columns: the count, the period in milliseconds and the
// written form for the change row; all nil when r is nil (unchanged).
func rateColumns(r *Rate, field string) (count, periodMS *int64, text *string, err error) {
	if r == nil {
		return nil, nil, nil, nil
	}
	if err := r.validate(); err != nil {
		var ferr *FieldError
		if errors.As(err, &ferr) {
			ferr.Field = field
			ferr.Msg = field + ": " + ferr.Msg
		}
		return nil, nil, nil, err
	}
	n, ms, txt := int64(r.Count), r.Per.Milliseconds(), r.String()
	if r.Count == 0 {
		ms = time.Second.Milliseconds()
	}
	return &n, &ms, &txt, nil
}

// seedGroupSlotsSQL gives the running tasks of kind $1 their group slots
// when a per-group concurrency limit is set, so that a limit set under
// load counts them.
var seedGroupSlotsSQL = `INSERT INTO ingest_group_slot (kind, group_key, task_id)
SELECT kind, coalesce(group_key, ''), id FROM ` + liveTasks("t") + `
WHERE kind = $1 AND status = 'RUNNING' AND lease_until > now()
ON CONFLICT DO NOTHING`

// groupRoomSQL is how many more tasks of group g of kind $1 may start now
// under its per-group limits, inside a statement with CTE k (the kind's
// row): the group's free slots and the starts left in its rate window,
// each only when limited (2^31-1 when neither is; 0 under a rate limit
// unless the SQL expression rateOK is true).
func groupRoomSQL(g, rateOK string) string {
	return `least(
        CASE WHEN k.concurrency_per_group > 0 THEN greatest(k.concurrency_per_group - (
            SELECT count(*) FROM ingest_group_slot s WHERE s.kind = $1 AND s.group_key = ` + g + ` AND ` + takenSQL + `), 0) END,
        CASE WHEN k.rate_per_group_count > 0 AND NOT ` + rateOK + ` THEN 0
             WHEN k.rate_per_group_count > 0 THEN greatest(k.rate_per_group_count - (
            SELECT coalesce(sum(x.n), 0) FROM ingest_group_rate r, unnest(r.rate_log, r.rate_log_n) AS x(at, n)
            WHERE r.kind = $1 AND r.group_key = ` + g + ` AND x.at > now() - k.rate_per_group_period_ms * interval '1 millisecond'), 0) END,
        2147483647)`
}

// groupChoiceSQL are the CTEs of reserveSQL that choose the batch's
// tasks to start: gfree, the room of each group of the batch (only when
// the kind has a per-group limit), and chosen, the tasks in the batch's
// order, at most a group's room of each group and at most the kind's free
// room in all.
var groupChoiceSQL = `gfree AS (
    SELECT gs.g, ` + groupRoomSQL("gs.g", "($4 AND "+rateFreshSQL(
	`(SELECT r.rate_log FROM ingest_group_rate r WHERE r.kind = $1 AND r.group_key = gs.g)`)+")") + ` AS n
    FROM k, (SELECT DISTINCT g FROM ids WHERE mine) AS gs
    WHERE k.concurrency_per_group > 0 OR k.rate_per_group_count > 0
), ranked AS (
    SELECT i.id, i.ord, i.g, row_number() OVER (PARTITION BY i.g ORDER BY i.ord) AS rn FROM ids i WHERE i.mine
), chosen AS (
    SELECT r.id, r.g FROM ranked r LEFT JOIN gfree f ON f.g = r.g
    WHERE r.rn <= coalesce(f.n, 2147483647) ORDER BY r.ord LIMIT (SELECT n FROM free)`

// groupReserveSQL are the CTEs of reserveSQL that record the chosen
// tasks' group reservations: the stale slot rows of the batch's groups
// deleted, a group slot row for each chosen task (gslots) under a
// per-group concurrency limit, and one element per group in its rate log
// under a per-group rate limit.
var groupReserveSQL = `gstale AS (
    DELETE FROM ingest_group_slot d USING (
        SELECT s.group_key, s.task_id FROM ingest_group_slot s WHERE s.kind = $1 AND s.group_key IN (SELECT g FROM gfree)
            AND EXISTS (SELECT 1 FROM k WHERE k.concurrency_per_group > 0) AND NOT ` + takenSQL + `
        FOR UPDATE OF s SKIP LOCKED) x
    WHERE d.kind = $1 AND d.group_key = x.group_key AND d.task_id = x.task_id
), gslots AS (
    INSERT INTO ingest_group_slot (kind, group_key, task_id, reserved_at)
    SELECT $1, g, id, now() FROM chosen WHERE EXISTS (SELECT 1 FROM k WHERE k.concurrency_per_group > 0)
    ON CONFLICT (kind, group_key, task_id) DO UPDATE SET reserved_at = now()
    RETURNING task_id, xmax = 0 AS inserted
), glogged AS (
    INSERT INTO ingest_group_rate AS r (kind, group_key, rate_log, rate_log_n)
    SELECT $1, c.g, ARRAY[now()], ARRAY[count(*)::int] FROM chosen c
    WHERE EXISTS (SELECT 1 FROM k WHERE k.rate_per_group_count > 0) GROUP BY c.g
    ON CONFLICT (kind, group_key) DO UPDATE SET (rate_log, rate_log_n) = (
        SELECT coalesce(array_agg(y.at ORDER BY y.at), '{}'), coalesce(array_agg(y.n ORDER BY y.at), '{}') FROM (
            SELECT x.at, x.n FROM unnest(r.rate_log, r.rate_log_n) AS x(at, n)
            WHERE x.at > now() - ((SELECT k.rate_per_group_period_ms FROM k) + $3) * interval '1 millisecond'
            UNION ALL SELECT now(), excluded.rate_log_n[1]) AS y)`

// freeSlotsSQL deletes the kind and group slot rows of kind $1 held by
// the tasks of $2 and counts the tasks that held one.
const freeSlotsSQL = `
WITH a AS (DELETE FROM ingest_kind_slot WHERE kind = $1 AND task_id = ANY($2) RETURNING task_id),
     b AS (DELETE FROM ingest_group_slot WHERE kind = $1 AND task_id = ANY($2) RETURNING task_id)
SELECT count(*)::int FROM (SELECT task_id FROM a UNION SELECT task_id FROM b) AS u`

// maxReleaseGroups bounds how many groups one release of a kind with
// per-group limits looks at.
const maxReleaseGroups = 1000

// windowSQL is the group window of group g of kind k (SQL expressions)
// with the default window $n: the kind's window times the group's weight,
// and at most the kind's concurrency_per_group when it has one (a task
// beyond it would reach a worker only to be parked at the limit, and be
// released again: the window keeps it parked until its group has room).
// It reads the kind's row once (n, weight 1 and no cap without one).
// Migration 00035's ingest_group_window computes the same in SQL.
func windowSQL(k, g, n string) string {
	return `coalesce((SELECT least(coalesce(nullif(w.group_window, 0), ` + n + `) * coalesce((w.group_weights ->> ` + g + `)::int, 1),
        coalesce(nullif(w.concurrency_per_group, 0), 2147483647)) FROM ingest_kind w WHERE w.kind = ` + k + `), ` + n + `)`
}

// weightSQL is the weight of group g of kind k (SQL expressions): its
// entry in the kind's group_weights, else 1.
func weightSQL(k, g string) string {
	return `coalesce((SELECT (w.group_weights ->> ` + g + `)::int FROM ingest_kind w WHERE w.kind = ` + k + `), 1)`
}

// admittedSQL counts the tasks of group g of kind k in the stream or
// running: unfinished, not parked, not held by an edge (a dependency or
// its sequence: no outbox row of it is due) and not a QUEUED task due
// later (a delayed task enters its group's window when it falls due), in
// two probes of ingest_task_group_idx, the recent ones (as liveTasks: at
// or above the low water, not lingering) and the lingering ones. A retry
// waiting for its backoff counts: its entry is still in the stream.
// Migration 00032's ingest_group_admitted is the same count in SQL.
func admittedSQL(k, g string) string {
	return `((SELECT count(*) FROM ingest_task a WHERE a.kind = ` + k + ` AND a.group_key = ` + g + ` AND a.parked_at IS NULL
        AND ` + recentGuard("a") + ` AND ` + inStreamGuard("a") + `)
    + (SELECT count(*) FROM ingest_task a WHERE a.kind = ` + k + ` AND a.group_key = ` + g + ` AND a.parked_at IS NULL
        AND ` + lingeringGuard("a") + ` AND ` + inStreamGuard("a") + `))`
}

// inStreamGuard holds for an unparked, unfinished task that is in the
// stream or running (admittedSQL): neither held by an edge nor QUEUED and
// due later. a is the alias of ingest_task.
func inStreamGuard(a string) string {
	return `(` + notHeld(a) + ` AND (` + a + `.status <> 'QUEUED' OR ` + a + `.next_retry_at IS NULL OR ` + a + `.next_retry_at <= now()))`
}

// createRoomSQL tells, for each (kind $1[i], group $2[i]) of a batch
// being created, how many of its tasks may go to the stream now: none
// while the group has parked tasks (they go first), else what is left of
// its window ($3: DefaultGroupWindow). The caller holds the groups'
// locks (groupLockSQL).
var createRoomSQL = `
SELECT CASE WHEN EXISTS (SELECT 1 FROM ingest_task p WHERE p.kind = x.k AND p.group_key = x.g AND ` + parkedSQL("p") + `) THEN 0
            ELSE greatest(` + windowSQL("x.k", "x.g", "$3") + ` - ` + admittedSQL("x.k", "x.g") + `, 0) END
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(k, g, ord) ORDER BY x.ord`

// kindGroup is a group of a kind: what a window, a group's lock and its
// room belong to.
type kindGroup struct{ kind, group string }

// groupLockSQL takes the transaction-scoped advisory lock of each (kind
// $1[i], group $2[i]), in a fixed order: concurrent creators of one group
// count its window one after the other.
const groupLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('ingest-group/' || k || '/' || g, 0))
FROM unnest($1::text[], $2::text[]) AS x(k, g) ORDER BY k, g`

// holdBack decides which of the tasks items[ins[j]] about to be inserted
// are created parked by their group's window: tasks due now with a group
// beyond the room its window leaves (createRoomSQL). A task that will wait
// for an edge (its dependencies, or a predecessor in its sequence: heads)
// is not due now: it takes no room, and the relay holds it to the window
// once the edge releases it (ingest_task_end_edges gives it a due time,
// migration 00032). An item that repeats the idempotency key of an
// earlier item of the batch creates no task and takes no room either.
// It returns nil when none has a group.
func (s *Store) holdBack(ctx context.Context, tx pgx.Tx, items []prepared, ins []int, heads map[seqKey]seqHead) ([]bool, error) {
	index := map[kindGroup]int{}
	var kinds, groups []string
	// slot[j] is the place of items[ins[j]]'s group in kinds and groups,
	// or -1 when its window does not apply to it: no group, delayed,
	// waiting for an edge, or holding the idempotency key of an earlier
	// item of the batch (that item creates the task; this one creates
	// none).
	slot := make([]int, len(ins))
	seen := map[seqKey]bool{}
	type idemKey struct{ kind, key string }
	keyed := map[idemKey]bool{}
	for j, i := range ins {
		it := items[i]
		slot[j] = -1
		waits := it.hasDependencies()
		if it.SequenceKey != "" {
			k := seqKey{it.Kind, it.SequenceKey}
			waits = waits || seen[k] || heads[k].pred != uuid.Nil
			seen[k] = true
		}
		repeat := false
		if it.IdempotencyKey != "" {
			k := idemKey{it.Kind, it.IdempotencyKey}
			repeat, keyed[k] = keyed[k], true
		}
		if it.GroupKey == "" || !it.RunAt.IsZero() || it.Delay > 0 || waits || repeat {
			continue
		}
		p := kindGroup{it.Kind, it.GroupKey}
		g, ok := index[p]
		if !ok {
			g = len(kinds)
			index[p] = g
			kinds, groups = append(kinds, p.kind), append(groups, p.group)
		}
		slot[j] = g
	}
	if len(kinds) == 0 {
		return nil, nil
	}
	room := make([]int, 0, len(kinds))
	b := &pgx.Batch{}
	b.Queue(groupLockSQL, kinds, groups)
	b.Queue(createRoomSQL, kinds, groups, DefaultGroupWindow).Query(func(rows pgx.Rows) error {
		var err error
		room, err = pgx.CollectRows(rows, pgx.RowTo[int])
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("count the group windows of %d groups: %w", len(kinds), err)
	}
	held := make([]bool, len(ins))
	for j, g := range slot {
		if g < 0 {
			continue
		}
		if room[g] > 0 {
			room[g]--
			continue
		}
		held[j] = true
	}
	return held, nil
}

// unparkGroupsSQL releases up to $2 parked tasks of kind $1, which has a
// per-group limit or tasks held back by their group's window ($3:
// DefaultGroupWindow), round-robin across its groups: each group's oldest
// parked tasks, at most its room under the per-group limits and its
// window, taken in
// rounds (every group's first, then every group's second, ...; within a
// round the groups in an order that changes with each transaction), so
// that a group at its limit does not hold back the others and no group's
// backlog delays another's by more than a round. The groups come from a
// loose scan of ingest_task_parked_group_idx (one probe per group, at
// most maxReleaseGroups); the tasks without a group (”) from
// ingest_task_parked_idx.
var unparkGroupsSQL = `
WITH RECURSIVE gs AS (
    (SELECT group_key AS g, 1 AS depth FROM ingest_task
     WHERE kind = $1 AND ` + parkedSQL("ingest_task") + ` AND group_key IS NOT NULL ORDER BY group_key LIMIT 1)
    UNION ALL
    SELECT (SELECT t.group_key FROM ingest_task t
            WHERE t.kind = $1 AND ` + parkedSQL("t") + ` AND t.group_key IS NOT NULL AND t.group_key > gs.g
            ORDER BY t.group_key LIMIT 1), gs.depth + 1
    FROM gs WHERE gs.g IS NOT NULL AND gs.depth < ` + strconv.Itoa(maxReleaseGroups) + `
), groups AS (
    SELECT g FROM gs WHERE g IS NOT NULL
    UNION ALL
    SELECT '' WHERE EXISTS (SELECT 1 FROM ingest_task WHERE kind = $1 AND ` + parkedSQL("ingest_task") + ` AND group_key IS NULL)
), k AS (
    SELECT coalesce(max(concurrency_per_group), 0) AS concurrency_per_group, coalesce(max(rate_per_group_count), 0) AS rate_per_group_count,
           coalesce(max(rate_per_group_period_ms), 1000) AS rate_per_group_period_ms FROM ingest_kind WHERE kind = $1
), room AS (
    SELECT gr.g, least(` + groupRoomSQL("gr.g", "true") + `, $2,
        CASE WHEN gr.g <> '' THEN greatest(` + windowSQL("$1", "gr.g", "$3") + ` - ` + admittedSQL("$1", "gr.g") + `, 0) END) AS n,
        CASE WHEN gr.g <> '' THEN ` + weightSQL("$1", "gr.g") + ` ELSE 1 END AS w
    FROM groups gr, k
), picked AS (
    SELECT p.id FROM room CROSS JOIN LATERAL (
        SELECT q.id, row_number() OVER (ORDER BY q.id) AS rn FROM (
            (SELECT t.id FROM ingest_task t
             WHERE room.g <> '' AND t.kind = $1 AND t.group_key = room.g AND ` + parkedSQL("t") + `
             ORDER BY t.id LIMIT greatest(room.n, 0))
            UNION ALL
            (SELECT t.id FROM ingest_task t
             WHERE room.g = '' AND t.kind = $1 AND t.group_key IS NULL AND ` + parkedSQL("t") + `
             ORDER BY t.id LIMIT greatest(room.n, 0))) AS q) AS p
    ORDER BY (p.rn - 1) / room.w, md5(room.g || now()::text), p.rn LIMIT $2
)
UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
FROM picked p WHERE t.id = p.id AND CASE WHEN ` + parkedSQL("t") + ` AND t.status IN ` + waitingSQL + ` THEN true ELSE false END
RETURNING t.id, coalesce(t.traceparent, ''), coalesce(t.priority, 2)`

// limitedKindsSQL lists the kinds not paused that have a limit, or
// parked tasks with a group (held back by a window; found by a loose scan
// of ingest_task_parked_group_idx, one probe per kind).
const limitedKindsSQL = `
WITH RECURSIVE hk AS (
    (SELECT kind FROM ingest_task WHERE parked_at IS NOT NULL AND group_key IS NOT NULL ORDER BY kind LIMIT 1)
    UNION ALL
    SELECT (SELECT t.kind FROM ingest_task t WHERE t.parked_at IS NOT NULL AND t.group_key IS NOT NULL AND t.kind > hk.kind
            ORDER BY t.kind LIMIT 1)
    FROM hk WHERE hk.kind IS NOT NULL
)
SELECT kind FROM ingest_kind WHERE NOT paused
    AND (concurrency > 0 OR rate_count > 0 OR concurrency_per_group > 0 OR rate_per_group_count > 0)
UNION
SELECT hk.kind FROM hk WHERE hk.kind IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM ingest_kind k WHERE k.kind = hk.kind AND k.paused)
ORDER BY 1`
