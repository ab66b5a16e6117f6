// Package webhook is the built-in task handler of the ingest-worker binary:
// it delivers each task run as an HTTP POST to one URL.
//
// The request body is {"task_id", "kind", "payload", "attempt"} and the
// Idempotency-Key header is the task id, so the receiver can drop repeats:
// delivery is at-least-once, like every handler's.
//
// The response decides the outcome:
//
//   - 2xx: success. With NewResult's handler (the binary's), a body with
//     Content-Type application/json (or another +json type) is the task's
//     result: at most Config.MaxResultBytes (INGEST_RESULT_MAX_BYTES), else
//     the run fails (retryable) saying so, and so does a JSON body that is
//     not valid JSON; an empty body, or one of another type (text/plain,
//     none), is no result. New's handler keeps no result;
//   - 408, 429, 5xx, timeouts, refused or broken connections, unexpected
//     1xx/3xx: a retryable error (a Retry-After header, in seconds or as an
//     HTTP date, sets the delay through ingest.RetryAfter);
//   - any other 4xx: ingest.Permanent, the task goes DEAD at once.
//
// NewBatch's handler (the binary's with INGEST_WEBHOOK_BATCH_MAX > 1, an
// ingest.BatchHandler) POSTs a batch of runs of one kind as one
// BatchRequest {"tasks": [...]} (each element's task_id is its
// idempotency key; the request has no Idempotency-Key header) and takes each task's outcome from the 2xx JSON BatchResponse
// {"results": [{"task_id", "status": "ok"|"retry"|"fail", "result",
// "error", "retry_after_seconds"}]}; a task without a result is a failed
// run. A non-2xx answer or a malformed body fails every task of the batch
// as a retryable run, never a permanent one (a Retry-After header still
// sets the delay).
//
// Redirects are not followed (a followed 301/302 would turn the POST into a
// GET). The URL's password and secret-looking query parameters never appear
// in errors.
package webhook
