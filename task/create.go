package task

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/seal"
)

// NewTask describes a task to create.
type NewTask struct {
	// Kind selects the handler; required.
	Kind string
	// Payload is any JSON value; required. It stays in Postgres.
	Payload json.RawMessage
	// IdempotencyKey, when set, makes a repeat with the same Kind return the
	// existing task instead of creating a second one.
	IdempotencyKey string
	// MaxAttempts, when > 0, is the task's own limit of runs (at most
	// MaxAttemptsLimit: MaxAttemptsRange). When 0 the
	// task has none (max_attempts NULL) and the MaxAttempts of the store
	// that records a failed run decides (a worker's
	// INGEST_REDIS_MAX_ATTEMPTS), whichever process created it.
	MaxAttempts int
	// DedupByPayload returns the existing non-DEAD task of the same Kind with
	// the same canonical payload, itself created with DedupByPayload,
	// instead of creating a second one. (Only such tasks are indexed by
	// payload: the others cost no index entry for it.)
	DedupByPayload bool
	// Traceparent, when set, is the W3C traceparent of the task's parent
	// span. When empty the span in the context given to Create (through
	// the create span) is, if there is one.
	Traceparent string
	// RunAt delays the task: it is QUEUED with next_retry_at = RunAt, and
	// its outbox row is due then, so it is published to the stream (and
	// started) only once RunAt has come. A RunAt in the past means now;
	// one more than ScheduleHorizon ahead is refused. At most one of RunAt
	// and Delay may be set.
	RunAt time.Time
	// Delay delays the task by this long from its creation (the database's
	// clock), like RunAt; at most ScheduleHorizon (MaxDelay).
	Delay time.Duration
	// Timeout, when > 0, is the deadline of each run of the task's handler
	// (stored as timeout_ms; see the worker for the defaults that apply
	// otherwise). It is kept to the millisecond.
	Timeout time.Duration
	// SequenceKey, when set, puts the task in a sequence: the tasks of
	// one Kind with the same key run one at a time, in creation order
	// (see sequence.go); at most MaxSequenceKeyLength bytes.
	SequenceKey string
	// DependsOn lists existing tasks this one waits for: it is held
	// (QUEUED, never started) until each has ended, and runs with their
	// results (deps.go). At most MaxDependencies with DependsOnRefs.
	DependsOn []uuid.UUID
	// Ref names the task within one CreateBatch, for the DependsOnRefs of
	// its other items (at most MaxRefLength bytes, unique in the batch).
	Ref string
	// DependsOnRefs lists the Refs of other items of the same CreateBatch
	// this one waits for, so that a whole graph is created at once.
	DependsOnRefs []string
	// OnDependencyFailure is what a dependency ending DEAD or CANCELLED
	// does to this task: OnFailureCancel (the default, "") cancels it,
	// OnFailureRun runs it anyway.
	OnDependencyFailure string
	// Priority is 1 (the highest) to 4 (PriorityRange); 0 is the default,
	// 2. Among ready tasks, higher priorities start first, and lower ones
	// get a share of the reads (docs/FAIRNESS.md "Priorities"). The
	// default is stored as NULL.
	Priority int
	// GroupKey is the task's group: a tenant, a customer, a source (at most
	// MaxGroupKeyLength bytes, a name as CheckName has them). The kind's
	// per-group limits hold for each group; "" is no group, which counts
	// as one group of its own.
	GroupKey string
}

// CreateResult is the outcome of creating one task.
type CreateResult struct {
	Task Task
	// Existing is true when an idempotency key or the payload dedup matched
	// a task that already existed; nothing was created.
	Existing bool
}

// MaxKindLength is the longest task kind accepted.
const MaxKindLength = 200

// Create creates one task in its own transaction.
func (s *Store) Create(ctx context.Context, nt NewTask) (CreateResult, error) {
	res, err := s.CreateBatch(ctx, []NewTask{nt})
	if err != nil {
		return CreateResult{}, err
	}
	return res[0], nil
}

// CreateBatch creates many tasks in one transaction: all or none. With a
// writer to publish through (see PublishWith), the new tasks are handed to
// its relay as soon as the transaction commits.
func (s *Store) CreateBatch(ctx context.Context, nts []NewTask) ([]CreateResult, error) {
	out := s.ownWriter()
	var res []CreateResult
	var claim outbox.Claim
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		claim.Discard() // of an attempt that was rolled back
		var err error
		res, claim, err = s.createTx(ctx, tx, out, nts)
		return err
	})
	if err != nil {
		claim.Discard()
		return nil, err
	}
	claim.Publish()
	return res, nil
}

// ownWriter returns the outbox writer of a transaction the store begins
// itself: its own writer, or the zero one when s.db is a caller's
// transaction, whose commit is not the store's (nothing can be handed over
// on it; the rows go as CreateTx's do).
func (s *Store) ownWriter() outbox.Writer {
	if !s.ownsCommits() {
		return outbox.Writer{}
	}
	return s.out
}

// ownsCommits tells whether the transactions s begins are its own: false
// when s.db is a caller's transaction, whose commit (and its settings,
// such as synchronous_commit) is the caller's.
func (s *Store) ownsCommits() bool {
	_, nested := s.db.(pgx.Tx)
	return !nested
}

// CreateTx creates tasks inside the caller's transaction, so they commit
// (and are published) atomically with the caller's own writes, or not at
// all. Each task gets its QUEUED audit row and a NEW outbox event (the
// zero outbox.Writer's: the store does not own the commit).
func (s *Store) CreateTx(ctx context.Context, tx pgx.Tx, nts ...NewTask) ([]CreateResult, error) {
	res, _, err := s.createTx(ctx, tx, outbox.Writer{}, nts)
	return res, err
}

// createTx is CreateTx, staging the outbox rows of the tasks due now
// through out, and returns the claim to finish once tx has ended (zero on
// an error: the claim is taken last).
func (s *Store) createTx(ctx context.Context, tx pgx.Tx, out outbox.Writer, nts []NewTask) (res []CreateResult, claim outbox.Claim, err error) {
	if len(nts) == 0 {
		return nil, claim, nil
	}
	ctx, span := startCreateSpan(ctx, nts)
	defer func() { endCreateSpan(span, res, err) }()
	items, err := s.prepare(ctx, nts)
	if err != nil {
		return nil, claim, err
	}
	res = make([]CreateResult, len(items))
	done := make([]bool, len(items))

	if err := s.dedupByPayload(ctx, tx, items, res, done); err != nil {
		return nil, claim, err
	}

	var ins []int
	for i := range items {
		if !done[i] {
			ins = append(ins, i)
		}
	}
	heads, err := s.sequencePlaces(ctx, tx, items, ins)
	if err != nil {
		return nil, claim, err
	}
	// inserted holds the tasks this call inserted, in res.
	inserted := make(map[uuid.UUID]*Task, len(ins))
	windowed, err := s.holdBack(ctx, tx, items, ins, heads)
	if err != nil {
		return nil, claim, err
	}
	if len(ins) > 0 {
		cols := struct {
			ids              []uuid.UUID
			kinds, shas, key []string
			payloads, tps    []string
			max              []int32
			dedup            []bool
			keyed            bool
			runAt            []*time.Time
			delay, timeout   []int64
			seqKeys          []string
			seqNos           []int64
			priority         []int16
			groups           []string
			held             []bool
		}{}
		// Each column has room for the whole batch: appends never copy.
		n := len(ins)
		cols.ids, cols.max, cols.runAt = make([]uuid.UUID, 0, n), make([]int32, 0, n), make([]*time.Time, 0, n)
		cols.kinds, cols.shas, cols.key = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		cols.payloads, cols.tps, cols.seqKeys, cols.groups = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		cols.dedup, cols.held = make([]bool, 0, n), make([]bool, 0, n)
		cols.delay, cols.timeout, cols.seqNos = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
		cols.priority = make([]int16, 0, n)
		for j, i := range ins {
			it := &items[i]
			cols.ids = append(cols.ids, it.id)
			cols.kinds = append(cols.kinds, it.Kind)
			stored, err := s.cfg.Keyring.Seal(seal.Payload, it.id, it.canonical)
			if err != nil {
				return nil, claim, err
			}
			cols.payloads = append(cols.payloads, string(stored))
			cols.shas = append(cols.shas, it.sha)
			cols.key = append(cols.key, it.IdempotencyKey)
			cols.max = append(cols.max, int32(it.MaxAttempts))
			var runAt *time.Time
			if !it.RunAt.IsZero() {
				at := it.RunAt
				runAt = &at
			}
			cols.runAt = append(cols.runAt, runAt)
			cols.delay = append(cols.delay, it.Delay.Milliseconds())
			cols.timeout = append(cols.timeout, it.Timeout.Milliseconds())
			cols.tps = append(cols.tps, it.Traceparent)
			cols.dedup = append(cols.dedup, it.DedupByPayload)
			cols.seqKeys = append(cols.seqKeys, it.SequenceKey)
			cols.seqNos = append(cols.seqNos, it.seqNo)
			cols.priority = append(cols.priority, int16(it.Priority))
			cols.groups = append(cols.groups, it.GroupKey)
			cols.held = append(cols.held, windowed != nil && windowed[j])
			cols.keyed = cols.keyed || it.IdempotencyKey != ""
		}
		sql := insertPlainSQL
		if cols.keyed {
			sql = insertKeyedSQL
		}
		rows, err := tx.Query(ctx, sql, cols.ids, cols.kinds, cols.payloads, cols.shas, cols.key, cols.max,
			cols.runAt, cols.delay, cols.timeout, cols.tps, cols.dedup, cols.seqKeys, cols.seqNos, cols.priority, cols.groups, cols.held)
		if err != nil {
			return nil, claim, fmt.Errorf("insert tasks: %w", err)
		}
		if err := readInserted(rows, items, ins, res, inserted); err != nil {
			return nil, claim, fmt.Errorf("insert tasks: %w", err)
		}
	}
	held, err := linkSequences(ctx, tx, items, ins, heads, inserted)
	if err != nil {
		return nil, claim, err
	}

	// Rows not inserted lost to an idempotency key: a task that existed
	// before, or an earlier item of this batch. The inserted ones have
	// their audit rows (insertTasksSQL).
	var delayedIDs, heldIDs []uuid.UUID
	var due []*time.Time
	var dueNow []outbox.Message
	var lostKinds, lostKeys []string
	var lost []int
	for _, i := range ins {
		it := items[i]
		if t, ok := inserted[it.id]; ok {
			if held[t.ID] || it.hasDependencies() {
				// Held by its sequence or until its dependencies end:
				// its outbox row is held back (its release replaces it).
				heldIDs = append(heldIDs, t.ID)
				continue
			}
			if t.NextRetryAt != nil {
				// Delayed: its outbox row is due when the task is, and
				// is never claimed for direct publishing.
				delayedIDs = append(delayedIDs, t.ID)
				due = append(due, t.NextRetryAt)
				continue
			}
			if t.ParkedAt != nil {
				// Held back by its group's window: a release publishes it.
				continue
			}
			dueNow = append(dueNow, outbox.Message{Stream: s.cfg.Stream, TaskID: t.ID, Kind: t.Kind, Traceparent: t.Traceparent, Priority: t.Priority,
				Grouped: t.GroupKey != "" || t.SequenceKey != ""})
			continue
		}
		lostKinds, lostKeys, lost = append(lostKinds, it.Kind), append(lostKeys, it.IdempotencyKey), append(lost, i)
	}
	if err := readLost(ctx, tx, lostKinds, lostKeys, lost, res); err != nil {
		return nil, claim, err
	}
	if err := outbox.InsertDue(ctx, tx, s.cfg.Stream, delayedIDs, due); err != nil {
		return nil, claim, err
	}
	if err := insertHeld(ctx, tx, s.cfg.Stream, heldIDs); err != nil {
		return nil, claim, err
	}
	if claim, err = out.StageCreated(ctx, tx, dueNow); err != nil {
		return nil, claim, err
	}
	for i, it := range items {
		if it.sameAs >= 0 {
			res[i] = CreateResult{Task: res[it.sameAs].Task, Existing: true}
		}
		if res[i].Existing {
			s.openPayload(&res[i].Task)
		}
	}
	if err := linkDependencies(ctx, tx, items, res); err != nil {
		return nil, claim, err
	}
	return res, claim, nil
}

// insertTasksSQL inserts the tasks. A delayed task (run_at $7 in the
// future, or delay_ms $8 > 0, the latter from the database's clock) is due
// at that time, its next_retry_at and its due_at (when its life became due,
// which latency is measured from); any other is due now (both NULL). A timeout_ms
// $9 of 0 is stored as NULL (none of its own). dedup $11 marks a task
// created with DedupByPayload, the only ones ingest_task_dedup_idx holds.
// sequence_key $12 (empty for none) and sequence_no $13 place a task in its
// sequence (sequence.go).
// A priority $14 of 0 or 2 (the default) is stored as NULL. group_key $15
// (empty for none) is the task's group; held $16 creates it parked, held
// back by its group's window (holdBack in group.go). A task with an id
// below the pending low-water cutoff (ingest_task_pending_cutoff, read in
// the statement itself and outside its snapshot: migration 00025) is
// created lingering, so that the leader's raise of the low water, which
// waits for the inserts that began before it published that cutoff, finds
// every unfinished task below it.
//
// A batch with idempotency keys inserts ON CONFLICT DO NOTHING on the
// unique (kind, idempotency_key) index (insertKeyedSQL); one without
// cannot conflict there (a NULL key is not in that index) and inserts
// plainly, sparing Postgres the speculative insertion (a WAL record per
// row more).
const insertTasksSQL = `
INSERT INTO ingest_task (id, kind, payload, payload_sha, idempotency_key, max_attempts, next_retry_at, due_at, timeout_ms, traceparent, dedup,
    sequence_key, sequence_no, priority, group_key, parked_at, lingering)
SELECT id, kind, payload::jsonb, sha, NULLIF(key, ''), NULLIF(max_attempts, 0), d.due, d.due,
    NULLIF(timeout_ms, 0), NULLIF(traceparent, ''), dedup, NULLIF(seq_key, ''), NULLIF(seq_no, 0), NULLIF(NULLIF(priority, 0), 2),
    NULLIF(group_key, ''), CASE WHEN held THEN now() END,
    CASE WHEN id < (SELECT ingest_task_pending_cutoff()) THEN true END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::timestamptz[], $8::bigint[], $9::bigint[], $10::text[], $11::bool[],
            $12::text[], $13::bigint[], $14::smallint[], $15::text[], $16::bool[])
    WITH ORDINALITY AS n(id, kind, payload, sha, key, max_attempts, run_at, delay_ms, timeout_ms, traceparent, dedup, seq_key, seq_no, priority, group_key, held, ord)
    CROSS JOIN LATERAL (SELECT CASE WHEN run_at > now() THEN run_at
                                    WHEN delay_ms > 0 THEN now() + delay_ms * interval '1 millisecond' END AS due) d
ORDER BY ord`

// insertPlainSQL and insertKeyedSQL are insertTasksSQL returning the
// tasks inserted, which also writes each one's QUEUED audit row
// ("created") in the order of the inserts: a create costs one round trip
// less than with the audit rows in a statement of their own. A task that
// lost to an idempotency key gets none (it was not inserted).
const insertPlainSQL = `WITH ins AS (` + insertTasksSQL + `
RETURNING ` + taskColumnsNoPayload + `
), ` + createdAuditSQL

const insertKeyedSQL = `WITH ins AS (` + insertTasksSQL + `
ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ` + taskColumnsNoPayload + `
), ` + createdAuditSQL

// createdAuditSQL ends the task inserts: the audit rows of the tasks of
// ins, and the tasks.
const createdAuditSQL = `audit AS (
    INSERT INTO ingest_task_transition (task_id, to_status, attempt_count, message)
    SELECT id, '` + string(Queued) + `', 0, 'created' FROM ins
)
SELECT * FROM ins`

// readLost sets res[lost[i]] to the existing task of kind kinds[i] and
// idempotency key keys[i], whose insert lost to that key, reading them all
// in one statement.
func readLost(ctx context.Context, tx pgx.Tx, kinds, keys []string, lost []int, res []CreateResult) error {
	if len(lost) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, keyLookupSQL, kinds, keys)
	if err != nil {
		return fmt.Errorf("read tasks of %d idempotency keys: %w", len(lost), err)
	}
	found := make([]bool, len(lost))
	defer rows.Close()
	var ord int
	sc := newTaskScanner(&ord)
	for rows.Next() {
		t, err := sc.scan(rows)
		if err != nil {
			return fmt.Errorf("read tasks of %d idempotency keys: %w", len(lost), err)
		}
		res[lost[ord-1]] = CreateResult{Task: t, Existing: true}
		found[ord-1] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read tasks of %d idempotency keys: %w", len(lost), err)
	}
	for j, ok := range found {
		if !ok {
			return fmt.Errorf("read task of idempotency key %q (kind %s): %w", keys[j], kinds[j], pgx.ErrNoRows)
		}
	}
	return nil
}

// dedupByPayload resolves items with DedupByPayload against existing
// non-DEAD tasks (and earlier items of the batch). A transaction-scoped
// advisory lock per (kind, payload_sha) serialises concurrent creators.
func (s *Store) dedupByPayload(ctx context.Context, tx pgx.Tx, items []prepared, res []CreateResult, done []bool) error {
	var keys []string
	digests := make([][]string, len(items))
	for i, it := range items {
		if it.DedupByPayload {
			// Every form its payload_sha may have been written in (see
			// dedupDigests); each one's lock.
			digests[i] = s.dedupDigests(it)
			for _, d := range digests[i] {
				keys = append(keys, it.Kind+"/"+d)
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys) // a fixed lock order: no deadlocks between batches
	firstInBatch := map[string]int{}
	var kinds, shas []string
	var first []int
	for i, it := range items {
		if !it.DedupByPayload {
			continue
		}
		k := it.dedupKey()
		if j, ok := firstInBatch[k]; ok {
			// Resolved to the first one's task at the end of CreateTx.
			done[i] = true
			items[i].sameAs = j
			continue
		}
		firstInBatch[k] = i
		for _, d := range digests[i] {
			kinds, shas, first = append(kinds, it.Kind), append(shas, d), append(first, i)
		}
	}
	keys = slices.Compact(keys)
	// The locks, then one look-up of every key (under the locks: it takes
	// its snapshot after them), in one round trip.
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest($1::text[]) AS k ORDER BY k`, keys)
	b.Queue(dedupLookupSQL, kinds, shas).Query(func(rows pgx.Rows) error {
		var ord int
		sc := newTaskScanner(&ord)
		for rows.Next() {
			t, err := sc.scan(rows)
			if err != nil {
				return err
			}
			i := first[ord-1]
			if done[i] && !t.CreatedAt.Before(res[i].Task.CreatedAt) {
				continue // a younger match under another digest form
			}
			res[i] = CreateResult{Task: t, Existing: true}
			done[i] = true
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("look up payload dedup: %w", err)
	}
	return nil
}

// dedupLookupSQL returns, for each (kind $1[i], payload_sha $2[i]), the
// oldest non-DEAD task created with DedupByPayload of that kind and
// canonical payload, if any, with i (from 1). Each key is a probe of
// ingest_task_dedup_idx of its own (LATERAL ... LIMIT 1), whatever the
// table's statistics.
var dedupLookupSQL = `
SELECT t.*, k.ord FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(kind, sha, ord)
CROSS JOIN LATERAL (
    SELECT ` + taskColumns + ` FROM ingest_task t
    WHERE t.kind = k.kind AND t.payload_sha = k.sha AND t.dedup AND t.status <> 'DEAD'
    ORDER BY t.created_at LIMIT 1) t`

// keyLookupSQL returns the tasks of (kind $1[i], idempotency_key $2[i]),
// with i (from 1): those whose insert lost to their key. Each key is a
// probe of ingest_task_idempotency_key_idx of its own (LATERAL ...
// OFFSET 0), whatever the table's statistics.
var keyLookupSQL = `
SELECT t.*, k.ord FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(kind, key, ord)
CROSS JOIN LATERAL (
    SELECT ` + taskColumns + ` FROM ingest_task t
    WHERE t.kind = k.kind AND t.idempotency_key = k.key OFFSET 0) t`

// prepared is a validated NewTask with its id and canonical payload.
type prepared struct {
	NewTask
	id        uuid.UUID
	canonical []byte
	sha       string
	sameAs    int   // index of an earlier item of the batch with the same dedup key, or -1
	seqNo     int64 // place in its sequence (sequencePlaces); 0: none
}

// dedupKey names the payload dedup lock of the item. It goes to Postgres as
// text, so it must not contain NUL; the sha, a fixed-length hex suffix, keeps
// it unambiguous whatever the kind contains.
func (p prepared) dedupKey() string { return p.Kind + "/" + p.sha }

// readInserted reads the rows of a create's insert into res, at the
// index of their item, and notes each one in inserted. Their payload is
// the item's plaintext, not the stored form (the insert does not read it
// back).
func readInserted(rows pgx.Rows, items []prepared, ins []int, res []CreateResult, inserted map[uuid.UUID]*Task) error {
	defer rows.Close()
	at := make(map[uuid.UUID]int, len(ins))
	for _, i := range ins {
		at[items[i].id] = i
	}
	sc := newTaskScanner()
	for rows.Next() {
		t, err := sc.scan(rows)
		if err != nil {
			return err
		}
		i, ok := at[t.ID]
		if !ok {
			return fmt.Errorf("the insert returned task %s, which it was not given", t.ID)
		}
		t.Payload = items[i].canonical
		res[i] = CreateResult{Task: t}
		inserted[t.ID] = &res[i].Task
	}
	return rows.Err()
}

func (s *Store) prepare(ctx context.Context, nts []NewTask) ([]prepared, error) {
	traceparent := tracing.Inject(ctx)
	items := make([]prepared, len(nts))
	for i, nt := range nts {
		where := ""
		if len(nts) > 1 {
			where = fmt.Sprintf("task %d: ", i)
		}
		nt.Kind = strings.TrimSpace(nt.Kind)
		canonical, ferr := nt.check(s.cfg.MaxPayloadBytes)
		if ferr != nil {
			ferr.Msg = where + ferr.Msg
			return nil, ferr
		}
		if nt.Traceparent == "" {
			nt.Traceparent = traceparent
		}
		if ferr := nt.checkDependencies(); ferr != nil {
			ferr.Msg = where + ferr.Msg
			return nil, ferr
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		items[i] = prepared{NewTask: nt, id: id, canonical: canonical, sha: s.cfg.Keyring.Digest(canonical), sameAs: -1}
	}
	if ferr := checkRefs(items); ferr != nil {
		return nil, ferr
	}
	return items, nil
}

// ScheduleHorizon is how far ahead a task may be scheduled: a RunAt at
// most this long after now, a Delay at most this long. Ten years (3,653
// days: ten of 365 and the leap days they can hold) take any schedule a
// task queue serves, yearly ones included; a task held longer outlives
// the handler and payload format it was written for, and belongs in the
// application's own data until it nears. The bound refuses a mistyped
// year (2206 for 2026) instead of keeping a task for centuries, and keeps
// every due time the product shows and computes within a few digits.
const ScheduleHorizon = 3653 * 24 * time.Hour

// MaxDelay is the longest Delay accepted: the scheduling horizon; see
// DelayRange.
const MaxDelay = ScheduleHorizon

// MaxTimeout is the longest Timeout accepted: timeout_ms is an int column;
// see TimeoutRange.
const MaxTimeout = time.Duration(math.MaxInt32) * time.Millisecond

// MaxIdempotencyKeyLength is the longest idempotency key accepted.
const MaxIdempotencyKeyLength = 1000

// FieldError is the bad field of a new task, or of another request to the
// store (a RedriveFilter, ListParams, a kind's settings, a cancel).
type FieldError struct {
	// Field is kind, payload, idempotency_key, max_attempts, run_at,
	// delay_ms, timeout_ms, traceparent, sequence_key or group_key (for a RedriveFilter: status,
	// limit, since, kind or error_contains; ListParams: status, limit,
	// kind or cursor; a Range's field; a cancel's reason).
	Field string
	Msg   string
	// TooLarge is set when the payload is over the size limit.
	TooLarge bool
}

func (e *FieldError) Error() string { return e.Msg }

// Unwrap returns ErrPayloadTooLarge or ErrInvalidTask.
func (e *FieldError) Unwrap() error {
	if e.TooLarge {
		return ErrPayloadTooLarge
	}
	return ErrInvalidTask
}

// Validate checks a new task as Create would, with payloads limited to
// maxPayloadBytes, and names the first bad field. Kind is checked with
// surrounding white space trimmed, as Create stores it.
func (nt NewTask) Validate(maxPayloadBytes int) *FieldError {
	nt.Kind = strings.TrimSpace(nt.Kind)
	_, ferr := nt.check(maxPayloadBytes)
	return ferr
}

// check validates nt (its kind already trimmed) and returns its canonical
// payload.
func (nt NewTask) check(maxPayloadBytes int) ([]byte, *FieldError) {
	bad := func(field, format string, args ...any) ([]byte, *FieldError) {
		return nil, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if nt.Kind == "" {
		return bad("kind", "kind is required")
	}
	if ferr := CheckName("kind", nt.Kind, MaxKindLength); ferr != nil {
		return nil, ferr
	}
	if ferr := CheckName("idempotency_key", nt.IdempotencyKey, MaxIdempotencyKeyLength); ferr != nil {
		return nil, ferr
	}
	if ferr := CheckName("sequence_key", nt.SequenceKey, MaxSequenceKeyLength); ferr != nil {
		return nil, ferr
	}
	if ferr := CheckGroupKey(nt.GroupKey); ferr != nil {
		return nil, ferr
	}
	if nt.MaxAttempts != 0 { // 0: none of its own (max_attempts NULL)
		if ferr := MaxAttemptsRange.Check(int64(nt.MaxAttempts)); ferr != nil {
			return nil, ferr
		}
	}
	if ferr := DelayRange.checkMillis(nt.Delay); ferr != nil {
		return nil, ferr
	}
	if ferr := TimeoutRange.checkMillis(nt.Timeout); ferr != nil {
		return nil, ferr
	}
	if nt.Priority != 0 { // 0: the default
		if ferr := PriorityRange.Check(int64(nt.Priority)); ferr != nil {
			return nil, ferr
		}
	}
	switch {
	case nt.Traceparent != "" && !tracing.Valid(nt.Traceparent):
		return bad("traceparent", "traceparent %q is not a valid W3C traceparent", clip.String(nt.Traceparent, 64))
	case nt.Delay > 0 && !nt.RunAt.IsZero():
		return bad("run_at", "run_at and delay_ms are exclusive: set at most one")
	case !nt.RunAt.IsZero() && nt.RunAt.Year() < 1:
		return bad("run_at", "run_at %s is out of range (year 1 or later)", nt.RunAt.Format(time.RFC3339))
	case nt.RunAt.After(time.Now().Add(ScheduleHorizon)):
		return bad("run_at", "run_at %s is beyond the scheduling horizon: at most %d days (about %d years) from now",
			nt.RunAt.Format(time.RFC3339), ScheduleHorizon/(24*time.Hour), ScheduleHorizon/(365*24*time.Hour))
	case nt.Timeout > 0 && nt.Timeout < time.Millisecond:
		return bad("timeout_ms", "timeout_ms must be at least 1 ms (0: the default), got %s", nt.Timeout)
	case len(nt.Payload) > maxPayloadBytes:
		return nil, &FieldError{Field: "payload", TooLarge: true,
			Msg: fmt.Sprintf("payload is %d bytes, the limit is %d", len(nt.Payload), maxPayloadBytes)}
	}
	canonical, err := Canonical(nt.Payload)
	if err != nil {
		return bad("payload", "payload: %v", err)
	}
	if reservedMember(canonical) {
		return bad("payload", "payload: a top-level %q member is reserved for encrypted payloads", "$enc")
	}
	return canonical, nil
}
