package task

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
	"github.com/ingest-worker/ingest/outbox"
)

// Limits on the per-kind settings.
const (
	// MaxConcurrency is the largest concurrency limit of a kind (see
	// ConcurrencyRange).
	MaxConcurrency = 100_000
	// MaxRateCount is the largest count of a rate limit.
	MaxRateCount = 10_000
	// rateLogMargin is how much longer than its period a start is kept in
	// a kind's (and a group's) rate log. A start is logged at its
	// transaction's time (now()), so logged times can be out of commit
	// order by as long as a transaction waited for the kind's lock. A
	// transaction whose time is more than the margin older than the
	// log's newest element starts nothing (rateFreshSQL): it could need
	// elements that a younger one has already dropped.
	rateLogMargin = time.Second
)

// Rate is a kind's start-rate limit: at most Count starts in any window of
// length Per, across all processes. The zero Rate is no limit.
type Rate struct {
	Count int
	Per   time.Duration
}

// rateUnits are the written forms of a rate's period.
var rateUnits = map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}

// ParseRate reads a rate limit: "5/s", "300/m", "1000/h", or a count per
// any Go duration ("10/500ms", "7/2s"); "0" and "" mean no limit.
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return Rate{}, nil
	}
	count, per, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, &FieldError{Field: "rate", Msg: fmt.Sprintf("rate %q is not COUNT/PERIOD (5/s, 300/m, 10/500ms; 0: no limit)", s)}
	}
	n, err := strconv.Atoi(strings.TrimSpace(count))
	if err != nil || n < 0 {
		return Rate{}, &FieldError{Field: "rate", Msg: fmt.Sprintf("rate %q: the count %q is not a whole number from 0 to %d", s, count, MaxRateCount)}
	}
	per = strings.TrimSpace(per)
	d, ok := rateUnits[per]
	if !ok {
		if d, err = time.ParseDuration(per); err != nil {
			return Rate{}, &FieldError{Field: "rate", Msg: fmt.Sprintf("rate %q: the period %q is not s, m, h or a duration like 500ms", s, per)}
		}
	}
	r := Rate{Count: n, Per: d}
	if n == 0 {
		return Rate{}, nil
	}
	return r, r.validate()
}

func (r Rate) validate() error {
	switch {
	case r.Count == 0:
		return nil
	case r.Count < 0 || r.Count > MaxRateCount:
		return &FieldError{Field: "rate", Msg: fmt.Sprintf("rate count %d is out of range 0..%d", r.Count, MaxRateCount)}
	case r.Per < time.Millisecond || r.Per > 24*time.Hour || r.Per%time.Millisecond != 0:
		return &FieldError{Field: "rate", Msg: fmt.Sprintf("rate period %s is not whole milliseconds between 1ms and 24h", r.Per)}
	}
	return nil
}

// String writes r as ParseRate reads it ("0" for no limit).
func (r Rate) String() string {
	if r.Count == 0 {
		return "0"
	}
	for _, u := range []string{"s", "m", "h"} {
		if r.Per == rateUnits[u] {
			return strconv.Itoa(r.Count) + "/" + u
		}
	}
	return strconv.Itoa(r.Count) + "/" + r.Per.String()
}

// Limits are a kind's flow-control settings as workers apply them.
type Limits struct {
	Paused bool
	// Concurrency is the most tasks of the kind RUNNING at once under a
	// live lease, across all processes (0: no limit).
	Concurrency int
	// Rate is the most starts of the kind in any window (zero: no limit).
	Rate Rate
	// ConcurrencyPerGroup and RatePerGroup hold for each group of the
	// kind (NewTask.GroupKey; the tasks without one are one group) as
	// Concurrency and Rate hold for the kind, and combine with them.
	ConcurrencyPerGroup int
	RatePerGroup        Rate
}

// Limited reports whether starts of the kind go through StartLimited.
func (l Limits) Limited() bool {
	return l.Concurrency > 0 || l.Rate.Count > 0 || l.ConcurrencyPerGroup > 0 || l.RatePerGroup.Count > 0
}

// HoldsSlots reports whether a run of the kind holds a slot (a kind or a
// group concurrency limit) that its end gives back (FreeSlots).
func (l Limits) HoldsSlots() bool { return l.Concurrency > 0 || l.ConcurrencyPerGroup > 0 }

// KindUpdate changes a kind's settings; nil fields are left as they are.
type KindUpdate struct {
	Paused              *bool
	Concurrency         *int
	Rate                *Rate
	ConcurrencyPerGroup *int
	RatePerGroup        *Rate
	// GroupWindow is the most tasks of one group in the stream or
	// running at once (fair scheduling; 0: DefaultGroupWindow), never
	// more than ConcurrencyPerGroup when it is set (windowSQL).
	GroupWindow *int
	// GroupWeights sets the weights of the groups it names (1..
	// MaxGroupWeight; 1 resets a group to the default); the other groups
	// keep theirs. nil or empty: unchanged.
	GroupWeights map[string]int
	// SequenceOnFailure is SequenceBlock or SequenceContinue (see
	// sequence.go).
	SequenceOnFailure *string
}

// KindLimits returns the settings of every kind that is paused or
// limited; the others have none.
func (s *Store) KindLimits(ctx context.Context) (map[string]Limits, error) {
	rows, err := s.db.Query(ctx, `SELECT kind, paused, concurrency, rate_count, rate_period_ms,
		concurrency_per_group, rate_per_group_count, rate_per_group_period_ms FROM ingest_kind
		WHERE paused OR concurrency > 0 OR rate_count > 0 OR concurrency_per_group > 0 OR rate_per_group_count > 0`)
	if err != nil {
		return nil, fmt.Errorf("read kind limits: %w", err)
	}
	out := map[string]Limits{}
	var (
		kind     string
		l        Limits
		periodMS int64
		groupMS  int64
	)
	_, err = pgx.ForEachRow(rows, []any{&kind, &l.Paused, &l.Concurrency, &l.Rate.Count, &periodMS,
		&l.ConcurrencyPerGroup, &l.RatePerGroup.Count, &groupMS}, func() error {
		l.Rate.Per = time.Duration(periodMS) * time.Millisecond
		if l.Rate.Count == 0 {
			l.Rate = Rate{}
		}
		l.RatePerGroup.Per = time.Duration(groupMS) * time.Millisecond
		if l.RatePerGroup.Count == 0 {
			l.RatePerGroup = Rate{}
		}
		out[kind] = l
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read kind limits: %w", err)
	}
	return out, nil
}

// SetKind changes kind's settings as actor and records the change in
// ingest_kind_change. A change takes effect in every worker within about
// a second (they read the settings once a second); tasks already running
// finish. When the kind is not paused after the change, parked tasks are
// released: all of them when it has no limit, else as many as its limits
// let start now (the leader's releaser wakes the rest as slots and
// starts free). It returns how many tasks it released.
func (s *Store) SetKind(ctx context.Context, actor, kind string, u KindUpdate) (released int, err error) {
	if err := checkKind(kind); err != nil {
		return 0, err
	}
	if actor == "" {
		return 0, fmt.Errorf("%w: changing a kind's settings needs an actor", ErrInvalidTask)
	}
	if u.Paused == nil && u.Concurrency == nil && u.Rate == nil && u.ConcurrencyPerGroup == nil && u.RatePerGroup == nil && u.GroupWindow == nil &&
		u.SequenceOnFailure == nil && len(u.GroupWeights) == 0 {
		return 0, &FieldError{Field: "paused", Msg: "nothing to change: give paused, concurrency, rate, concurrency_per_group, rate_per_group, group_window, group_weights or sequence_on_failure"}
	}
	if err := checkGroupWeights(u.GroupWeights); err != nil {
		return 0, err
	}
	var weights *string // the change's weights as JSON; nil: unchanged
	if len(u.GroupWeights) > 0 {
		b, err := json.Marshal(u.GroupWeights)
		if err != nil {
			return 0, fmt.Errorf("change kind %q: %w", kind, err)
		}
		w := string(b)
		weights = &w
	}
	if err := checkSequenceOnFailure(u.SequenceOnFailure); err != nil {
		return 0, err
	}
	if w := u.GroupWindow; w != nil && !GroupWindowRange.Contains(int64(*w)) {
		ferr := GroupWindowRange.Check(int64(*w))
		ferr.Msg += " (0: the default)"
		return 0, ferr
	}
	if c := u.Concurrency; c != nil && !ConcurrencyRange.Contains(int64(*c)) {
		ferr := ConcurrencyRange.Check(int64(*c))
		ferr.Msg += " (0: no limit)"
		return 0, ferr
	}
	if c := u.ConcurrencyPerGroup; c != nil && !ConcurrencyPerGroupRange.Contains(int64(*c)) {
		ferr := ConcurrencyPerGroupRange.Check(int64(*c))
		ferr.Msg += " (0: no limit)"
		return 0, ferr
	}
	rateCount, ratePeriod, rateText, err := rateColumns(u.Rate, "rate")
	if err != nil {
		return 0, err
	}
	groupCount, groupPeriod, groupText, err := rateColumns(u.RatePerGroup, "rate_per_group")
	if err != nil {
		return 0, err
	}
	var lim Limits
	var changeID int64
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var periodMS, groupMS int64
		var weighted int
		if err := tx.QueryRow(ctx, `INSERT INTO ingest_kind AS k (kind, paused, concurrency, rate_count, rate_period_ms, updated_by,
				concurrency_per_group, rate_per_group_count, rate_per_group_period_ms, group_window, sequence_on_failure, group_weights)
			VALUES ($1, coalesce($2, false), coalesce($3, 0), coalesce($4, 0), coalesce($5, 1000), $6, coalesce($7, 0), coalesce($8, 0), coalesce($9, 1000),
				coalesce($10, 0), coalesce($11, 'block'), `+mergeWeightsSQL("'{}'::jsonb", "$12")+`)
			ON CONFLICT (kind) DO UPDATE SET paused = coalesce($2, k.paused), concurrency = coalesce($3, k.concurrency),
				rate_count = coalesce($4, k.rate_count), rate_period_ms = coalesce($5, k.rate_period_ms),
				concurrency_per_group = coalesce($7, k.concurrency_per_group),
				rate_per_group_count = coalesce($8, k.rate_per_group_count), rate_per_group_period_ms = coalesce($9, k.rate_per_group_period_ms),
				group_window = coalesce($10, k.group_window),
				sequence_on_failure = coalesce($11, k.sequence_on_failure),
				group_weights = `+mergeWeightsSQL("k.group_weights", "$12")+`,
				updated_at = now(), updated_by = $6
			RETURNING paused, concurrency, rate_count, rate_period_ms, concurrency_per_group, rate_per_group_count, rate_per_group_period_ms,
				(SELECT count(*) FROM jsonb_object_keys(k.group_weights))`,
			kind, u.Paused, u.Concurrency, rateCount, ratePeriod, actor, u.ConcurrencyPerGroup, groupCount, groupPeriod, u.GroupWindow, u.SequenceOnFailure,
			weights).Scan(
			&lim.Paused, &lim.Concurrency, &lim.Rate.Count, &periodMS, &lim.ConcurrencyPerGroup, &lim.RatePerGroup.Count, &groupMS, &weighted); err != nil {
			return err
		}
		if weighted > MaxWeightedGroups {
			return &FieldError{Field: "group_weights", Msg: fmt.Sprintf("group_weights: the kind would have %d groups with a weight, at most %d may (a weight of 1 removes one)",
				weighted, MaxWeightedGroups)}
		}
		lim.Rate.Per = time.Duration(periodMS) * time.Millisecond
		lim.RatePerGroup.Per = time.Duration(groupMS) * time.Millisecond
		if err := tx.QueryRow(ctx, `INSERT INTO ingest_kind_change (kind, actor, paused, concurrency, rate, concurrency_per_group, rate_per_group, group_window,
				sequence_on_failure, group_weights)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb) RETURNING id`,
			kind, actor, u.Paused, u.Concurrency, rateText, u.ConcurrencyPerGroup, groupText, u.GroupWindow, u.SequenceOnFailure, weights).Scan(&changeID); err != nil {
			return err
		}
		if err := releaseOnContinue(ctx, tx, kind, u.SequenceOnFailure); err != nil {
			return err
		}
		if u.ConcurrencyPerGroup != nil && *u.ConcurrencyPerGroup > 0 {
			if _, err := tx.Exec(ctx, seedGroupSlotsSQL, kind); err != nil {
				return err
			}
		}
		if u.Concurrency != nil && *u.Concurrency > 0 {
			// The kind's tasks running now hold slots, so that a limit
			// set under load counts them.
			_, err := tx.Exec(ctx, `INSERT INTO ingest_kind_slot (kind, task_id)
				SELECT kind, id FROM `+liveTasks("t")+` WHERE kind = $1 AND status = 'RUNNING' AND lease_until > now()
				ON CONFLICT DO NOTHING`, kind)
			return err
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("change kind %q: %w", kind, err)
	}
	if lim.Paused {
		return 0, nil
	}
	// Not paused: release what may start. The change is committed, so a
	// worker parks no task of the kind from now on unless a limit holds
	// it, and then the releaser wakes it.
	for {
		ids, err := s.ReleaseParked(ctx, kind, 0, 0)
		released += len(ids)
		if err != nil {
			return released, fmt.Errorf("change kind %q (%d parked tasks released so far): %w", kind, released, err)
		}
		if len(ids) < unparkBatch || lim.Limited() {
			break
		}
	}
	if released > 0 {
		if _, err := s.db.Exec(ctx, `UPDATE ingest_kind_change SET released = $2 WHERE id = $1`, changeID, released); err != nil {
			return released, fmt.Errorf("change kind %q: record %d released tasks: %w", kind, released, err)
		}
	}
	return released, nil
}

// mergeWeightsSQL is the group weights old (an SQL expression) with the
// weights of change (a jsonb parameter; NULL: none) set over them, the
// groups of weight 1 (the default) left out.
func mergeWeightsSQL(old, change string) string {
	return `CASE WHEN ` + change + `::jsonb IS NULL THEN ` + old + ` ELSE (
		SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each(` + old + ` || ` + change + `::jsonb) AS e
		WHERE e.value <> '1'::jsonb) END`
}

// reserveGrace is how long a slot reserved for a task that has not
// started counts as taken: a reservation is followed by the start within
// milliseconds, or given back; a process that crashed in between holds
// the slot this long.
const reserveGrace = 10 * time.Second

// takenSQL is true for a slot row s that is taken: its task RUNNING under
// a live lease, or reserved within reserveGrace and not started since
// (waiting, or RUNNING under a lease that ended before the reservation: a
// takeover not yet made).
var takenSQL = `EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = s.task_id AND (
        (t.status = 'RUNNING' AND t.lease_until > now())
        OR (s.reserved_at > now() - ` + strconv.FormatInt(reserveGrace.Milliseconds(), 10) + ` * interval '1 millisecond'
            AND (t.status IN ('QUEUED', 'RETRYING') OR (t.status = 'RUNNING' AND t.lease_until <= s.reserved_at)))))`

// rateFreshSQL is true when the transaction's time is no more than the
// margin $3 (ms) older than the newest element of the rate log whose
// times are the array expression log: the log still holds every element
// of the transaction's window, so its count is exact.
func rateFreshSQL(log string) string {
	return `now() >= coalesce((SELECT max(x) FROM unnest(` + log + `) AS x), '-infinity'::timestamptz) - $3 * interval '1 millisecond'`
}

// freeSQL computes, inside a statement that has CTE k (the kind's row)
// and CTE tight (whether the raw count of its slot rows leaves too little
// room), how many more tasks of kind $1 may start now: the free slots and
// the starts left in the rate window, each only when limited (2^31-1 when
// neither is; 0 when paused, and 0 for a rate-limited kind unless the SQL
// expression rateOK is true). While the raw count of slot rows, stale ones
// included, leaves room, the slots' tasks need not be looked at.
func freeSQL(rateOK string) string {
	return `
    SELECT CASE WHEN k.paused OR (k.rate_count > 0 AND NOT ` + rateOK + `) THEN 0 ELSE least(
        CASE WHEN k.concurrency > 0 AND NOT tight.b THEN k.concurrency - tight.raw
             WHEN k.concurrency > 0 THEN greatest(k.concurrency - (SELECT count(*) FROM ingest_kind_slot s WHERE s.kind = $1 AND ` + takenSQL + `), 0) END,
        CASE WHEN k.rate_count > 0 THEN greatest(k.rate_count - (SELECT coalesce(sum(x.n), 0) FROM unnest(k.rate_log, k.rate_log_n) AS x(at, n)
                                                                 WHERE x.at > now() - k.rate_period_ms * interval '1 millisecond'), 0) END,
        2147483647) END AS n
    FROM k, tight`
}

// tightSQL is the CTE tight of freeSQL for $want tasks: raw, the kind's
// slot rows, and b, whether raw + want exceeds its concurrency limit.
func tightSQL(want string) string {
	return `SELECT n AS raw, k.concurrency > 0 AND n + ` + want + ` > k.concurrency AS b
    FROM k, (SELECT count(*) AS n FROM ingest_kind_slot WHERE kind = $1) AS c`
}

// lockReleaseSQL locks kind $1's row for a release of its parked tasks
// (FOR NO KEY UPDATE): the kind's releases are serialized by it, and so
// are they with the starts of a kind with limits of its own
// (lockStartKindSQL's FOR UPDATE), not with those of a kind whose only
// limits are per group (lockStartGroupsSQL's FOR KEY SHARE). It is a
// statement of its own so that the statements after it, each with a
// snapshot taken once it holds the lock, see what the previous holder
// committed.
const lockReleaseSQL = `SELECT 1 FROM ingest_kind WHERE kind = $1 FOR NO KEY UPDATE`

// perGroupOnlySQL holds for a kind row k whose only limits are per group:
// not paused, no concurrency or rate of its own, and a per-group
// concurrency or rate.
const perGroupOnlySQL = `(NOT (k.paused OR k.concurrency > 0 OR k.rate_count > 0) AND (k.concurrency_per_group > 0 OR k.rate_per_group_count > 0))`

// startLockSetting names the transaction's setting in which the locks of a
// reservation say what they hold: 'kind' (the kind's row), 'groups' (the
// start locks of the batch's groups) or empty (neither).
const startLockSetting = `ingest.start_lock`

// The starts of a kind whose only limits are per group are serialized by
// group, not by kind, so that the starts of different groups do not wait
// for each other: lockStartKindSQL locks the kind's row (FOR UPDATE)
// unless its limits are per group only (and says so in startLockSetting,
// after the lock is held), and lockStartGroupsSQL, when it did not, takes
// the start lock of each group of the batch's tasks of kind $1 among $2
// (an advisory lock per (kind, group), in order; not the create's lock of
// the group, which a caller's transaction may hold for long), after a
// FOR KEY SHARE lock of the kind's row, which other such starts and the
// kind's releases (FOR NO KEY UPDATE) do not wait for, but a start or
// release that locks the row FOR UPDATE does: an earlier version's
// worker, still running during an upgrade, serialized every start of the
// kind by that lock alone. reserveSQL then reserves only under the locks
// that the kind's limits, as it reads them, need: a change of the limits
// between the statements leaves the batch parked, for a release.
var (
	lockStartKindSQL = `
WITH l AS (SELECT k.kind FROM ingest_kind k WHERE k.kind = $1 AND NOT ` + perGroupOnlySQL + ` FOR UPDATE)
SELECT set_config('` + startLockSetting + `', CASE WHEN EXISTS (SELECT 1 FROM l) THEN 'kind' ELSE '' END, true)`
	lockStartGroupsSQL = `
WITH k AS (
    SELECT k.kind FROM ingest_kind k
    WHERE k.kind = $1 AND current_setting('` + startLockSetting + `', true) = '' AND ` + perGroupOnlySQL + `
    FOR KEY SHARE
), g AS (
    SELECT DISTINCT coalesce(t.group_key, '') AS g FROM ingest_task t
    WHERE t.id = ANY($2::uuid[]) AND t.kind = $1 AND EXISTS (SELECT 1 FROM k)
    ORDER BY 1
), l AS (
    SELECT count(pg_advisory_xact_lock(hashtextextended('ingest-start/' || $1 || '/' || g.g, 0))) AS n FROM g
)
SELECT set_config('` + startLockSetting + `', 'groups', true) FROM l WHERE l.n > 0`
	// startLockHeldSQL holds, inside reserveSQL (CTE k), when the locks
	// taken are those the kind's limits need.
	startLockHeldSQL = `(current_setting('` + startLockSetting + `', true) = 'kind'
        OR (current_setting('` + startLockSetting + `', true) = 'groups' AND ` + perGroupOnlySQL + `))`
)

// reserveSQL reserves starts for tasks of kind $1 among $2 (in order),
// as many as the kind's limits let start now, after lockStartKindSQL and
// lockStartGroupsSQL in the same transaction (none when the locks they
// took are not those the limits need): it deletes the kind's stale slot
// rows when it had to look at them (skipping those another transaction
// holds: a FreeSlots of the same rows deletes them in an order of its own,
// and waiting for it could close a deadlock that stalls the kind's or
// group's starts for PostgreSQL's deadlock_timeout), takes a slot row for each chosen
// task when the kind has a concurrency limit, and
// adds the chosen ones to the rate log (one element: the transaction's
// time and their number, dropping elements older than the period and the
// margin $3) when it has a rate limit. It returns whether the kind has
// settings, whether it is paused or limited, whether it has a rate limit,
// the chosen ids, which of them got a new slot row, and the ids of other
// kinds (started without limit). A rate-limited kind gets no start unless
// $4 is true (the caller starts the tasks inside the locked transaction)
// and the transaction is fresh enough for its log (rateFreshSQL).
var reserveSQL = `
WITH k AS (
    SELECT kind, paused, concurrency, rate_count, rate_period_ms, rate_log, rate_log_n,
           concurrency_per_group, rate_per_group_count, rate_per_group_period_ms FROM ingest_kind WHERE kind = $1
), ids AS (
    SELECT x.id, x.ord, t.kind = $1 AS mine, coalesce(t.group_key, '') AS g FROM unnest($2::uuid[]) WITH ORDINALITY AS x(id, ord) JOIN ingest_task t ON t.id = x.id
), tight AS (` + tightSQL("(SELECT count(*) FROM ids WHERE mine)") + `
), free AS (
    SELECT CASE WHEN ` + startLockHeldSQL + ` THEN f.n ELSE 0 END AS n
    FROM k, (` + freeSQL("($4 AND "+rateFreshSQL("k.rate_log")+")") + `) AS f
), ` + groupChoiceSQL + `
), stale AS (
    DELETE FROM ingest_kind_slot d USING (
        SELECT s.task_id FROM ingest_kind_slot s WHERE s.kind = $1 AND (SELECT b FROM tight) AND NOT ` + takenSQL + `
        FOR UPDATE OF s SKIP LOCKED) x
    WHERE d.kind = $1 AND d.task_id = x.task_id
), slots AS (
    INSERT INTO ingest_kind_slot (kind, task_id, reserved_at)
    SELECT $1, id, now() FROM chosen WHERE EXISTS (SELECT 1 FROM k WHERE k.concurrency > 0)
    ON CONFLICT (kind, task_id) DO UPDATE SET reserved_at = now()
    RETURNING task_id, xmax = 0 AS inserted
), logged AS (
    UPDATE ingest_kind k2 SET (rate_log, rate_log_n) = (
        SELECT coalesce(array_agg(at ORDER BY at), '{}'), coalesce(array_agg(n ORDER BY at), '{}') FROM (
            SELECT at, n FROM unnest(k2.rate_log, k2.rate_log_n) AS x(at, n)
            WHERE at > now() - (k2.rate_period_ms + $3) * interval '1 millisecond'
            UNION ALL SELECT now(), (SELECT count(*) FROM chosen)::int) AS y)
    WHERE k2.kind = $1 AND k2.rate_count > 0 AND EXISTS (SELECT 1 FROM chosen)
), ` + groupReserveSQL + `
)
SELECT EXISTS (SELECT 1 FROM k),
       coalesce((SELECT paused OR concurrency > 0 OR rate_count > 0 OR concurrency_per_group > 0 OR rate_per_group_count > 0 FROM k), false),
       coalesce((SELECT rate_count > 0 OR rate_per_group_count > 0 FROM k), false),
       ARRAY(SELECT id FROM chosen),
       ARRAY(SELECT task_id FROM slots WHERE inserted UNION SELECT task_id FROM gslots WHERE inserted),
       ARRAY(SELECT id FROM ids WHERE NOT mine ORDER BY ord)`

// reserveBatch is StartLimited's reservation of ids of kind, in one
// batch: settings (pgplan's), the locks (lockStartKindSQL,
// lockStartGroupsSQL) and reserveSQL, whose row scan reads; inTx is
// reserveSQL's $4 (the caller starts the chosen tasks in the same
// transaction).
func reserveBatch(settings, kind string, ids []uuid.UUID, inTx bool, scan func(pgx.Row) error) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(settings)
	b.Queue(lockStartKindSQL, kind)
	b.Queue(lockStartGroupsSQL, kind, ids)
	b.Queue(reserveSQL, kind, ids, rateLogMargin.Milliseconds(), inTx).QueryRow(scan)
	return b
}

// parkDueSQL parks those of $1 that are due QUEUED or RETRYING tasks.
var parkDueSQL = `
WITH l AS (
    SELECT t.id FROM unnest($1::uuid[]) AS x(id) JOIN ingest_task t ON t.id = x.id
    ORDER BY t.id FOR NO KEY UPDATE OF t
)
UPDATE ingest_task t SET parked_at = now(), updated_at = now()
FROM l WHERE t.id = l.id
  AND CASE WHEN t.status IN ` + waitingSQL + ` AND ` + due("t") + ` THEN true ELSE false END
RETURNING t.id`

// StartLimited starts the tasks of ids, all of kind kind as their stream
// entries say, within the kind's limits. It returns one result per
// distinct id, in the order given:
//   - as many as the kind's free slots and starts allow are started as
//     Start starts them (tasks of another kind than their entry says are
//     started without limit);
//   - the due waiting ones beyond that are parked: ParkedAtLimit (their
//     entries can be acknowledged: a worker that frees a slot, or the
//     leader's releaser, wakes them);
//   - the others get the outcome Start would give them, or Throttled
//     when they would have been taken over (RUNNING under an expired
//     lease) and no slot is free: try them again later.
//
// The starts are reserved first, under the kind's row lock, or, for a
// kind whose only limits are per group, under the start locks of the
// batch's groups (lockStartKindSQL, lockStartGroupsSQL and reserveSQL,
// sent together). A kind with only a concurrency limit
// reserves in one implicit transaction (one round trip) and starts its
// tasks after, without the lock: a reserved slot is taken before its task
// starts, and one whose task did not start is given back. A kind with a
// rate limit starts them in an explicit transaction that holds the lock,
// so that the rate log holds the starts' own times (the store remembers
// which kinds have one, to go there at once).
func (s *Store) StartLimited(ctx context.Context, owner string, lease time.Duration, kind string, ids ...uuid.UUID) ([]StartResult, error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	var (
		found, limited, rated   bool
		chosen, newSlots, other []uuid.UUID
		byID                    = make(map[uuid.UUID]StartResult, len(ids))
	)
	reserve := func(q DB, inTx bool) error {
		settings := pgplan.Settings
		if !inTx && s.ownsCommits() {
			// Alone in its implicit transaction, the reservation commits
			// without waiting for the WAL flush, so that the kind's lock
			// is not held through one: what it writes (slot rows, stale
			// ones deleted) matters only to the starts that follow it,
			// and each of those, flushed, flushes it too. A crash of
			// PostgreSQL that loses it loses no start.
			settings = pgplan.SettingsUnflushed
		}
		return q.SendBatch(ctx, reserveBatch(settings, kind, ids, inTx, func(row pgx.Row) error {
			return row.Scan(&found, &limited, &rated, &chosen, &newSlots, &other)
		})).Close()
	}
	// A kind with only a concurrency limit: the lock and the reservation
	// in one implicit transaction, one round trip; the tasks start after
	// it, without the lock.
	_, knownRated := s.rated.Load(kind)
	if !knownRated {
		if err := s.retry(ctx, func() error { return reserve(s.db, false) }); err != nil {
			return nil, fmt.Errorf("reserve starts of limited kind %q: %w", kind, err)
		}
	}
	if knownRated || (found && rated) {
		// A kind with a rate limit: its tasks start in the locked
		// transaction, so that the rate log holds their starts' times.
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			clear(byID)
			if err := reserve(tx, true); err != nil {
				return err
			}
			if !found || !limited || !rated {
				return nil
			}
			if toStart := append(other, chosen...); len(toStart) > 0 {
				if err := s.startInto(ctx, tx, true, owner, lease, toStart, byID); err != nil {
					return err
				}
			}
			return s.parkRest(ctx, tx, ids, byID)
		})
		if err != nil {
			return nil, fmt.Errorf("start %d tasks of rate-limited kind %q: %w", len(ids), kind, err)
		}
		if found && rated {
			s.rated.Store(kind, true)
			if limited {
				return orderResults(ids, byID), nil
			}
		} else {
			s.rated.Delete(kind)
		}
	}
	if !found || !limited {
		// The limits were removed meanwhile.
		return s.Start(ctx, owner, lease, ids...)
	}
	if toStart := append(other, chosen...); len(toStart) > 0 {
		res, err := s.Start(ctx, owner, lease, toStart...)
		if err != nil {
			s.giveBack(kind, newSlots)
			return nil, err
		}
		started := map[uuid.UUID]bool{}
		for _, r := range res {
			byID[r.ID] = r
			started[r.ID] = r.Outcome == Started || r.Outcome == TakenOver
		}
		var unused []uuid.UUID
		for _, id := range newSlots {
			if !started[id] {
				unused = append(unused, id)
			}
		}
		s.giveBack(kind, unused)
	}
	if err := s.parkRest(ctx, s.db, ids, byID); err != nil {
		return nil, fmt.Errorf("park tasks of limited kind %q: %w", kind, err)
	}
	return orderResults(ids, byID), nil
}

// parkRest parks those of ids without a result in byID that are due and
// waiting (ParkedAtLimit) and records what Start would answer for the
// others (notStartedInto).
func (s *Store) parkRest(ctx context.Context, q DB, ids []uuid.UUID, byID map[uuid.UUID]StartResult) error {
	var rest []uuid.UUID
	for _, id := range ids {
		if _, ok := byID[id]; !ok {
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	rows, err := pgplan.Query(ctx, q, parkDueSQL, rest)
	if err != nil {
		return err
	}
	parked, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	for _, id := range parked {
		byID[id] = StartResult{ID: id, Outcome: ParkedAtLimit}
	}
	var unparked []uuid.UUID
	for _, id := range rest {
		if _, ok := byID[id]; !ok {
			unparked = append(unparked, id)
		}
	}
	return s.notStartedInto(ctx, q, unparked, byID)
}

// giveBack deletes the slot rows reserved for ids after their start
// failed (best effort: else they are found stale after reserveGrace).
func (s *Store) giveBack(kind string, ids []uuid.UUID) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = s.db.Exec(ctx, freeSlotsSQL, kind, ids)
}

// orderResults returns the results of ids in order, NotFound for an id
// without one.
func orderResults(ids []uuid.UUID, byID map[uuid.UUID]StartResult) []StartResult {
	out := make([]StartResult, len(ids))
	for i, id := range ids {
		r, ok := byID[id]
		if !ok {
			r = StartResult{ID: id, Outcome: NotFound}
		}
		out[i] = r
	}
	return out
}

// notStartedSQL reads the tasks of $1 that a limit kept from starting.
var notStartedSQL = `SELECT ` + taskColumnsNoPayload + `, lease_until <= now() FROM ingest_task WHERE id = ANY($1)`

// notStartedInto records in byID what Start would answer for ids, which
// a limit kept from starting and which could not be parked, without
// starting them: a takeover that is due is Throttled (not parked).
func (s *Store) notStartedInto(ctx context.Context, q DB, ids []uuid.UUID, byID map[uuid.UUID]StartResult) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := pgplan.Query(ctx, q, notStartedSQL, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	var expired *bool
	sc := newTaskScanner(&expired)
	for rows.Next() {
		t, err := sc.scan(rows)
		if err != nil {
			return err
		}
		r := StartResult{ID: t.ID, Task: &t, Outcome: Finished}
		switch {
		case t.Status == Queued || t.Status == Retrying:
			r.Outcome = waitingOutcome(&t)
		case t.Status == Running && expired != nil && *expired:
			r = StartResult{ID: t.ID, Outcome: Throttled}
		case t.Status == Running:
			r.Outcome = LeaseHeld
		}
		byID[t.ID] = r
	}
	return rows.Err()
}

// FreeSlots gives back the slots of kind held by the tasks of ids, whose
// runs ended (the worker that recorded their outcome calls it), and
// releases as many parked tasks of the kind as it freed slots. A slot not
// given back (its worker crashed) is found stale by a later start of the
// kind once the kind nears its limit.
func (s *Store) FreeSlots(ctx context.Context, kind string, ids ...uuid.UUID) ([]uuid.UUID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	// Unflushed, as a reservation: a free lost in a crash of PostgreSQL
	// leaves slot rows that a later start finds stale.
	send := pgplan.Query
	if s.ownsCommits() {
		send = pgplan.QueryUnflushed
	}
	var freed int
	rows, err := send(ctx, s.db, freeSlotsSQL, kind, ids)
	if err == nil {
		freed, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int])
	}
	if err != nil {
		return nil, fmt.Errorf("free %d slots of kind %q: %w", len(ids), kind, err)
	}
	return s.ReleaseParked(ctx, kind, 0, max(freed, 1))
}

// anyParkedSQL tells whether kind $1 has a parked task (one probe of
// ingest_task_parked_idx).
var anyParkedSQL = `SELECT EXISTS (SELECT 1 FROM ingest_task WHERE kind = $1 AND ` + parkedSQL("ingest_task") + ` AND status IN ` + waitingSQL + `)`

// ReleaseParked wakes at most max (0: a thousand) parked tasks of kind, as
// many as its limits let start now less inTransit (tasks woken earlier
// that have not started yet): each is no longer parked (parked_at NULL)
// and gets a new outbox event, due at once. A kind that is paused releases nothing. It
// returns the tasks it released.
func (s *Store) ReleaseParked(ctx context.Context, kind string, inTransit, max int) ([]uuid.UUID, error) {
	// Most calls find nothing parked: they take no lock.
	var parked bool
	if err := s.db.QueryRow(ctx, anyParkedSQL, kind).Scan(&parked); err != nil {
		return nil, fmt.Errorf("release parked tasks of kind %q: %w", kind, err)
	}
	if !parked {
		return nil, nil
	}
	out := s.ownWriter()
	var ids []uuid.UUID
	var claim outbox.Claim
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		claim.Discard() // of an attempt that was rolled back
		claim, ids = outbox.Claim{}, nil
		var free int
		var grouped bool
		want := unparkBatch
		if max > 0 {
			want = min(want, max)
		}
		b := &pgx.Batch{}
		if s.ownsCommits() {
			// The release commits without waiting for the WAL flush, so
			// that the kind's lock, which its other releases (and, with
			// a limit of its own, its starts) wait for, is not held
			// through one. A release lost in a crash of PostgreSQL
			// leaves its tasks parked, for the leader's releaser; a
			// start of one of them, flushed, flushes it too.
			b.Queue(pgplan.Unflushed)
		}
		b.Queue(lockReleaseSQL, kind)
		b.Queue(`WITH k AS (
			SELECT kind, paused, concurrency, rate_count, rate_period_ms, rate_log, rate_log_n,
			       concurrency_per_group, rate_per_group_count FROM ingest_kind WHERE kind = $1
		), tight AS (`+tightSQL("$2::int")+`
		), free AS (`+freeSQL("true")+`)
		SELECT coalesce((SELECT n FROM free), 2147483647),
		       coalesce((SELECT concurrency_per_group > 0 OR rate_per_group_count > 0 FROM k), false)
		       OR EXISTS (SELECT 1 FROM ingest_task WHERE kind = $1 AND `+parkedSQL("ingest_task")+` AND group_key IS NOT NULL)`, kind, want).QueryRow(func(row pgx.Row) error {
			return row.Scan(&free, &grouped)
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		n := min(unparkBatch, free-inTransit)
		if max > 0 {
			n = min(n, max)
		}
		if n <= 0 {
			return nil
		}
		unpark := unparkSQL
		if grouped {
			// Round-robin across the groups with room.
			unpark = unparkGroupsSQL
		}
		args := []any{kind, n}
		if grouped {
			args = append(args, DefaultGroupWindow)
		}
		rows, err := tx.Query(ctx, unpark, args...)
		if err != nil {
			return err
		}
		var woken []outbox.Message
		m := outbox.Message{Stream: s.cfg.Stream, Kind: kind}
		if _, err := pgx.ForEachRow(rows, []any{&m.TaskID, &m.Traceparent, &m.Priority}, func() error {
			ids, woken = append(ids, m.TaskID), append(woken, m)
			return nil
		}); err != nil {
			return err
		}
		// Through the store's writer, as CreateBatch's tasks: with a
		// relay they are handed to it as soon as the transaction
		// commits, so that a freed slot is used at once. They existed
		// before, so the writer writes their rows here (Stage).
		claim, err = out.Stage(ctx, tx, woken)
		return err
	})
	if err != nil {
		claim.Discard()
		return nil, fmt.Errorf("release parked tasks of kind %q: %w", kind, err)
	}
	claim.Publish()
	return ids, nil
}

// LimitedKinds returns the kinds not paused that have a limit or tasks
// held back by their group's window: those whose parked tasks the
// releaser wakes as slots, starts and windows free (a resume, or
// the removal of a kind's last limit, releases all its parked tasks at
// once).
func (s *Store) LimitedKinds(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, limitedKindsSQL)
	if err != nil {
		return nil, fmt.Errorf("read limited kinds: %w", err)
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read limited kinds: %w", err)
	}
	return kinds, nil
}

// inTransitSQL counts the tasks of $1 waiting to start and not parked.
var inTransitSQL = `SELECT count(*) FROM ingest_task WHERE id = ANY($1) AND status IN ` + waitingSQL + `
    AND NOT ` + parkedSQL("ingest_task")

// InTransit counts those of ids that are waiting to start and not parked:
// released tasks on their way to a worker.
func (s *Store) InTransit(ctx context.Context, ids []uuid.UUID) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	rows, err := pgplan.Query(ctx, s.db, inTransitSQL, ids)
	var n int
	if err == nil {
		n, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int])
	}
	if err != nil {
		return 0, fmt.Errorf("count released tasks in transit: %w", err)
	}
	return n, nil
}

// parkedCountsSQL counts the parked tasks of each kind that has any.
var parkedCountsSQL = `SELECT kind, count(*) FROM ingest_task WHERE ` + parkedSQL("ingest_task") + ` AND status IN ` + waitingSQL + ` GROUP BY kind`

// ParkedCounts returns the number of parked tasks of each kind that has
// any (a count over ingest_task_parked_idx, taken by the leader every few
// seconds: pgplan.QueryCount keeps it there).
func (s *Store) ParkedCounts(ctx context.Context) (map[string]int64, error) {
	rows, err := pgplan.QueryCount(ctx, s.db, parkedCountsSQL)
	if err != nil {
		return nil, fmt.Errorf("count parked tasks: %w", err)
	}
	out := map[string]int64{}
	var kind string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &n}, func() error { out[kind] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("count parked tasks: %w", err)
	}
	return out, nil
}
