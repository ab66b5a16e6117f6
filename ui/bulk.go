package ui

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/task"
)

// The tasks page's bulk actions: redrive, cancel or delete the tasks ticked
// on the page (POST /ui/tasks/bulk, fields id (repeated), action, confirm,
// reason, back). Each goes through the function its one-task action, the
// API and the CLI use (dlq.Redrive, task.Store.Cancel, dlq.Delete), so a
// bulk action refuses what they refuse, for the same reasons.

// bulkOutcome counts what a bulk action did with its tasks: how many it
// changed and, by reason, how many it refused.
type bulkOutcome struct {
	done    int
	refused map[string]int
	reasons []string // in the order first seen
}

// refuse counts a task refused for reason ("not found", "still running").
func (o *bulkOutcome) refuse(reason string) {
	if o.refused == nil {
		o.refused = map[string]int{}
	}
	if o.refused[reason] == 0 {
		o.reasons = append(o.reasons, reason)
	}
	o.refused[reason]++
}

// message says what happened: "2 tasks deleted; 1 refused: still running
// (only SUCCEEDED, DEAD and CANCELLED tasks can be deleted)", "0 tasks
// deleted; 3 refused: 2 still queued, 1 not found (...)". verb is the
// past participle ("deleted"); rule, said when some were refused for
// their state, is the rule that refused them.
func (o *bulkOutcome) message(verb, rule string) string {
	msg := count1(o.done, "task", "tasks") + " " + verb
	if len(o.reasons) == 0 {
		return msg + "."
	}
	n, parts, byState := 0, make([]string, len(o.reasons)), false
	for i, r := range o.reasons {
		n += o.refused[r]
		parts[i] = r
		if len(o.reasons) > 1 {
			parts[i] = fmt.Sprintf("%d %s", o.refused[r], r)
		}
		byState = byState || r != notFound
	}
	msg += fmt.Sprintf("; %d refused: %s", n, strings.Join(parts, ", "))
	if byState {
		msg += " (" + rule + ")"
	}
	return msg + "."
}

const notFound = "not found"

// bulkIDs reads the ticked task ids of a bulk action, each once: at most
// pageSize (the page they were ticked on), each a UUID. A bad or excess
// one is an error naming it (the form cannot send either).
func bulkIDs(r *http.Request) ([]uuid.UUID, error) {
	raw := r.PostForm["id"]
	if len(raw) > pageSize {
		return nil, fmt.Errorf("%d task ids in one request; at most %d (a page of the task list)", len(raw), pageSize)
	}
	ids := make([]uuid.UUID, 0, len(raw))
	seen := map[uuid.UUID]bool{}
	for _, v := range raw {
		id, err := uuid.Parse(v)
		if err != nil {
			return nil, fmt.Errorf("id %q is not a task id (a UUID)", clip(v, 100))
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// bulk runs a bulk action on the ticked tasks and goes back to the list it
// was sent from with a message that counts what was done and refused.
func (h *Handler) bulk(w http.ResponseWriter, r *http.Request) {
	back := Prefix + "tasks"
	if b := r.PostFormValue("back"); strings.HasPrefix(b, Prefix+"tasks") {
		back = b
	}
	action := r.PostFormValue("action")
	run := map[string]func(w http.ResponseWriter, r *http.Request, back string, ids []uuid.UUID){
		"redrive": h.bulkRedriveIDs, "cancel": h.bulkCancel, "delete": h.bulkDelete,
	}[action]
	if run == nil {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("action %q is not one of redrive, cancel, delete", clip(action, 100)))
		return
	}
	ids, err := bulkIDs(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	switch {
	case len(ids) == 0:
		h.done(w, r, back, true, "Nothing done: no task selected; tick the box of each task first.")
	case !confirmed(r):
		h.done(w, r, back, true, "Nothing done: tick the confirmation box first.")
	default:
		run(w, r, back, ids)
	}
}

// bulkRedriveIDs redrives the DEAD or CANCELLED tasks of ids and removes
// their DLQ entries (dlq.Redrive).
func (h *Handler) bulkRedriveIDs(w http.ResponseWriter, r *http.Request, back string, ids []uuid.UUID) {
	res, n, err := dlq.Redrive(r.Context(), h.cfg.Redis, h.cfg.DLQKey, h.cfg.Store, h.cfg.Actor, ids...)
	rerr := (*dlq.RemoveError)(nil)
	if err != nil && !errors.As(err, &rerr) {
		h.internal(w, r, err)
		return
	}
	var o bulkOutcome
	for _, rr := range res {
		switch {
		case rr.Applied:
			o.done++
		case rr.Status == "":
			o.refuse(notFound)
		default:
			o.refuse(strings.ToLower(string(rr.Status)))
		}
	}
	h.dlqDone(w, r, back, &o, o.message("redriven", "only DEAD and CANCELLED tasks can be redriven"), n, rerr,
		"replay them from the DLQ page to remove them")
}

// dlqDone ends a bulk redrive or delete: msg (o's message) and the n DLQ
// entries removed, or, when their removal failed (rerr), what to do about
// them (remedy).
func (h *Handler) dlqDone(w http.ResponseWriter, r *http.Request, back string, o *bulkOutcome, msg string, n int, rerr *dlq.RemoveError, remedy string) {
	if rerr != nil {
		h.log.ErrorContext(r.Context(), "ui bulk action: DLQ entries not removed", "err", rerr)
		h.done(w, r, back, true, "%s Their DLQ entries were not removed (see the server's log); %s.", msg, remedy)
		return
	}
	h.done(w, r, back, len(o.reasons) > 0, "%s %s removed.", msg, count1(n, "DLQ entry", "DLQ entries"))
}

// bulkCancel cancels each task of ids (task.Store.Cancel), with the
// form's reason.
func (h *Handler) bulkCancel(w http.ResponseWriter, r *http.Request, back string, ids []uuid.UUID) {
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	var o bulkOutcome
	running := 0
	for _, id := range ids {
		res, err := h.cfg.Store.Cancel(r.Context(), h.cfg.Actor, reason, id)
		if errors.Is(err, task.ErrNotFound) {
			o.refuse(notFound)
			continue
		}
		if ferr := (*task.FieldError)(nil); errors.As(err, &ferr) {
			// The reason (the same for every task): nothing was cancelled
			// with it, the tasks before this one included.
			h.done(w, r, back, true, "%s", ferr.Msg)
			return
		}
		if err != nil {
			h.internal(w, r, err)
			return
		}
		switch res.Outcome {
		case task.CancelDone:
			o.done++
		case task.CancelRequested:
			o.done++
			running++
		default:
			o.refuse("already " + strings.ToLower(string(res.Task.Status)))
		}
	}
	msg := o.message("cancelled", "only QUEUED, RETRYING and RUNNING tasks can be cancelled")
	if running > 0 {
		msg += fmt.Sprintf(" %s RUNNING: cancel requested, each ends CANCELLED when its handler returns.", count1(running, "was", "were"))
	}
	h.done(w, r, back, len(o.reasons) > 0, "%s", msg)
}

// bulkDelete deletes the finished tasks of ids with their history and DLQ
// entries (dlq.Delete), each logged with the actor and counted.
func (h *Handler) bulkDelete(w http.ResponseWriter, r *http.Request, back string, ids []uuid.UUID) {
	res, n, err := dlq.Delete(r.Context(), h.cfg.Redis, h.cfg.DLQKey, h.cfg.Store, ids...)
	rerr := (*dlq.RemoveError)(nil)
	if err != nil && !errors.As(err, &rerr) {
		h.internal(w, r, err)
		return
	}
	var o bulkOutcome
	for _, d := range res {
		if !d.Deleted {
			o.refuse("still " + strings.ToLower(string(d.Status)))
			continue
		}
		o.done++
		h.deleted.Inc()
		h.log.InfoContext(r.Context(), "task deleted", "task_id", d.ID, "status", d.Status, "actor", h.cfg.Actor)
	}
	for range len(ids) - len(res) { // an unknown id has no result
		o.refuse(notFound)
	}
	h.dlqDone(w, r, back, &o, o.message("deleted", "only SUCCEEDED, DEAD and CANCELLED tasks can be deleted"), n, rerr,
		"discard them from the DLQ page")
}
