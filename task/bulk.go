package task

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Bulk redrive limits and defaults.
const (
	// DefaultRedriveLimit is how many tasks a RedriveFilter without a
	// Limit matches at most.
	DefaultRedriveLimit = 1000
	// MaxRedriveLimit bounds RedriveFilter.Limit.
	MaxRedriveLimit = 1_000_000
	// DefaultRedriveBatch is how many tasks one redrive transaction moves.
	DefaultRedriveBatch = 500
	// DefaultRedriveRate is how many tasks a bulk redrive moves per second
	// at most, so that redriving a large backlog neither floods the queue
	// nor starves live traffic of the workers.
	DefaultRedriveRate = 2000
)

// RedriveFilter selects the DEAD or CANCELLED tasks of a bulk redrive
// (Store.RedriveMatching).
type RedriveFilter struct {
	// Status is Dead or Cancelled (required).
	Status State `json:"status"`
	// Kind matches one kind; "" any.
	Kind string `json:"kind,omitempty"`
	// ErrorContains matches tasks whose last_error contains it
	// (case-sensitive); "" any.
	ErrorContains string `json:"error_contains,omitempty"`
	// Since and Until bound finished_at (when the task went DEAD or
	// CANCELLED) to [Since, Until); zero: open.
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// Limit is how many tasks are matched at most; 0: DefaultRedriveLimit,
	// or the number of IDs when they are given.
	Limit int `json:"limit,omitempty"`
	// IDs, when given, narrows the match to these tasks (those of them
	// that still match the rest of the filter): what a dry run listed, so
	// that the redrive that follows it acts on exactly that and never on
	// tasks that died since. At most MaxRedriveLimit.
	IDs []uuid.UUID `json:"ids,omitempty"`
}

// WithDefaults returns f with its zero Limit set to DefaultRedriveLimit,
// or to the number of its IDs.
func (f RedriveFilter) WithDefaults() RedriveFilter {
	if f.Limit == 0 {
		f.Limit = DefaultRedriveLimit
		if len(f.IDs) > 0 {
			f.Limit = len(f.IDs)
		}
	}
	return f
}

// Validate reports the first invalid field of f (after WithDefaults) as
// a *FieldError (status, limit, since, kind or error_contains), which wraps
// ErrInvalidTask.
func (f RedriveFilter) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case f.Status != Dead && f.Status != Cancelled:
		return bad("status", "status must be %s or %s, got %q", Dead, Cancelled, f.Status)
	case len(f.IDs) > MaxRedriveLimit:
		return bad("ids", "ids lists %d tasks, the limit is %d", len(f.IDs), MaxRedriveLimit)
	case !RedriveLimitRange.Contains(int64(f.Limit)):
		return RedriveLimitRange.Check(int64(f.Limit))
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until):
		return bad("since", "since (%s) must be before until (%s)", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	case len(f.Kind) > MaxKindLength:
		return bad("kind", "kind is %d bytes, the limit is %d", len(f.Kind), MaxKindLength)
	case CheckText("kind", f.Kind) != nil:
		return CheckText("kind", f.Kind)
	case len(f.ErrorContains) > MaxErrorBytes:
		return bad("error_contains", "error_contains is %d bytes, the limit is %d", len(f.ErrorContains), MaxErrorBytes)
	case CheckText("error_contains", f.ErrorContains) != nil:
		return CheckText("error_contains", f.ErrorContains)
	}
	return nil
}

// Bounds of RedriveOptions.Rate (tasks per second; 0: DefaultRedriveRate).
const (
	MinRedriveRate = 0.01
	MaxRedriveRate = 1_000_000
)

// Validate reports an invalid Rate or Batch as a *FieldError (rate,
// batch): a rate must be 0 (the default) or a finite number from
// MinRedriveRate to MaxRedriveRate, so that the pacing's waits stay in
// range (NaN or a tiny rate would overflow them into no pacing at all).
func (o RedriveOptions) Validate() error {
	switch {
	case o.Rate != 0 && !(o.Rate >= MinRedriveRate && o.Rate <= MaxRedriveRate): // also refuses NaN
		return &FieldError{Field: "rate", Msg: fmt.Sprintf("rate must be 0 (the default, %d/s) or from %g to %g tasks per second, got %g",
			DefaultRedriveRate, float64(MinRedriveRate), float64(MaxRedriveRate), o.Rate)}
	case o.Batch < 0 || o.Batch > MaxRedriveLimit:
		return &FieldError{Field: "batch", Msg: fmt.Sprintf("batch must be 0 (the default, %d) or from 1 to %d, got %d", DefaultRedriveBatch, MaxRedriveLimit, o.Batch)}
	}
	return nil
}

// RedriveOptions paces a bulk redrive.
type RedriveOptions struct {
	// DryRun matches the tasks and changes nothing.
	DryRun bool
	// Batch is how many tasks one transaction redrives; 0:
	// DefaultRedriveBatch.
	Batch int
	// Rate is how many tasks per second are redriven at most; 0:
	// DefaultRedriveRate.
	Rate float64
	// Redriven, when set, is called after each committed batch with its
	// results (Redriven names the tasks it moved; to remove their DLQ
	// entries, say).
	Redriven func(ctx context.Context, res []Result) error
}

// BulkRedriveResult is the outcome of Store.RedriveMatching.
type BulkRedriveResult struct {
	// Matched counts the tasks the filter selected (at most its Limit).
	Matched int `json:"matched"`
	// Redriven counts the tasks moved to QUEUED (0 in a dry run; fewer
	// than Matched when some were redriven or changed meanwhile).
	Redriven int `json:"redriven"`
	// IDs are the matched tasks, newest first (in a dry run, what a real
	// run would redrive).
	IDs []uuid.UUID `json:"ids"`
}

// matchRedrivableSQL reads one page of the tasks of a RedriveFilter,
// newest first (by id), through ingest_task_failed_idx (which holds every
// DEAD and CANCELLED task): $1 status, $2 kind (empty: any), $3 error
// substring (empty: any), $4/$5 the finished_at window (NULL: open), $6
// the id of the last task of the previous page (NULL: first page), $7 the
// page size, $8 the tasks to match among (NULL: any).
var matchRedrivableSQL = `
SELECT id FROM ingest_task t
WHERE ` + failedGuard("t") + ` AND status = $1
  AND ($2 = '' OR kind = $2)
  AND ($3 = '' OR strpos(coalesce(last_error, ''), $3) > 0)
  AND ($4::timestamptz IS NULL OR finished_at >= $4)
  AND ($5::timestamptz IS NULL OR finished_at < $5)
  AND ($6::uuid IS NULL OR id < $6)
  AND ($8::uuid[] IS NULL OR id = ANY($8))
ORDER BY id DESC
LIMIT $7`

// RedriveMatching redrives the tasks that f selects, in batches of
// o.Batch (each one Redrive: one transaction, one audit row per task with
// actor and the message "redrive"), at most o.Rate tasks per second. A
// dry run only matches. Tasks are matched page by page as the redrive
// goes, newest first; a task that changed since it matched is skipped by
// Redrive's guard and not counted as redriven. On an error (or ctx ending)
// the batches committed so far stay redriven and are counted in the
// result returned with the error.
func (s *Store) RedriveMatching(ctx context.Context, actor string, f RedriveFilter, o RedriveOptions) (BulkRedriveResult, error) {
	f = f.WithDefaults()
	if err := f.Validate(); err != nil {
		return BulkRedriveResult{}, err
	}
	if err := o.Validate(); err != nil {
		return BulkRedriveResult{}, err
	}
	if o.Batch <= 0 {
		o.Batch = DefaultRedriveBatch
	}
	if o.Rate <= 0 {
		o.Rate = DefaultRedriveRate
	}
	res := BulkRedriveResult{IDs: []uuid.UUID{}}
	var (
		cursor *uuid.UUID
		since  = optionalTime(f.Since)
		until  = optionalTime(f.Until)
		begun  = time.Now()
	)
	for res.Matched < f.Limit {
		n := min(o.Batch, f.Limit-res.Matched)
		rows, err := s.db.Query(ctx, matchRedrivableSQL, string(f.Status), f.Kind, f.ErrorContains, since, until, cursor, n, f.IDs)
		if err != nil {
			return res, fmt.Errorf("redrive matching: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return res, fmt.Errorf("redrive matching: %w", err)
		}
		if len(ids) == 0 {
			break
		}
		cursor = &ids[len(ids)-1]
		res.Matched += len(ids)
		res.IDs = append(res.IDs, ids...)
		if !o.DryRun {
			// Pace: the batch starts no earlier than the rate allows for
			// the tasks redriven before it.
			wait := time.Until(begun.Add(time.Duration(float64(res.Redriven) / o.Rate * float64(time.Second))))
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return res, ctx.Err()
				case <-t.C:
				}
			}
			done, err := s.Redrive(ctx, actor, ids...)
			if err != nil {
				return res, err
			}
			moved := Redriven(done)
			res.Redriven += len(moved)
			if o.Redriven != nil && len(moved) > 0 {
				if err := o.Redriven(ctx, done); err != nil {
					return res, err
				}
			}
		}
		if len(ids) < n {
			break
		}
	}
	return res, nil
}

// Redriven returns the tasks of a Redrive's results that it moved from
// DEAD or CANCELLED to QUEUED: the ones whose DLQ entries go.
func Redriven(res []Result) []uuid.UUID {
	var out []uuid.UUID
	for _, r := range res {
		if r.Applied && (r.From == Dead || r.From == Cancelled) {
			out = append(out, r.ID)
		}
	}
	return out
}

// optionalTime is t, or nil (SQL NULL) when t is zero.
func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
