// Package ui owns the web dashboard of an ingest-worker process: the HTML
// pages under /ui/ (overview, tasks, one task, DLQ, kinds), their actions
// (cancel, redrive, bulk redrive with a dry run, run now, delete, the task
// list's bulk redrive, cancel and delete of ticked tasks, DLQ discard,
// pause, resume, kind limits), the login and CSRF protection in front of them, the SVG charts,
// and the static assets, all embedded in the binary (no CDN).
//
// Pages are Go html/template, rendered on the server (auto-escaped: task
// payloads and errors are shown as text; every control and bidirectional
// character of a rendered page, which can only come from data, is shown as
// its escape by termsafe.Text). The only script is htmx
// (static/htmx.min.js, vendored from npm, see static/VENDORED.md): a page's
// live part reloads itself every 2 s, the kinds page's every 10 s
// (hx-trigger="every 2s"; the same handler with ?live=1 renders just that
// part). Actions are plain HTML
// forms answered with a redirect (post/redirect/get), so they work without
// script too.
//
// Routes (Handler serves them; `ingest-worker run` and `ingest-worker ui`
// mount it at /ui/):
//
//	GET  /ui/                          overview
//	GET  /ui/tasks                     tasks: ?status= (a state, or scheduled)&kind=&q= (id or idempotency key)&since=&until=&workflow= (a pipeline's root task id)&cursor=&select=all
//	POST /ui/tasks/bulk                redrive, cancel or delete the ticked tasks (action=, id= up to a page's 50)
//	GET  /ui/tasks/{id}                one task: row, audit timeline, outbox rows, PEL entry, DLQ entries, its pipeline (workflow, dependency graph)
//	POST /ui/tasks/{id}/cancel         cancel it
//	POST /ui/tasks/{id}/redrive        redrive it (DEAD or CANCELLED) and remove its DLQ entries
//	POST /ui/tasks/{id}/delete         delete it (SUCCEEDED, DEAD or CANCELLED) with its history and DLQ entries
//	POST /ui/tasks/{id}/run            make it due now (QUEUED or RETRYING, due later, not parked)
//	GET  /ui/dlq                       DLQ entries (?kind=&error=); ?preview=1 dry-runs a bulk redrive
//	POST /ui/dlq/redrive               bulk redrive by filter (dlq.RedriveMatching)
//	POST /ui/dlq/replay                redrive one DLQ entry (dlq.Replay)
//	POST /ui/dlq/discard               remove one DLQ entry, its task left DEAD (dlq.Discard)
//	GET  /ui/kinds                     kinds with settings, counts and next periodic slots
//	POST /ui/kinds/{kind}              pause, resume, concurrency and rate limits (task.Store.SetKind)
//	GET  /ui/login, POST /ui/login     the token form (only with a token configured)
//	POST /ui/logout                    end the session (on the server) and forget its cookie
//	GET  /ui/static/...                embedded assets
//
// With Config.Token set, every page but the login form and the assets
// needs a session: the token is asked once and a session cookie (HttpOnly,
// SameSite=Strict, an HMAC keyed by the token, valid SessionTTL) is set;
// the token is compared in constant time. The session is kept in
// PostgreSQL (ingest_ui_session, session.go) as well: a logout deletes it,
// so its cookie is refused from then on by every process on the database. Every POST needs the CSRF token
// of the page (a hidden field equal to an HttpOnly cookie, compared in
// constant time). Cancel, delete, run now, discard and the task list's
// bulk actions also need their form's confirmation box ticked
// (confirm=yes; the box is required in the form, and the handler refuses
// without it): the page's CSP allows no inline script for a confirm()
// dialog. A bulk action (bulk.go) goes through the function of its
// one-task action (dlq.Redrive, task.Store.Cancel, dlq.Delete) and reports
// how many tasks it changed and how many it refused, by reason; the
// ticked boxes survive the list's live reloads (hx-preserve). A delete is logged with the actor and
// counted (ingest_task_deleted_total, via="ui", on Config.Registerer). Every request but GET, HEAD and OPTIONS that a browser
// sent on behalf of another site (Sec-Fetch-Site, Origin:
// httpguard.CrossSite) is refused with 403 before routing, login included.
// A request that needs PostgreSQL or Redis while it cannot be reached
// answers a "database unavailable" page (503, Retry-After); no page shows an
// error's text, which may name the database's user, host and port. With
// Config.ReadOnly the pages have no action buttons and every action POST is
// refused with 403.
package ui
