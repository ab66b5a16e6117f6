package task

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/transition"
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
	// MaxAttempts overrides the store's default when > 0.
	MaxAttempts int
	// DedupByPayload returns the existing non-DEAD task of the same Kind with
	// the same canonical payload instead of creating a second one.
	DedupByPayload bool
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
// relay to publish through (see PublishThrough), the new tasks are handed
// to it as soon as the transaction commits.
func (s *Store) CreateBatch(ctx context.Context, nts []NewTask) ([]CreateResult, error) {
	var relay *outbox.Relay
	if _, nested := s.db.(pgx.Tx); !nested {
		// Inside a caller's transaction the commit is not ours: the
		// entries must wait for it, which the NOTIFY does.
		relay = s.relay.Load()
	}
	var res []CreateResult
	var claim outbox.Claim
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		claim.Discard() // of an attempt that was rolled back
		var err error
		res, claim, err = s.createTx(ctx, tx, relay, nts)
		return err
	})
	if err != nil {
		claim.Discard()
		return nil, err
	}
	claim.Publish()
	return res, nil
}

// PublishThrough makes Create and CreateBatch hand the tasks they commit to
// relay r, which publishes them at once while it runs, instead of leaving
// them to the next relay pass that a NOTIFY wakes (see
// outbox.Relay.InsertClaimed). The guarantees are the same either way; nil
// turns it off. NewService does this with the service's relay.
func (s *Store) PublishThrough(r *outbox.Relay) { s.relay.Store(r) }

// CreateTx creates tasks inside the caller's transaction, so they commit
// (and are published) atomically with the caller's own writes, or not at
// all. Each task gets its QUEUED audit row and a NEW outbox event.
func (s *Store) CreateTx(ctx context.Context, tx pgx.Tx, nts ...NewTask) ([]CreateResult, error) {
	res, _, err := s.createTx(ctx, tx, nil, nts)
	return res, err
}

// createTx is CreateTx, writing the outbox rows claimed by relay when it is
// not nil, and returns their claim (zero when they went unclaimed, and on
// an error: the claim is taken last).
func (s *Store) createTx(ctx context.Context, tx pgx.Tx, relay *outbox.Relay, nts []NewTask) ([]CreateResult, outbox.Claim, error) {
	var claim outbox.Claim
	if len(nts) == 0 {
		return nil, claim, nil
	}
	items, err := s.prepare(nts)
	if err != nil {
		return nil, claim, err
	}
	res := make([]CreateResult, len(items))
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
	inserted := map[uuid.UUID]Task{}
	if len(ins) > 0 {
		cols := struct {
			ids              []uuid.UUID
			kinds, shas, key []string
			payloads         []string
			max              []int32
		}{}
		for _, i := range ins {
			it := items[i]
			cols.ids = append(cols.ids, it.id)
			cols.kinds = append(cols.kinds, it.Kind)
			cols.payloads = append(cols.payloads, string(it.canonical))
			cols.shas = append(cols.shas, it.sha)
			cols.key = append(cols.key, it.IdempotencyKey)
			cols.max = append(cols.max, int32(it.MaxAttempts))
		}
		rows, err := tx.Query(ctx, insertTasksSQL, cols.ids, cols.kinds, cols.payloads, cols.shas, cols.key, cols.max)
		if err != nil {
			return nil, claim, fmt.Errorf("insert tasks: %w", err)
		}
		created, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Task, error) { return scanTask(r) })
		if err != nil {
			return nil, claim, fmt.Errorf("insert tasks: %w", err)
		}
		for _, t := range created {
			inserted[t.ID] = t
		}
	}

	// Rows not inserted lost to an idempotency key: a task that existed
	// before, or an earlier item of this batch.
	var recs []transition.Record
	var newIDs []uuid.UUID
	for _, i := range ins {
		it := items[i]
		if t, ok := inserted[it.id]; ok {
			res[i] = CreateResult{Task: t}
			recs = append(recs, transition.Record{TaskID: t.ID, To: string(Queued), Message: "created"})
			newIDs = append(newIDs, t.ID)
			continue
		}
		t, err := scanTask(tx.QueryRow(ctx, `SELECT `+taskColumns+` FROM ingest_task WHERE kind = $1 AND idempotency_key = $2`, it.Kind, it.IdempotencyKey))
		if err != nil {
			return nil, claim, fmt.Errorf("read task of idempotency key %q (kind %s): %w", it.IdempotencyKey, it.Kind, err)
		}
		res[i] = CreateResult{Task: t, Existing: true}
	}
	if err := transition.Insert(ctx, tx, recs...); err != nil {
		return nil, claim, err
	}
	if relay == nil {
		if err := outbox.Insert(ctx, tx, s.cfg.Stream, newIDs...); err != nil {
			return nil, claim, err
		}
	} else {
		kinds := make([]string, len(newIDs))
		for i, id := range newIDs {
			kinds[i] = inserted[id].Kind
		}
		var err error
		if claim, err = relay.InsertClaimed(ctx, tx, s.cfg.Stream, newIDs, kinds); err != nil {
			return nil, claim, err
		}
	}
	for i, it := range items {
		if it.sameAs >= 0 {
			res[i] = CreateResult{Task: res[it.sameAs].Task, Existing: true}
		}
	}
	return res, claim, nil
}

const insertTasksSQL = `
INSERT INTO ingest_task (id, kind, payload, payload_sha, idempotency_key, max_attempts)
SELECT id, kind, payload::jsonb, sha, NULLIF(key, ''), max_attempts
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[])
    WITH ORDINALITY AS n(id, kind, payload, sha, key, max_attempts, ord)
ORDER BY ord
ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ` + taskColumns

// dedupByPayload resolves items with DedupByPayload against existing
// non-DEAD tasks (and earlier items of the batch). A transaction-scoped
// advisory lock per (kind, payload_sha) serialises concurrent creators.
func (s *Store) dedupByPayload(ctx context.Context, tx pgx.Tx, items []prepared, res []CreateResult, done []bool) error {
	var keys []string
	for _, it := range items {
		if it.DedupByPayload {
			keys = append(keys, it.dedupKey())
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys) // a fixed lock order: no deadlocks between batches
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest($1::text[]) AS k ORDER BY k`, keys); err != nil {
		return fmt.Errorf("lock payload dedup keys: %w", err)
	}
	firstInBatch := map[string]int{}
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
		t, err := scanTask(tx.QueryRow(ctx, `SELECT `+taskColumns+` FROM ingest_task
			WHERE kind = $1 AND payload_sha = $2 AND status <> 'DEAD' ORDER BY created_at LIMIT 1`, it.Kind, it.sha))
		if err == pgx.ErrNoRows {
			continue
		}
		if err != nil {
			return fmt.Errorf("look up payload dedup: %w", err)
		}
		res[i] = CreateResult{Task: t, Existing: true}
		done[i] = true
	}
	return nil
}

// prepared is a validated NewTask with its id and canonical payload.
type prepared struct {
	NewTask
	id        uuid.UUID
	canonical []byte
	sha       string
	sameAs    int // index of an earlier item of the batch with the same dedup key, or -1
}

// dedupKey names the payload dedup lock of the item. It goes to Postgres as
// text, so it must not contain NUL; the sha, a fixed-length hex suffix, keeps
// it unambiguous whatever the kind contains.
func (p prepared) dedupKey() string { return p.Kind + "/" + p.sha }

func (s *Store) prepare(nts []NewTask) ([]prepared, error) {
	items := make([]prepared, len(nts))
	for i, nt := range nts {
		where := ""
		if len(nts) > 1 {
			where = fmt.Sprintf("task %d: ", i)
		}
		nt.Kind = strings.TrimSpace(nt.Kind)
		switch {
		case nt.Kind == "":
			return nil, fmt.Errorf("%w: %skind is required", ErrInvalidTask, where)
		case len(nt.Kind) > MaxKindLength:
			return nil, fmt.Errorf("%w: %skind is longer than %d bytes", ErrInvalidTask, where, MaxKindLength)
		case !validText(nt.Kind):
			return nil, fmt.Errorf("%w: %skind must be valid UTF-8 without NUL characters", ErrInvalidTask, where)
		case len(nt.IdempotencyKey) > 1000:
			return nil, fmt.Errorf("%w: %sidempotency_key is longer than 1000 bytes", ErrInvalidTask, where)
		case !validText(nt.IdempotencyKey):
			return nil, fmt.Errorf("%w: %sidempotency_key must be valid UTF-8 without NUL characters", ErrInvalidTask, where)
		case nt.MaxAttempts < 0:
			return nil, fmt.Errorf("%w: %smax_attempts must be >= 1, got %d", ErrInvalidTask, where, nt.MaxAttempts)
		case len(nt.Payload) > s.cfg.MaxPayloadBytes:
			return nil, fmt.Errorf("%w: %spayload is %d bytes, the limit is %d", ErrPayloadTooLarge, where, len(nt.Payload), s.cfg.MaxPayloadBytes)
		}
		if nt.MaxAttempts == 0 {
			nt.MaxAttempts = s.cfg.MaxAttempts
		}
		canonical, err := Canonical(nt.Payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %spayload: %v", ErrInvalidTask, where, err)
		}
		sum := sha256.Sum256(canonical)
		id, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		items[i] = prepared{NewTask: nt, id: id, canonical: canonical, sha: hex.EncodeToString(sum[:]), sameAs: -1}
	}
	return items, nil
}

// validText reports whether s can be stored in a Postgres text column.
func validText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// Canonical returns the canonical form of a JSON value: no insignificant
// white space, object keys sorted, numbers as written. Two payloads that
// mean the same JSON have the same canonical form (and payload_sha).
func Canonical(payload []byte) ([]byte, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, fmt.Errorf("is empty (want a JSON value)")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("is not a single JSON value")
	}
	if containsNULInJSON(v) {
		return nil, fmt.Errorf("contains a \\u0000 character, which Postgres jsonb cannot store")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func containsNULInJSON(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsRune(x, 0)
	case []any:
		for _, e := range x {
			if containsNULInJSON(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if strings.ContainsRune(k, 0) || containsNULInJSON(e) {
				return true
			}
		}
	}
	return false
}
