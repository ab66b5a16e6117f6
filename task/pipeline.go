package task

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/clip"
)

// This file owns a task's result and progress (migration 00017): the
// columns, their limits and the statement that writes progress. The result
// is written by the success statement (succeedSQL); progress is cleared by
// the statements that start a run or send one back to waiting (startSQL,
// failSQL when RETRYING, handBackSQL, redriveSQL).

// MaxProgressMessageBytes bounds a progress report's message (the CHECK
// ingest_task_progress_message_short of migration 00017 holds the same
// number).
const MaxProgressMessageBytes = 1000

// Progress is how far a running task has come, as its current run last
// reported it.
type Progress struct {
	// Percent is 0 to 100.
	Percent int `json:"percent"`
	// Message is a short text ("" when none), at most
	// MaxProgressMessageBytes of UTF-8 without NUL; it is shown as text,
	// never interpreted.
	Message string `json:"message"`
	// UpdatedAt is when it was written (the database's clock).
	UpdatedAt time.Time `json:"updated_at"`
}

// ErrStaleAttempt is the error of a progress report whose run is no
// longer the task's current one: the task is not RUNNING, or it runs
// another attempt (or, for a library handler, under another lease).
var ErrStaleAttempt = errors.New("stale attempt: the task is not running this attempt")

// pipelineColumns are the columns pipelineScan reads, after taskColumns.
const pipelineColumns = `result, progress_percent, coalesce(progress_message, ''), progress_at`

// pipelineScan receives pipelineColumns.
type pipelineScan struct {
	result  []byte
	percent *int16
	message string
	at      *time.Time
}

// dest returns the scan destinations of pipelineColumns.
func (p *pipelineScan) dest() []any { return []any{&p.result, &p.percent, &p.message, &p.at} }

// fill sets t's Result and Progress from the scanned columns.
func (p *pipelineScan) fill(t *Task) {
	if len(p.result) > 0 {
		t.Result = json.RawMessage(p.result)
	}
	if p.percent != nil && p.at != nil {
		t.Progress = &Progress{Percent: int(*p.percent), Message: p.message, UpdatedAt: *p.at}
	}
}

// CheckResult checks a handler's result against the store's limit: valid
// JSON of at most Config.MaxResultBytes. It returns the result to store:
// nil for none (an empty result, or JSON null). The error is a
// *FieldError naming "result".
func (s *Store) CheckResult(result []byte) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(result)
	switch {
	case len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")):
		return nil, nil
	case len(result) > s.cfg.MaxResultBytes:
		return nil, &FieldError{Field: "result", Msg: fmt.Sprintf("result is %d bytes, the limit is %d (INGEST_RESULT_MAX_BYTES)", len(result), s.cfg.MaxResultBytes)}
	case !json.Valid(trimmed):
		return nil, &FieldError{Field: "result", Msg: "result is not valid JSON"}
	case reservedMember(trimmed):
		return nil, &FieldError{Field: "result", Msg: `result: a top-level "$enc" member is reserved for encrypted results`}
	}
	return json.RawMessage(trimmed), nil
}

// ProgressReport is one progress report of a run.
type ProgressReport struct {
	ID uuid.UUID
	// Attempt is the run's attempt number (Task's attempt_count + 1 while
	// it runs), as the worker gave it to the handler.
	Attempt int
	// Percent is 0 to 100; Message at most MaxProgressMessageBytes.
	Percent int
	Message string
	// Owner, when set, must also hold the task's lease (a library
	// handler's run is fenced by its lease too); "": the attempt alone
	// (an external handler, POST /v1/tasks/{id}/progress).
	Owner string
}

// Check names the first bad field of r ("percent", "message",
// "attempt").
func (r ProgressReport) Check() *FieldError {
	if ferr := ProgressPercentRange.Check(int64(r.Percent)); ferr != nil {
		return ferr
	}
	if len(r.Message) > MaxProgressMessageBytes {
		return &FieldError{Field: "message", Msg: fmt.Sprintf("message is %d bytes, the limit is %d", len(r.Message), MaxProgressMessageBytes)}
	}
	if ferr := CheckText("message", r.Message); ferr != nil {
		return ferr
	}
	return AttemptRange.Check(int64(r.Attempt))
}

// progressSQL writes the progress of run (id $1, attempt $2, lease owner
// $5 unless ”), one statement: the guard (RUNNING that attempt, under
// that owner) is on the UPDATE's target, so Postgres re-checks it on the
// row's latest version, and a stale run writes nothing. It is no state
// change: no audit row, updated_at kept. cur reads whether the task
// exists.
const progressSQL = `
WITH u AS (
    UPDATE ingest_task t SET progress_percent = $3, progress_message = NULLIF($4, ''), progress_at = now()
    WHERE t.id = $1
      AND CASE WHEN t.status = 'RUNNING' AND t.attempt_count + 1 = $2 AND ($5 = '' OR t.lease_owner = $5) THEN true ELSE false END
    RETURNING t.id
)
SELECT EXISTS (SELECT FROM u), EXISTS (SELECT FROM ingest_task WHERE id = $1)`

// SetProgress records the progress of a run. It returns a *FieldError for
// bad input, ErrNotFound for an unknown task, and ErrStaleAttempt when the
// run is not the task's current one.
func (s *Store) SetProgress(ctx context.Context, r ProgressReport) error {
	if ferr := r.Check(); ferr != nil {
		return ferr
	}
	var applied, exists bool
	if err := s.db.QueryRow(ctx, progressSQL, r.ID, r.Attempt, r.Percent, r.Message, r.Owner).Scan(&applied, &exists); err != nil {
		return fmt.Errorf("progress of task %s: %w", r.ID, err)
	}
	switch {
	case !exists:
		return fmt.Errorf("%w: %s", ErrNotFound, r.ID)
	case !applied:
		return fmt.Errorf("%w (task %s, attempt %d)", ErrStaleAttempt, r.ID, r.Attempt)
	}
	return nil
}

// ResultPreview is a result for people: indented JSON, cut after
// maxLines lines or maxBytes bytes (at a rune boundary), and whether it
// was cut. The terminal and the dashboard escape it themselves.
func ResultPreview(result json.RawMessage, maxLines, maxBytes int) (string, bool) {
	var b bytes.Buffer
	if err := json.Indent(&b, result, "", "  "); err != nil {
		b.Reset()
		b.Write(result)
	}
	s, cut := b.String(), false
	if lines := strings.SplitAfterN(s, "\n", maxLines+1); len(lines) > maxLines {
		s, cut = strings.TrimSuffix(strings.Join(lines[:maxLines], ""), "\n"), true
	}
	if len(s) > maxBytes {
		s, cut = clip.String(s, maxBytes), true
	}
	return s, cut
}
