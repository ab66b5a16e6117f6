package task

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
	"github.com/ingest-worker/ingest/seal"
)

// RotateBatchRange bounds the batch of Rotate: the tasks one call reads
// (in id order) and rewrites in one statement.
var RotateBatchRange = Range{Field: "batch_size", Min: 1, Max: 10000}

// DefaultRotateBatch is the batch of Rotate when none is given.
const DefaultRotateBatch = 500

// ErrNoKeyring is Rotate's error on a store without a Keyring.
var ErrNoKeyring = errors.New("no encryption keys: the store has no Keyring")

// RotateBatch is what one call of Rotate did.
type RotateBatch struct {
	// Scanned counts the tasks read (at most the batch size).
	Scanned int `json:"scanned"`
	// Payloads and Results count the values (re)encrypted under the first
	// key (with DryRun: those that would be).
	Payloads int `json:"payloads"`
	Results  int `json:"results"`
	// Conflicts counts the values that changed between the read and the
	// write (a result written by a run that ended meanwhile, a task
	// deleted): left as they are, found again by a later rotation.
	Conflicts int `json:"conflicts"`
	// Unreadable counts the values under a key the keyring lacks (or that
	// do not open under theirs), by key id; they are left as they are.
	Unreadable map[string]int `json:"unreadable,omitempty"`
	// Next is the id to continue after; Done is set when no task is left.
	Next uuid.UUID `json:"next"`
	Done bool      `json:"done"`
}

// rotateReadSQL reads the tasks after id $1, $2 of them in id order (a
// range of the primary key: each call's work is its batch), with the
// payload and the result when they are not sealed under key $3 (NULL
// otherwise).
var rotateReadSQL = `
SELECT id,
    CASE WHEN ` + sealedUnder("payload") + ` THEN NULL ELSE payload END,
    CASE WHEN result IS NULL OR ` + sealedUnder("result") + ` THEN NULL ELSE result END
FROM ingest_task WHERE id > $1 ORDER BY id LIMIT $2`

func sealedUnder(col string) string {
	return `(jsonb_typeof(` + col + `) = 'object' AND ` + col + `->>'$enc' = '` + seal.Version + `' AND ` + col + `->>'kid' = $3)`
}

// rotateWriteSQL writes the re-sealed values of one batch in one
// statement. Each value is guarded by its own old value: a payload or
// result that changed since it was read (a run's result written meanwhile,
// by a worker with other keys; a redrive that cleared it) is left as it
// is, so a rotation never overwrites a newer write. Not a state change:
// no audit row, updated_at kept. RETURNING tells which values it wrote
// (each new ciphertext has a fresh nonce, so equality is this write's).
const rotateWriteSQL = `
UPDATE ingest_task t SET
    payload     = CASE WHEN x.new_payload IS NOT NULL AND t.payload = x.old_payload::jsonb THEN x.new_payload::jsonb ELSE t.payload END,
    payload_sha = CASE WHEN x.new_payload IS NOT NULL AND t.payload = x.old_payload::jsonb THEN x.sha ELSE t.payload_sha END,
    result      = CASE WHEN x.new_result IS NOT NULL AND t.result = x.old_result::jsonb THEN x.new_result::jsonb ELSE t.result END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
    AS x(id, old_payload, new_payload, sha, old_result, new_result)
WHERE t.id = x.id
  AND ((x.new_payload IS NOT NULL AND t.payload = x.old_payload::jsonb)
    OR (x.new_result IS NOT NULL AND t.result = x.old_result::jsonb))
RETURNING t.id, x.new_payload IS NOT NULL AND t.payload = x.new_payload::jsonb,
    x.new_result IS NOT NULL AND t.result = x.new_result::jsonb`

// Rotate re-encrypts, under the keyring's first key, the payloads and
// results of up to batch tasks after id after (uuid.Nil: from the start)
// that are not under it: plaintext ones (written before encryption was on,
// or by the SQL enqueue function) and those under another key of the
// keyring. A payload's payload_sha is rewritten with it (the first key's
// digest). It runs beside workers: each value is written only if it is
// still the one read. With dryRun it writes nothing and counts what it
// would do. Call it again from Next until Done; it is idempotent, and a
// rotation stopped anywhere resumes from any id.
func (s *Store) Rotate(ctx context.Context, after uuid.UUID, batch int, dryRun bool) (RotateBatch, error) {
	var out RotateBatch
	kr := s.cfg.Keyring
	if kr == nil {
		return out, ErrNoKeyring
	}
	if batch == 0 {
		batch = DefaultRotateBatch
	}
	if ferr := RotateBatchRange.Check(int64(batch)); ferr != nil {
		return out, ferr
	}
	rows, err := s.db.Query(ctx, rotateReadSQL, after, batch, kr.Primary())
	if err != nil {
		return out, fmt.Errorf("rotate: read tasks after %s: %w", after, err)
	}
	type row struct {
		id              uuid.UUID
		payload, result []byte
	}
	read, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.payload, &x.result)
	})
	if err != nil {
		return out, fmt.Errorf("rotate: read tasks after %s: %w", after, err)
	}
	out.Scanned = len(read)
	out.Done = len(read) < batch
	if len(read) > 0 {
		out.Next = read[len(read)-1].id
	} else {
		out.Next = after
	}
	var ids []uuid.UUID
	var oldP, newP, shas, oldR, newR []*string
	unreadable := func(err error) bool {
		var oe *seal.OpenError
		if !errors.As(err, &oe) {
			return false
		}
		if out.Unreadable == nil {
			out.Unreadable = map[string]int{}
		}
		out.Unreadable[oe.KeyID]++
		return true
	}
	str := func(b []byte) *string {
		if b == nil {
			return nil
		}
		v := string(b)
		return &v
	}
	for _, x := range read {
		var np, sha, nr []byte
		if x.payload != nil {
			pt, err := kr.Open(seal.Payload, x.id, x.payload)
			switch {
			case unreadable(err):
			case err != nil:
				return out, fmt.Errorf("rotate: task %s: %w", x.id, err)
			default:
				if c, err := Canonical(pt); err == nil {
					pt = c // as Create stores it: the digest is of this form
				}
				if np, err = kr.Seal(seal.Payload, x.id, pt); err != nil {
					return out, fmt.Errorf("rotate: task %s: %w", x.id, err)
				}
				sha = []byte(kr.Digest(pt))
			}
		}
		if x.result != nil {
			pt, err := kr.Open(seal.Result, x.id, x.result)
			switch {
			case unreadable(err):
			case err != nil:
				return out, fmt.Errorf("rotate: task %s: %w", x.id, err)
			default:
				if nr, err = kr.Seal(seal.Result, x.id, pt); err != nil {
					return out, fmt.Errorf("rotate: task %s: %w", x.id, err)
				}
			}
		}
		if np == nil && nr == nil {
			continue
		}
		if dryRun {
			out.Payloads += btoi(np != nil)
			out.Results += btoi(nr != nil)
			continue
		}
		if np == nil {
			x.payload = nil
		}
		if nr == nil {
			x.result = nil
		}
		ids = append(ids, x.id)
		oldP, newP, shas = append(oldP, str(x.payload)), append(newP, str(np)), append(shas, str(sha))
		oldR, newR = append(oldR, str(x.result)), append(newR, str(nr))
	}
	if len(ids) == 0 {
		return out, nil
	}
	wrote := map[uuid.UUID][2]bool{}
	err = s.retry(ctx, func() error {
		clear(wrote)
		rows, err := pgplan.Query(ctx, s.db, rotateWriteSQL, ids, oldP, newP, shas, oldR, newR)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id uuid.UUID
			var p, r bool
			if err := rows.Scan(&id, &p, &r); err != nil {
				return err
			}
			wrote[id] = [2]bool{p, r}
		}
		return rows.Err()
	})
	if err != nil {
		return out, fmt.Errorf("rotate: write %d tasks: %w", len(ids), err)
	}
	for i, id := range ids {
		w := wrote[id]
		out.Payloads += btoi(w[0])
		out.Results += btoi(w[1])
		out.Conflicts += btoi(newP[i] != nil && !w[0]) + btoi(newR[i] != nil && !w[1])
	}
	return out, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
