package task

import (
	"errors"
	"strconv"
	"time"
)

// Groups (a tenant, a customer, a source): NewTask.GroupKey names the
// group of a task, and a kind's ConcurrencyPerGroup and RatePerGroup hold
// for each of its groups as its Concurrency and Rate hold for the kind,
// across all processes, combined with them (a start needs room under
// both). The tasks without a group are one group, written '' in the
// group tables. The machinery is the kind's (limit.go): the same lock,
// reservation, parking and release, with a slot table
// (ingest_group_slot) and a rate log (ingest_group_rate) per group.

// MaxGroupKeyLength is the longest group key accepted.
const MaxGroupKeyLength = 200

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
SELECT kind, coalesce(group_key, ''), id FROM ingest_task t
WHERE ` + liveGuard("t") + ` AND kind = $1 AND status = 'RUNNING' AND lease_until > now()
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
    SELECT gs.g, ` + groupRoomSQL("gs.g", "$4") + ` AS n
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
    DELETE FROM ingest_group_slot s WHERE s.kind = $1 AND s.group_key IN (SELECT g FROM gfree)
        AND EXISTS (SELECT 1 FROM k WHERE k.concurrency_per_group > 0) AND NOT ` + takenSQL + `
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

// unparkGroupsSQL releases up to $2 parked tasks of kind $1, which has a
// per-group limit, round-robin across its groups: each group's oldest
// parked tasks, at most its room under the per-group limits, taken in
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
    SELECT concurrency_per_group, rate_per_group_count, rate_per_group_period_ms FROM ingest_kind WHERE kind = $1
), room AS (
    SELECT gr.g, least(` + groupRoomSQL("gr.g", "true") + `, $2) AS n FROM groups gr, k
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
    ORDER BY p.rn, md5(room.g || now()::text) LIMIT $2
)
UPDATE ingest_task t SET parked_at = NULL, updated_at = now()
FROM picked p WHERE t.id = p.id AND CASE WHEN ` + parkedSQL("t") + ` AND t.status IN ` + waitingSQL + ` THEN true ELSE false END
RETURNING t.id, coalesce(t.traceparent, '')`
