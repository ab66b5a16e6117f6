// Package api is the HTTP interface of an ingest-worker process: the task
// API (docs/ARCHITECTURE.md §7.3) on top of a task.Store, the probes and the Prometheus
// metrics.
//
// Routes:
//
//	GET  /healthz                  200 while the process serves requests
//	GET  /readyz                   200 when every readiness check passes, else 503
//	GET  /metrics                  Prometheus text format
//	GET  /v1/openapi.json          the OpenAPI 3.1 document of these routes
//	                               (openapi.json, embedded; no token needed)
//	POST /v1/tasks                 create one task: 201 {id, status}; 200 and the
//	                               existing task for a repeated idempotency key
//	POST /v1/tasks:batch           create many tasks in one transaction
//	GET  /v1/tasks                 list newest first: ?status=&kind=&limit=&cursor= (status: a state, or scheduled: QUEUED or RETRYING due later)
//	GET  /v1/tasks/{id}            a task with its result, progress and transitions;
//	                               ?wait=30s (at most MaxWait, 60s) answers once the task
//	                               is terminal or the wait ends, woken by the notification
//	                               of its end (task.Awaiter: one LISTEN connection per server)
//	POST /v1/tasks/{id}/progress   {"attempt","percent","message"}: 204; 409 when the task
//	                               does not run that attempt
//	POST /v1/tasks/{id}/redrive    DEAD → QUEUED
//	DELETE /v1/tasks/{id}          delete a SUCCEEDED, DEAD or CANCELLED task with its
//	                               audit rows, outbox rows and DLQ entry: 204; live 409
//	POST /v1/tasks/{id}/run        a QUEUED or RETRYING task due later is due now: 200;
//	                               already due, parked, running or finished 409
//
// With Config.Token set, the /v1/ routes require "Authorization: Bearer
// <token>" (compared in constant time); probes, metrics and the OpenAPI
// document stay open.
//
// openapi.json is the machine-readable contract of every route above, its
// bodies, status codes and errors; OpenAPI returns it. Its tests hold it to
// the route table (both ways), its body schemas to the Go types of the
// bodies, and its bounds to package task's, lint it with
// redocly (redocly.yaml), and run the real binary behind a validating proxy
// (prism) and a generated TypeScript client, failing on any answer that
// breaks it. A change of a route or a body changes openapi.json with it.
//
// Errors are JSON: {"error": "...", "field": "..."} where field names the
// offending input (a body field such as "kind" or "[3].payload" for a batch,
// a query parameter, the path's "id") when there is one. Malformed input gets
// 400, an oversized body or payload 413, a missing or wrong token 401, an
// unknown id 404, a redrive of a task that is not DEAD, a delete of a live
// task, a run-now of a task not waiting for a later time or a progress
// report of an attempt the task does not run 409. A delete
// is logged with the actor and counted (ingest_task_deleted_total,
// via="api", on Config.Registerer). When PostgreSQL
// or Redis cannot be reached (httpguard.Unavailable) the answer is 503 with
// Retry-After (httpguard.RetryAfter) and "database unavailable: ...", any
// other failure 500 "internal error": neither carries the error's text,
// which may name the database's user, host and port (it is logged). A
// failing /readyz check reads "unavailable: ..." for a server that cannot
// be reached, else its own message.
//
// A state-changing request (any method but GET, HEAD, OPTIONS) that a
// browser sent on behalf of another site (Sec-Fetch-Site other than
// same-origin or none, or without it an Origin that is not the request's
// own host and port) answers 403 before routing and authentication, token or not
// (httpguard.CrossSite); clients that send neither header are not
// affected.
//
// Input follows package task's rules: a whole-number field is decoded into
// 64 bits and checked against its task.Range (a fraction, an exponent or an
// overflow included: 400 naming the field and the range, never narrowed);
// kinds and idempotency keys follow task.CheckName, filters and notes
// task.CheckText; a body must be UTF-8.
package api
