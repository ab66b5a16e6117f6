package ui

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// dlqPageSize is how many DLQ entries one page of the DLQ page reads.
const dlqPageSize = 100

// dlqView is the DLQ page.
type dlqView struct {
	Key      string
	Length   int64
	Entries  []dlq.Entry
	Scanned  int
	Next     string
	After    string
	Filter   redriveForm
	Preview  *dlq.BulkRedriveResult
	Shown    int    // ids of Preview listed
	IDs      string // every id of Preview, as the redrive form posts them
	MaxLimit int    // maxUIRedrive
	Error    string
	RedisErr string
}

// redriveForm is the filter of a bulk redrive as the forms carry it.
type redriveForm struct {
	Status, Kind, Error, Since, Until string
	Limit                             int
}

// maxFormBytes bounds the body of a form the dashboard posts.
const maxFormBytes = 1 << 20

// maxUIRedrive bounds the limit of a bulk redrive from the dashboard,
// below task.MaxRedriveLimit: the redrive that follows a dry run posts
// every id the dry run matched (37 bytes each), and a form's body is read
// up to maxFormBytes.
const maxUIRedrive = 20000

var uiRedriveLimit = task.Range{Field: "limit", Min: 1, Max: maxUIRedrive}

// readFilter reads a redriveForm from r's query or form values.
func readFilter(get func(string) string) (redriveForm, task.RedriveFilter, error) {
	f := redriveForm{Status: strings.ToUpper(strings.TrimSpace(get("status"))), Kind: strings.TrimSpace(get("kind")),
		Error: get("error"), Since: get("since"), Until: get("until"), Limit: task.DefaultRedriveLimit}
	if f.Status == "" {
		f.Status = string(task.Dead)
	}
	if v := strings.TrimSpace(get("limit")); v != "" {
		n, ferr := uiRedriveLimit.Parse(v)
		if ferr != nil {
			return f, task.RedriveFilter{}, ferr
		}
		f.Limit = int(n)
	}
	rf := task.RedriveFilter{Status: task.State(f.Status), Kind: f.Kind, ErrorContains: f.Error, Limit: f.Limit}
	var err error
	if rf.Since, err = parseTime(f.Since); err != nil {
		return f, rf, fmt.Errorf("since: %w", err)
	}
	if rf.Until, err = parseTime(f.Until); err != nil {
		return f, rf, fmt.Errorf("until: %w", err)
	}
	// ids: the tasks a dry run listed, which the redrive that follows it
	// acts on (and on no task that died since).
	for _, v := range strings.Fields(get("ids")) {
		id, err := uuid.Parse(v)
		if err != nil {
			return f, rf, fmt.Errorf("ids: %q is not a task id", clip(v, 64))
		}
		rf.IDs = append(rf.IDs, id)
	}
	if err := rf.Validate(); err != nil {
		return f, rf, err
	}
	return f, rf, nil
}

// joinIDs is ids separated by spaces, as the redrive form carries them.
func joinIDs(ids []uuid.UUID) string {
	var b strings.Builder
	b.Grow(len(ids) * 37)
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(id.String())
	}
	return b.String()
}

// query is the filter as URL query values.
func (f redriveForm) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"status": f.Status, "kind": f.Kind, "error": f.Error, "since": f.Since, "until": f.Until} {
		if v != "" {
			q.Set(k, v)
		}
	}
	q.Set("limit", strconv.Itoa(f.Limit))
	return q
}

func (h *Handler) dlqPage(w http.ResponseWriter, r *http.Request, v *view) {
	q := r.URL.Query()
	dv := &dlqView{Key: h.cfg.DLQKey, After: q.Get("after"), MaxLimit: maxUIRedrive}
	v.Title, v.Nav, v.D = "DLQ", "dlq", dv
	ctx := r.Context()
	form, f, ferr := readFilter(q.Get)
	dv.Filter = form
	code := http.StatusOK
	if ferr != nil {
		dv.Error, code = ferr.Error(), http.StatusBadRequest
	}
	if dv.After != "" && !dlq.ValidEntryID(dv.After) {
		dv.Error, code = fmt.Sprintf("after %q is not a DLQ entry id", dv.After), http.StatusBadRequest
		dv.After = ""
	}
	if ferr == nil && q.Get("preview") != "" {
		res, err := dlq.RedriveMatching(ctx, nil, "", h.cfg.Store, h.cfg.Actor, f, task.RedriveOptions{DryRun: true})
		if err != nil {
			h.internal(w, r, err)
			return
		}
		dv.Preview = &res
		dv.Shown = min(len(res.IDs), 100)
		dv.IDs = joinIDs(res.IDs)
	}
	if h.cfg.DLQKey != "" {
		// The listing: a page of entries, newest first, those matching
		// the kind and error filter shown.
		entries, err := dlq.List(ctx, h.cfg.Redis, h.cfg.DLQKey, dlq.ListParams{Count: dlqPageSize, Newest: true, After: dv.After})
		if err != nil {
			dv.RedisErr = h.problem(ctx, "Redis", err)
		}
		dv.Scanned = len(entries)
		for _, e := range entries {
			if (form.Kind == "" || e.Kind == form.Kind) && (form.Error == "" || strings.Contains(e.LastError, form.Error)) {
				dv.Entries = append(dv.Entries, e)
			}
		}
		if len(entries) == dlqPageSize {
			nq := form.query()
			nq.Set("after", entries[len(entries)-1].ID)
			dv.Next = Prefix + "dlq?" + nq.Encode()
		}
		if n, err := h.cfg.Redis.XLen(ctx, h.cfg.DLQKey).Result(); err == nil {
			dv.Length = n
		}
	}
	lq := form.query()
	if dv.After != "" {
		lq.Set("after", dv.After)
	}
	lq.Set("live", "1")
	v.Live = Prefix + "dlq?" + lq.Encode()
	h.render(w, r, code, "dlq", v)
}

// bulkRedrive redrives the tasks a filter selects and removes their DLQ
// entries: dlq.RedriveMatching, as POST /v1/tasks/redrive does.
func (h *Handler) bulkRedrive(w http.ResponseWriter, r *http.Request) {
	form, f, err := readFilter(r.PostFormValue)
	back := Prefix + "dlq?" + form.query().Encode()
	if err != nil {
		h.done(w, r, Prefix+"dlq", true, "%v", err)
		return
	}
	res, err := dlq.RedriveMatching(r.Context(), h.cfg.Redis, h.cfg.DLQKey, h.cfg.Store, h.cfg.Actor, f, task.RedriveOptions{})
	if err != nil && res.Redriven == 0 {
		h.internal(w, r, err) // nothing changed: an error page (503 when a database is unavailable)
		return
	}
	if err != nil {
		h.done(w, r, back, true, "Bulk redrive failed after %d of %d matched tasks were redriven: %s.", res.Redriven, res.Matched,
			h.problem(r.Context(), "PostgreSQL or Redis", err))
		return
	}
	h.done(w, r, back, false, "Matched %s, redrove %d, removed %s.", count1(res.Matched, "task", "tasks"), res.Redriven, count1(res.DLQRemoved, "DLQ entry", "DLQ entries"))
}

// replay redrives the task of one DLQ entry and removes the entry
// (dlq.Replay).
func (h *Handler) replay(w http.ResponseWriter, r *http.Request) {
	entry := strings.TrimSpace(r.PostFormValue("entry"))
	back := Prefix + "dlq"
	if h.cfg.DLQKey == "" {
		h.done(w, r, back, true, "No DLQ stream is configured.")
		return
	}
	if entry == "" {
		h.done(w, r, back, true, "No DLQ entry given.")
		return
	}
	res, err := dlq.Replay(r.Context(), h.cfg.Redis, h.cfg.DLQKey, h.cfg.Store, h.cfg.Actor, entry)
	if err != nil {
		h.internal(w, r, err)
		return
	}
	rr := res[0]
	switch rr.Outcome {
	case dlq.Replayed:
		h.done(w, r, back, false, "Entry %s replayed: task %s is %s again.", rr.EntryID, rr.TaskID, rr.Status)
	case dlq.NotDead:
		h.done(w, r, back, false, "Entry %s removed: its task is %s, not DEAD.", rr.EntryID, rr.Status)
	default:
		msg := string(rr.Outcome)
		if rr.Detail != "" {
			msg += ": " + rr.Detail
		}
		h.done(w, r, back, true, "Entry %s not replayed (%s).", rr.EntryID, msg)
	}
}

// discard removes one DLQ entry and leaves its task as it is (dlq.Discard).
func (h *Handler) discard(w http.ResponseWriter, r *http.Request) {
	entry := strings.TrimSpace(r.PostFormValue("entry"))
	back := Prefix + "dlq"
	switch {
	case h.cfg.DLQKey == "":
		h.done(w, r, back, true, "No DLQ stream is configured.")
		return
	case entry == "":
		h.done(w, r, back, true, "No DLQ entry given.")
		return
	case !confirmed(r):
		h.done(w, r, back, true, "Not discarded: tick the confirmation box first.")
		return
	}
	res, err := dlq.Discard(r.Context(), h.cfg.Redis, h.cfg.DLQKey, entry)
	if err != nil {
		h.internal(w, r, err)
		return
	}
	if d := res[0]; d.Removed {
		h.log.InfoContext(r.Context(), "DLQ entry discarded", "entry_id", d.EntryID, "task_id", d.TaskID, "actor", h.cfg.Actor)
		h.done(w, r, back, false, "Entry %s discarded; its task stays as it is.", d.EntryID)
		return
	}
	h.done(w, r, back, true, "Entry %s not found.", entry)
}

// kindsView is the kinds page.
type kindsView struct {
	Kinds    []task.KindInfo
	Periodic []maintenance.Slot
	// Blocked are the first blocked sequences (task.Store.BlockedSequences),
	// each linked to the DEAD task that holds it.
	Blocked []task.BlockedSequence
}

// blockedShown is how many blocked sequences the kinds page lists.
const blockedShown = 50

func (h *Handler) kinds(w http.ResponseWriter, r *http.Request, v *view) {
	ks, err := h.cfg.Store.Kinds(r.Context())
	if err != nil {
		h.internal(w, r, err)
		return
	}
	kv := &kindsView{Kinds: ks}
	for _, k := range ks {
		if k.BlockedSequences > 0 {
			if kv.Blocked, err = h.cfg.Store.BlockedSequences(r.Context(), "", blockedShown); err != nil {
				h.internal(w, r, err)
				return
			}
			break
		}
	}
	if h.cfg.Periodic != nil {
		kv.Periodic = h.cfg.Periodic(time.Now())
	}
	v.Title, v.Nav, v.Live, v.D = "Kinds", "kinds", Prefix+"kinds?live=1", kv
	// Its counts read the whole task table: refresh less often.
	v.Interval = "every " + KindsInterval.String()
	h.render(w, r, http.StatusOK, "kinds", v)
}

// setKind pauses, resumes or sets the limits of a kind
// (task.Store.SetKind).
func (h *Handler) setKind(w http.ResponseWriter, r *http.Request) {
	kind := r.PathValue("kind")
	back := Prefix + "kinds"
	var u task.KindUpdate
	var what string
	switch op := r.PostFormValue("op"); op {
	case "pause", "resume":
		p := op == "pause"
		u.Paused, what = &p, op+"d"
	case "limits":
		c, ferr := task.ConcurrencyRange.Parse(cmpOr(r.PostFormValue("concurrency"), "0"))
		if ferr != nil {
			h.done(w, r, back, true, "%s (0: no limit).", ferr.Msg)
			return
		}
		rate, err := task.ParseRate(strings.TrimSpace(cmpOr(r.PostFormValue("rate"), "0")))
		if err != nil {
			h.done(w, r, back, true, "Rate: %v", fieldMsg(err))
			return
		}
		n := int(c)
		u.Concurrency, u.Rate, what = &n, &rate, "limits set"
	default:
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("unknown operation %q (pause, resume or limits)", op))
		return
	}
	released, err := h.cfg.Store.SetKind(r.Context(), h.cfg.Actor, kind, u)
	var ferr *task.FieldError
	if errors.As(err, &ferr) {
		h.done(w, r, back, true, "%s", ferr.Msg)
		return
	}
	if err != nil {
		h.internal(w, r, err)
		return
	}
	h.done(w, r, back, false, "Kind %s %s; %d parked tasks released.", kind, what, released)
}

func cmpOr(v, def string) string {
	if strings.TrimSpace(v) == "" {
		return def
	}
	return v
}

// fieldMsg is a store error's message without its field prefix.
func fieldMsg(err error) string {
	var ferr *task.FieldError
	if errors.As(err, &ferr) {
		return ferr.Msg
	}
	return err.Error()
}
