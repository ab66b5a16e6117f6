package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
)

// BatchRequest is the JSON body POSTed for a batch of task runs (NewBatch):
// one element per task, each what a single POST sends. A batch has no
// Idempotency-Key header (a thousand ids do not fit the header limits of
// common proxies): each element's task_id is its task's key.
type BatchRequest struct {
	Tasks []Request `json:"tasks"`
}

// BatchResponse is the JSON body a receiver answers a batch with (2xx,
// Content-Type application/json): one element per task, in any order.
type BatchResponse struct {
	Results []TaskResult `json:"results"`
}

// Statuses of a TaskResult.
const (
	// StatusOK: the task SUCCEEDED; TaskResult.Result (if any) is its
	// result.
	StatusOK = "ok"
	// StatusRetry: the run failed; the task is retried (or DEAD on its
	// last attempt), after RetryAfterSeconds when set.
	StatusRetry = "retry"
	// StatusFail: the run failed permanently; the task is DEAD at once.
	StatusFail = "fail"
)

// TaskResult is the receiver's outcome for one task of a batch.
type TaskResult struct {
	TaskID uuid.UUID `json:"task_id"`
	// Status is "ok", "retry" or "fail".
	Status string `json:"status"`
	// Result is the task's result when Status is "ok" (JSON; absent or
	// null: none), at most Config.MaxResultBytes.
	Result json.RawMessage `json:"result,omitempty"`
	// Error says why a run failed (kept as the task's last_error).
	Error string `json:"error,omitempty"`
	// RetryAfterSeconds, for "retry", asks for the next run after this
	// many seconds instead of the backoff (capped by MaxRetryAfter).
	RetryAfterSeconds int `json:"retry_after_seconds,omitempty"`
}

// NewBatch returns a batch handler (ingest.BatchHandler; register it with
// Service.HandleDefaultBatch) that POSTs each batch of task runs to
// cfg.URL as one BatchRequest and takes each task's outcome from the
// BatchResponse (see the package documentation).
func NewBatch(cfg Config) (ingest.BatchHandler, error) {
	h, err := newHandler(cfg)
	if err != nil {
		return nil, err
	}
	return h.handleBatch, nil
}

func (h *handler) handleBatch(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
	body := BatchRequest{Tasks: make([]Request, len(tasks))}
	for i, t := range tasks {
		body.Tasks[i] = requestOf(t)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, ingest.Permanent(fmt.Errorf("webhook: encode a batch of %d tasks: %w", len(tasks), err))
	}
	rctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, h.url, bytes.NewReader(b))
	if err != nil {
		return nil, ingest.Permanent(fmt.Errorf("webhook: POST %s: %v", h.shown, err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", h.cfg.UserAgent)

	resp, err := h.do(req)
	if err != nil {
		return nil, h.transportError(ctx, rctx, err)
	}
	defer resp.Body.Close()
	if code := resp.StatusCode; code < 200 || code > 299 {
		// The whole batch failed: every task's run is a failed attempt,
		// never a permanent one (one bad task must not bury the others:
		// a receiver says "fail" per task).
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		err := fmt.Errorf("webhook: POST %s (a batch of %d tasks): %s%s", h.shown, len(tasks), resp.Status, bodySuffix(snippet))
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return nil, ingest.RetryAfter(min(d, h.cfg.MaxRetryAfter), err)
		}
		return nil, err
	}
	res, err := h.batchResponse(ctx, rctx, resp, len(tasks))
	if err != nil {
		return nil, err
	}
	outs := make([]ingest.Outcome, 0, len(res.Results))
	for _, r := range res.Results {
		outs = append(outs, h.outcome(r))
	}
	return outs, nil
}

// batchResponse reads and checks the body of a 2xx answer to a batch of n
// tasks; an error fails every task of the batch.
func (h *handler) batchResponse(parent, rctx context.Context, resp *http.Response, n int) (BatchResponse, error) {
	var res BatchResponse
	bad := func(format string, args ...any) error {
		return fmt.Errorf("webhook: POST %s (a batch of %d tasks): %s: malformed batch response: %s", h.shown, n, resp.Status, fmt.Sprintf(format, args...))
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/json" && !strings.HasSuffix(mt, "+json") {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return res, bad("Content-Type is %q, want application/json%s", mt, bodySuffix(snippet))
	}
	// Each result may be as large as a task's result may be.
	limit := int64(n)*(int64(h.cfg.MaxResultBytes)+maxErrorBody+256) + 1024
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return res, h.transportError(parent, rctx, err)
	case int64(len(b)) > limit:
		return res, bad("larger than %d bytes", limit)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		return res, bad("%v%s", err, bodySuffix(b[:min(len(b), maxErrorBody)]))
	}
	if res.Results == nil {
		return res, bad(`no "results" array`)
	}
	for i, r := range res.Results {
		switch {
		case r.TaskID == uuid.Nil:
			return res, bad("results[%d]: no task_id", i)
		case r.Status != StatusOK && r.Status != StatusRetry && r.Status != StatusFail:
			return res, bad("results[%d]: status %q, want %q, %q or %q", i, r.Status, StatusOK, StatusRetry, StatusFail)
		}
	}
	return res, nil
}

// maxRetryAfterSeconds bounds a result's retry_after_seconds before it
// becomes a duration (a year, as for Retry-After).
const maxRetryAfterSeconds = 365 * 24 * 3600

// outcome turns a receiver's result into the task's outcome.
func (h *handler) outcome(r TaskResult) ingest.Outcome {
	o := ingest.Outcome{TaskID: r.TaskID}
	msg := r.Error
	if msg == "" {
		msg = "no error given"
	}
	err := fmt.Errorf("webhook: POST %s: task %s: %s", h.shown, r.Status, msg)
	switch r.Status {
	case StatusOK:
		if len(r.Result) > h.cfg.MaxResultBytes {
			o.Err = fmt.Errorf("webhook: POST %s: the result of task %s is larger than %d bytes (INGEST_RESULT_MAX_BYTES)", h.shown, r.TaskID, h.cfg.MaxResultBytes)
			return o
		}
		if len(r.Result) > 0 {
			o.Result = r.Result
		}
	case StatusFail:
		o.Err = ingest.Permanent(err)
	default: // retry
		o.Err = err
		if r.RetryAfterSeconds > 0 {
			d := time.Duration(min(r.RetryAfterSeconds, maxRetryAfterSeconds)) * time.Second
			o.Err = ingest.RetryAfter(min(d, h.cfg.MaxRetryAfter), err)
		}
	}
	return o
}
