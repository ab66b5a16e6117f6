package task

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// Strict order per key (migration 00020). The tasks of one kind created
// with the same NewTask.SequenceKey run one at a time, in creation order,
// across all processes: a new task with a key gets one edge with reason
// 'sequence' (ingest_task_dependency) to the previous task of its (kind,
// sequence_key) that has not yet released its successors (one not ended,
// or DEAD under the kind's SequenceBlock), and is held (waiting_for > 0, no
// outbox row) until that edge is released. The release itself is the
// dependency mechanism's, in the transaction of the predecessor's end:
// SUCCEEDED, CANCELLED and deleted release; DEAD releases only under the
// kind's SequenceContinue. A redriven DEAD task that then succeeds
// releases its successor.
//
// Creation is serialised per (kind, sequence_key) by a transaction-scoped
// advisory lock, so the look-up of the previous task and the new task's
// place (sequence_no, its predecessor's plus one) see every earlier
// creation of the key committed, whichever process made it. The
// predecessor's row is share-locked until the creation commits, so its
// end (and the release with it) cannot slip in between the look-up and
// the commit of the edge: it waits, then sees the edge.

// What a DEAD task does to its sequence: the values of a kind's
// sequence_on_failure (KindUpdate.SequenceOnFailure).
const (
	// SequenceBlock (the default): the successors wait until the DEAD task
	// is redriven and succeeds, or is cancelled or deleted.
	SequenceBlock = "block"
	// SequenceContinue: a DEAD task releases its successor like a success.
	SequenceContinue = "continue"
)

// MaxSequenceKeyLength is the longest sequence key accepted, in bytes.
const MaxSequenceKeyLength = 1000

// checkSequenceOnFailure validates a kind's sequence_on_failure (nil: not
// changed).
func checkSequenceOnFailure(v *string) error {
	if v == nil || *v == SequenceBlock || *v == SequenceContinue {
		return nil
	}
	return &FieldError{Field: "sequence_on_failure",
		Msg: fmt.Sprintf("sequence_on_failure must be %q or %q, got %q", SequenceBlock, SequenceContinue, *v)}
}

// seqKey is one (kind, sequence_key).
type seqKey struct{ kind, key string }

// lockName names the advisory lock of a sequence. It goes to Postgres as
// text (no NUL: CheckName refuses it in both); the length prefix of the
// kind keeps it unambiguous.
func (k seqKey) lockName() string { return fmt.Sprintf("seq/%d/%s/%s", len(k.kind), k.kind, k.key) }

// seqHead is what the look-up found of one sequence before this
// creation: the last place given, and the task the first new one follows
// (uuid.Nil: none holds it).
type seqHead struct {
	lastNo int64
	pred   uuid.UUID
}

// queueLocksBeforeSequences queues on b, ahead of a batch's sequence
// locks, the locks that a create would otherwise take after them and
// the SQL create (migrations 00020, 00031) takes before them: its groups'
// advisory locks (groupLockSQL: every group of a task due now, a superset
// of what holdBack counts) and the row locks of its existing
// dependencies (lockDependenciesSQL), so that both creates take their
// locks in one order (the payload dedup's, the groups', the
// dependencies', the sequences') and cannot deadlock each other. The
// later takers find them held.
func queueLocksBeforeSequences(b *pgx.Batch, items []prepared, ins []int) {
	seen := map[kindGroup]bool{}
	var kinds, groups []string
	var deps []uuid.UUID
	dep := map[uuid.UUID]bool{}
	for _, i := range ins {
		it := items[i]
		if p := (kindGroup{it.Kind, it.GroupKey}); it.GroupKey != "" && it.RunAt.IsZero() && it.Delay == 0 && !seen[p] {
			seen[p] = true
			kinds, groups = append(kinds, p.kind), append(groups, p.group)
		}
		for _, d := range it.DependsOn {
			if !dep[d] {
				dep[d] = true
				deps = append(deps, d)
			}
		}
	}
	if len(kinds) > 0 {
		b.Queue(groupLockSQL, kinds, groups)
	}
	if len(deps) > 0 {
		b.Queue(lockDependenciesSQL, deps)
	}
}

// sequencePlaces locks the sequences of the items of ins that have a
// key (in a fixed order: no deadlocks between batches), looks up each
// one's head and gives those items their places: it sets items[i].seqNo.
// It returns the heads, for linkSequences.
func (s *Store) sequencePlaces(ctx context.Context, tx pgx.Tx, items []prepared, ins []int) (map[seqKey]seqHead, error) {
	var keys []seqKey
	seen := map[seqKey]bool{}
	for _, i := range ins {
		if items[i].SequenceKey == "" {
			continue
		}
		k := seqKey{items[i].Kind, items[i].SequenceKey}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	sort.Slice(keys, func(a, b int) bool { return keys[a].lockName() < keys[b].lockName() })
	names := make([]string, len(keys))
	kinds := make([]string, len(keys))
	seqs := make([]string, len(keys))
	for j, k := range keys {
		names[j], kinds[j], seqs[j] = k.lockName(), k.kind, k.key
	}
	heads := make(map[seqKey]seqHead, len(keys))
	// The locks (those the SQL create takes before the sequences' first),
	// then the heads (under the locks: the look-up takes its snapshot
	// after them), in one round trip. A look-up whose latest task was
	// cancelled or deleted while it waited for that task's row lock is
	// made again (the locks are held: no new task joins).
	b := &pgx.Batch{}
	queueLocksBeforeSequences(b, items, ins)
	b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest($1::text[]) AS k ORDER BY k`, names)
	for attempt := 1; ; attempt++ {
		var again []int
		b.Queue(seqHeadSQL, kinds, seqs).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var ord int
				var h seqHead
				var pred *uuid.UUID
				var stale bool
				if err := rows.Scan(&ord, &h.lastNo, &pred, &stale); err != nil {
					return err
				}
				if stale {
					again = append(again, ord-1)
					continue
				}
				if pred != nil {
					h.pred = *pred
				}
				heads[keys[ord-1]] = h
			}
			return rows.Err()
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("look up %d sequences: %w", len(keys), err)
		}
		if len(again) == 0 {
			break
		}
		if attempt == 10 {
			return nil, fmt.Errorf("look up sequence %q of kind %s: its latest task keeps ending while looked up", seqs[again[0]], kinds[again[0]])
		}
		k2, s2, keys2 := make([]string, len(again)), make([]string, len(again)), make([]seqKey, len(again))
		for j, o := range again {
			k2[j], s2[j], keys2[j] = kinds[o], seqs[o], keys[o]
		}
		kinds, seqs, keys = k2, s2, keys2
		b = &pgx.Batch{}
	}
	next := make(map[seqKey]int64, len(keys))
	for _, i := range ins {
		if items[i].SequenceKey == "" {
			continue
		}
		k := seqKey{items[i].Kind, items[i].SequenceKey}
		if _, ok := next[k]; !ok {
			next[k] = heads[k].lastNo
		}
		next[k]++
		items[i].seqNo = next[k]
	}
	return heads, nil
}

// seqHeadSQL returns, for each (kind $1[i], sequence_key $2[i]) with i
// (from 1), the last place given in the sequence, the task a new one must
// follow, if any, and whether the look-up must be made again. The task to
// follow is the latest one not CANCELLED (a cancelled task holds
// nothing), unless it has released its successors: SUCCEEDED, or DEAD
// under SequenceContinue. (Tasks before the latest such task have
// released theirs: each ran only once its predecessor had.) Its row is
// share-locked, so its end waits for this creation's commit, and its
// release then sees the new edge; when its end committed while this
// statement waited for the lock, the row lock reads it as it is now, and
// if it was cancelled or deleted meanwhile the look-up is stale (the task
// before it may hold the sequence now).
var seqHeadSQL = `
SELECT k.ord, coalesce(l.sequence_no, 0),
    CASE WHEN p.status IN ('SUCCEEDED', 'CANCELLED') OR (p.status = 'DEAD' AND
        coalesce((SELECT sequence_on_failure FROM ingest_kind WHERE kind = k.kind), '` + SequenceBlock + `') = '` + SequenceContinue + `')
    THEN NULL ELSE p.id END,
    c.id IS NOT NULL AND (p.id IS NULL OR p.status = 'CANCELLED')
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(kind, key, ord)
LEFT JOIN LATERAL (
    SELECT t.sequence_no FROM ingest_task t
    WHERE t.kind = k.kind AND t.sequence_key = k.key AND t.sequence_key IS NOT NULL
    ORDER BY t.sequence_no DESC LIMIT 1) l ON true
LEFT JOIN LATERAL (
    SELECT t.id FROM ingest_task t
    WHERE t.kind = k.kind AND t.sequence_key = k.key AND t.sequence_key IS NOT NULL AND t.status <> 'CANCELLED'
    ORDER BY t.sequence_no DESC LIMIT 1) c ON true
LEFT JOIN LATERAL (
    SELECT t.id, t.status FROM ingest_task t WHERE t.id = c.id FOR SHARE) p ON true
ORDER BY k.ord`

// linkSequences gives each inserted task with a key (inserted holds the
// tasks inserted, by id; an item that lost to an idempotency key is not
// there) its edge to its predecessor: the inserted item of the same
// sequence before it in the batch, else the head found by
// sequencePlaces. It raises their waiting_for in the same statement and
// returns the held tasks: their outbox row is held back (insertHeld), and
// their release replaces it.
func linkSequences(ctx context.Context, tx pgx.Tx, items []prepared, ins []int, heads map[seqKey]seqHead, inserted map[uuid.UUID]*Task) (map[uuid.UUID]bool, error) {
	if len(heads) == 0 {
		return nil, nil
	}
	last := make(map[seqKey]uuid.UUID, len(heads))
	for k, h := range heads {
		last[k] = h.pred
	}
	var tasks, preds []uuid.UUID
	for _, i := range ins {
		it := items[i]
		if it.SequenceKey == "" {
			continue
		}
		if _, ok := inserted[it.id]; !ok {
			continue
		}
		k := seqKey{it.Kind, it.SequenceKey}
		// A task that depends on its predecessor already waits for it:
		// that edge alone holds it (one edge per pair).
		if p := last[k]; p != uuid.Nil && !slices.Contains(it.DependsOn, p) {
			tasks, preds = append(tasks, it.id), append(preds, p)
		}
		last[k] = it.id
	}
	if len(tasks) == 0 {
		return nil, nil
	}
	if _, err := tx.Exec(ctx, linkSequenceSQL, tasks, preds); err != nil {
		return nil, fmt.Errorf("link %d tasks to their sequences: %w", len(tasks), err)
	}
	held := make(map[uuid.UUID]bool, len(tasks))
	for _, id := range tasks {
		held[id] = true
	}
	return held, nil
}

// linkSequenceSQL inserts the 'sequence' edges task $1[i] -> $2[i] and
// counts each in its task's waiting_for.
const linkSequenceSQL = `
WITH e AS (
    INSERT INTO ingest_task_dependency (task_id, depends_on, reason)
    SELECT task_id, depends_on, 'sequence' FROM unnest($1::uuid[], $2::uuid[]) AS x(task_id, depends_on)
    RETURNING task_id
)
UPDATE ingest_task t SET waiting_for = coalesce(t.waiting_for, 0) + 1
FROM e WHERE t.id = e.task_id`

// releaseOnContinue, in a kind change that sets sequence_on_failure
// (nil: not changed; the kind's row already changed in tx), releases the
// successors held by the kind's DEAD tasks when the setting is
// SequenceContinue, as their deaths would have under it
// (ingest_task_end_edges).
func releaseOnContinue(ctx context.Context, tx pgx.Tx, kind string, v *string) error {
	if v == nil || *v != SequenceContinue {
		return nil
	}
	_, err := tx.Exec(ctx, `
SELECT ingest_task_end_edges(array_agg(t.id ORDER BY t.id), array_agg('DEAD'::text))
FROM ingest_task t
WHERE t.kind = $1 AND t.status = 'DEAD' AND t.sequence_key IS NOT NULL
  AND EXISTS (SELECT 1 FROM ingest_task_dependency d WHERE d.depends_on = t.id AND d.reason = 'sequence' AND d.released_at IS NULL)
HAVING count(*) > 0`, kind)
	if err != nil {
		return fmt.Errorf("release the sequences held by DEAD tasks: %w", err)
	}
	return nil
}

// BlockedSequence is a sequence held by its DEAD head task: its kind's
// sequence_on_failure is SequenceBlock, and the task's successors wait
// until it is redriven and succeeds, cancelled or deleted.
type BlockedSequence struct {
	Kind        string `json:"kind"`
	SequenceKey string `json:"sequence_key"`
	// TaskID is the DEAD task that holds the sequence, SequenceNo its
	// place in it.
	TaskID     uuid.UUID  `json:"task_id"`
	SequenceNo int64      `json:"sequence_no"`
	DeadAt     *time.Time `json:"dead_at,omitempty"`
	Error      string     `json:"error,omitempty"`
	// Waiting counts the tasks of the sequence after it that are held.
	Waiting int64 `json:"waiting"`
}

// blockedSQL finds the DEAD tasks with a sequence key that hold their
// successors: under the kind's SequenceBlock, and no 'sequence' edge to
// them released (one released under SequenceContinue before the setting
// changed does not count them). $1: a kind, or "" for all. Every DEAD task
// is in ingest_task_failed_idx (failedGuard); naming its predicate lets
// the statement read that index rather than the whole table.
var blockedSQL = `
FROM ingest_task t
WHERE ` + failedGuard("t") + ` AND t.status = 'DEAD' AND t.sequence_key IS NOT NULL AND ($1 = '' OR t.kind = $1)
  AND coalesce((SELECT k.sequence_on_failure FROM ingest_kind k WHERE k.kind = t.kind), '` + SequenceBlock + `') = '` + SequenceBlock + `'
  AND NOT EXISTS (SELECT 1 FROM ingest_task_dependency d
                  WHERE d.depends_on = t.id AND d.reason = 'sequence' AND d.released_at IS NOT NULL)`

// BlockedSequences lists up to limit blocked sequences (of kind, or of
// every kind when kind is ""), by kind and key. It reads the kind's DEAD
// tasks: an operator's query, not one for a hot path.
func (s *Store) BlockedSequences(ctx context.Context, kind string, limit int) ([]BlockedSequence, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.db.Query(ctx, `
SELECT t.kind, t.sequence_key, t.id, t.sequence_no, t.finished_at, coalesce(t.error_message, ''),
    (SELECT count(*) FROM ingest_task w WHERE w.kind = t.kind AND w.sequence_key = t.sequence_key
        AND w.sequence_no > t.sequence_no AND w.status = 'QUEUED' AND w.waiting_for > 0)
`+blockedSQL+`
ORDER BY t.kind, t.sequence_key, t.sequence_no LIMIT $2`, kind, limit)
	if err != nil {
		return nil, fmt.Errorf("list blocked sequences: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BlockedSequence, error) {
		var b BlockedSequence
		err := r.Scan(&b.Kind, &b.SequenceKey, &b.TaskID, &b.SequenceNo, &b.DeadAt, &b.Error, &b.Waiting)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("list blocked sequences: %w", err)
	}
	return out, nil
}

// blockedCountsSQL counts the blocked sequences of each kind ($1: one
// kind, or "" for all).
var blockedCountsSQL = `SELECT t.kind, count(*) ` + blockedSQL + ` GROUP BY t.kind`

// BlockedSequenceCounts counts the blocked sequences of each kind that
// has any (of kind only, when kind is not ""): the leader's gauge, every
// few seconds, so pgplan.QueryCount keeps it on ingest_task_failed_idx.
func (s *Store) BlockedSequenceCounts(ctx context.Context, kind string) (map[string]int64, error) {
	rows, err := pgplan.QueryCount(ctx, s.db, blockedCountsSQL, kind)
	if err != nil {
		return nil, fmt.Errorf("count blocked sequences: %w", err)
	}
	out := map[string]int64{}
	var k string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil }); err != nil {
		return nil, fmt.Errorf("count blocked sequences: %w", err)
	}
	return out, nil
}
