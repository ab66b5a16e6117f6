package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/task"
)

// The start of a read: the processor starts the tasks of one read in one
// store call (admission applies the kinds' pauses and limits), then
// dispatches each started task to a handler slot and settles every other
// entry by its start outcome (docs/ARCHITECTURE.md §2.3). A limited kind's
// message takes a handler slot before its start, or waits for one
// unstarted (startHeld).

// startRetryDelay is when an entry whose start failed (Postgres
// unreachable) becomes claimable again.
const startRetryDelay = 5 * time.Second

// startHeld starts the tasks of ds, messages of limited kinds that waited
// for a handler slot and now hold one each (inflight.handlerDone), in
// one start.
func (p *processor) startHeld(ds []delivery) {
	held := make(map[string]bool, len(ds))
	for _, d := range ds {
		held[d.id] = true
	}
	p.start(ds, held)
	for range ds {
		p.work.Done()
	}
}

// holdLimited gives the messages of limited kinds among valid a handler
// slot each before their start (marked in held, made when nil): a limited
// kind's task is started only to run, never to wait, so its starts and
// runs count against its limits only while it runs. Those for which no
// slot is free wait for one unstarted (startHeld), or are handed back
// while draining. It returns the messages to start now, and held.
func (p *processor) holdLimited(valid []delivery, limits map[string]task.Limits, held map[string]bool) ([]delivery, map[string]bool) {
	kept := valid[:0]
	var back []delivery
	for _, d := range valid {
		if !limits[d.kind].Limited() || held[d.id] {
			kept = append(kept, d)
			continue
		}
		p.work.Add(1) // for startHeld, should d wait
		switch now, queued := p.inflight.holdFor(d); {
		case now:
			p.work.Done()
			if held == nil {
				held = map[string]bool{}
			}
			held[d.id] = true
			kept = append(kept, d)
		case !queued:
			p.work.Done()
			back = append(back, d)
		}
	}
	if len(back) > 0 {
		p.handBackHeld(p.ioCtx, back)
	}
	return kept, held
}

// handBackHeld hands back ds, messages in flight here that are not
// started, and ends their handling.
func (p *processor) handBackHeld(ctx context.Context, ds []delivery) {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.id
	}
	p.handBack(ctx, ids)
	p.inflight.settled(ds...)
}

// start starts the tasks of one read in one store call and settles or
// dispatches each entry. held marks the messages that hold a handler slot
// (nil: none); a slot not used by a run is given back.
func (p *processor) start(batch []delivery, held map[string]bool) {
	ctx := p.ioCtx
	var (
		acks    []string
		later   []deferral
		letters []letter
		settle  []delivery // settled after the transport calls below
		valid   = make([]delivery, 0, len(batch))
		metric  = make(map[string]string, len(batch)) // entry id → result
	)
	now := time.Now()
	for _, d := range batch {
		switch {
		case d.deleted:
			// Its data is gone; the rescuer republishes the task from
			// Postgres if it still has to run.
			p.log.Info("pending entry was deleted from the stream; acknowledging it", "message_id", d.id)
			acks, settle = append(acks, d.id), append(settle, d)
			metric[d.id] = resultSkipped
		case d.err != nil:
			letters = append(letters, p.poison(d, d.kind, d.err.Error(), now))
		default:
			valid = append(valid, d)
		}
	}
	// Tasks of a paused kind are parked, not started: their entries are
	// acknowledged and a resume publishes them again.
	limits := p.admission.limits(ctx)
	if parked := p.admission.parkPaused(ctx, valid, limits); len(parked) > 0 {
		kept := valid[:0]
		for _, d := range valid {
			if parked[d.taskID] {
				acks, settle = append(acks, d.id), append(settle, d)
				metric[d.id] = resultPaused
				continue
			}
			kept = append(kept, d)
		}
		valid = kept
	}
	valid, held = p.holdLimited(valid, limits, held)
	defer func() {
		for range held { // the slots no run took
			p.inflight.handlerDone()
		}
	}()
	ids := make([]uuid.UUID, len(valid))
	for i, d := range valid {
		ids[i] = d.taskID
	}
	var results map[uuid.UUID]task.StartResult
	if len(ids) > 0 {
		res, err := p.admission.start(ctx, valid, ids, limits)
		if err != nil {
			p.log.Error("start tasks failed; their entries come back later", "count", len(ids), "err", err)
			for _, d := range valid {
				later = append(later, deferral{id: d.id, taskID: d.taskID, at: now.Add(startRetryDelay), unrecorded: true})
				settle = append(settle, d)
			}
			valid = nil
		}
		results = make(map[uuid.UUID]task.StartResult, len(res))
		for _, r := range res {
			results[r.ID] = r
		}
	}
	seen := map[uuid.UUID]bool{}
	for _, d := range valid {
		id := d.taskID
		r := results[id]
		dup := seen[id]
		seen[id] = true
		// log is the entry's logger, made only for the outcomes that log.
		log := func() *slog.Logger { return p.log.With("task_id", id, "message_id", d.id) }
		if dup && (r.Outcome == task.Started || r.Outcome == task.TakenOver || r.Outcome == task.DiedOnTakeover) {
			// Another entry of this read runs (or buried) the task.
			log().Debug("duplicate entry of a task started by this read; acknowledging it")
			acks, settle = append(acks, d.id), append(settle, d)
			metric[d.id] = resultSkipped
			continue
		}
		switch r.Outcome {
		case task.Started:
			p.dispatch(d, r.Task, held, now)
			continue
		case task.TakenOver:
			log().Info("took over a task whose lease expired; the abandoned run counted as a failure", "attempt", r.Task.AttemptCount+1,
				traceAttr(tracing.SpanContext(r.Task.Traceparent).TraceID().String()))
			p.dispatch(d, r.Task, held, now)
			continue
		case task.DiedOnTakeover:
			log().Warn("took over a task whose lease expired on its last attempt: DEAD", "attempt", r.Task.AttemptCount,
				traceAttr(tracing.SpanContext(r.Task.Traceparent).TraceID().String()))
			letters = append(letters, taskLetter(d, r.Task, resultDead, now))
			continue
		case task.Finished, task.CancelledOnTakeover:
			if r.Task.Status == task.Dead {
				// A redelivery after a crash between the DEAD commit and
				// the DLQ write, or a duplicate entry: the DLQ gets this
				// death once.
				log().Debug("task already DEAD; making sure its death is dead-lettered")
				letters = append(letters, taskLetter(d, r.Task, resultSkipped, now))
				continue
			}
			log().Debug("task already finished; acknowledging duplicate delivery", "to", r.Task.Status)
			acks = append(acks, d.id)
			metric[d.id] = resultSkipped
		case task.LeaseHeld:
			if p.runsHere(r.Task) {
				log().Debug("duplicate entry of a task running here; acknowledging it")
				acks = append(acks, d.id)
			} else {
				// Another worker holds a live lease: look again when it expires.
				later = append(later, deferral{id: d.id, taskID: id, at: timeOr(r.Task.LeaseUntil, now)})
			}
			metric[d.id] = resultSkipped
		case task.ParkedAtLimit:
			log().Debug("task parked (its kind is at a limit); acknowledging its entry")
			acks = append(acks, d.id)
			metric[d.id] = resultThrottled
		case task.Throttled:
			later = append(later, deferral{id: d.id, taskID: id, at: now.Add(throttleRetry)})
			metric[d.id] = resultThrottled
		case task.Parked:
			log().Debug("task parked (its kind is paused or at a limit); acknowledging its entry")
			acks = append(acks, d.id)
			metric[d.id] = resultPaused
		case task.Held:
			log().Debug("task held by its dependencies; acknowledging its entry (their end publishes it)")
			acks = append(acks, d.id)
			metric[d.id] = resultSkipped
		case task.NotDue:
			later = append(later, deferral{id: d.id, taskID: id, at: timeOr(r.Task.NextRetryAt, now)})
			metric[d.id] = resultNotDue
		default: // NotFound
			letters = append(letters, p.poison(d, d.kind,
				fmt.Sprintf("unknown task: no task %s in Postgres", id), now))
			continue
		}
		settle = append(settle, d)
	}
	p.settle(acks, later, settle, metric)
	p.deadLetter(letters)
}

// timeOr returns *t, or now when t is nil.
func timeOr(t *time.Time, now time.Time) time.Time {
	if t == nil {
		return now
	}
	return *t
}

// runsHere reports whether t is RUNNING under this worker's lease for a
// run of another entry.
func (p *processor) runsHere(t *task.Task) bool {
	return t.Status == task.Running && t.LeaseOwner == p.cfg.Consumer && p.inflight.runs(t.ID)
}
