package ingest

import (
	"strconv"
	"time"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// The settling of messages: acknowledged or deferred through the
// transport, or dead-lettered (with a retry while the DLQ write fails),
// each counted under its result; a settled message leaves the in-flight
// set and gives back its slot if it still holds one (a run gave its slot
// back when its handler returned; see inflight).

// letter is an entry to dead-letter.
type letter struct {
	d      delivery
	entry  dlq.Entry
	result string // metric result: dead or poison
}

// settle acknowledges acks and defers later through the transport, then
// ends the handling of ds, counting each under its result in metric.
//
// A deferred entry leaves the in-flight set before the transport makes it
// claimable: the reclaimer may hand it back at once (a retry due now), and
// a redelivery of an entry still in flight here is ignored, so it would
// wait a whole reclaim idle time. Acknowledged entries leave it after the
// XACK, so a redelivery in between is still ignored. Once deferred, an
// entry is also kept for the worker's own redelivery at its time
// (redeliver.go), where the transport leaves it pending here.
func (p *processor) settle(acks []string, later []deferral, ds []delivery, metric map[string]string) {
	p.settleMu.Lock()
	defer p.settleMu.Unlock()
	rest, freed := ds, 0
	var first []delivery
	var deferred map[string]time.Time // the deferred entries' times
	if len(later) > 0 {
		deferred = make(map[string]time.Time, len(later))
		for _, l := range later {
			deferred[l.id] = l.at
		}
		rest = make([]delivery, 0, len(ds))
		for _, d := range ds {
			if _, ok := deferred[d.id]; ok {
				first = append(first, d)
			} else {
				rest = append(rest, d)
			}
		}
		freed = p.inflight.forget(first...)
	}
	if err := p.tr.settle(p.ioCtx, acks, later); err != nil {
		p.log.Warn("acknowledge / defer entries failed; they are delivered again later", "err", err)
	} else if p.redeliverer != nil {
		now := time.Now()
		for _, d := range first {
			p.redeliverer.add(d, deferred[d.id], now)
		}
	}
	for _, d := range ds {
		p.met.observe(metric[d.id], d.received)
	}
	p.inflight.freeSlotCount(freed) // the deferred ones' slots
	p.inflight.settled(rest...)
}

// poison returns the letter of d, a message that names no task (reason).
func (p *processor) poison(d delivery, kind, reason string, now time.Time) letter {
	p.log.Warn("entry of no task: dead-lettering it", "message_id", d.id, "err", reason)
	return letter{d: d, result: resultPoison, entry: dlq.Entry{
		TaskID:    stream.Truncate(d.rawTaskID, 200),
		Kind:      stream.Truncate(kind, 200),
		LastError: reason,
		SourceID:  d.id,
		DeadAt:    now,
	}}
}

// taskLetter returns the letter of d, the message of t, a DEAD task.
func taskLetter(d delivery, t *task.Task, result string, now time.Time) letter {
	e := dlq.Entry{
		TaskID:       t.ID.String(),
		Kind:         t.Kind,
		AttemptCount: t.AttemptCount,
		LastError:    t.LastError,
		SourceID:     d.id,
		DeadAt:       now,
	}
	if t.FinishedAt != nil {
		e.DeadAt = *t.FinishedAt
		e.Death = t.ID.String() + ":" + strconv.FormatInt(t.FinishedAt.UnixMicro(), 10)
	}
	return letter{d: d, result: result, entry: e}
}

// deadLetter writes letters to the DLQ (each with its ack, atomically). A
// write that fails keeps its entry here, pending and kept fresh by the
// heartbeat, and is retried until it succeeds or the worker stops.
//
// A retried entry gives back its handler slot at once, if it still holds
// one (a broken DLQ must not stall healthy tasks), but stays in the
// in-flight set, so a redelivery of it is ignored.
func (p *processor) deadLetter(letters []letter) {
	for _, l := range letters {
		if err := p.writeLetter(l); err != nil {
			p.log.Error("dead-letter failed; the entry stays pending and the write is retried",
				"task_id", l.entry.TaskID, "message_id", l.d.id, "err", err)
			p.inflight.freeSlots(l.d)
			p.retries.Add(1)
			go p.retryLetter(l)
			continue
		}
		p.inflight.settled(l.d)
	}
}

// writeLetter runs the DLQ script for l and counts it.
func (p *processor) writeLetter(l letter) error {
	written, err := p.tr.deadLetter(p.ioCtx, l.entry)
	if err != nil {
		return err
	}
	if written {
		p.met.dlq.Inc()
	}
	p.met.observe(l.result, l.d.received)
	return nil
}

func (p *processor) retryLetter(l letter) {
	defer p.retries.Done()
	delay := 200 * time.Millisecond
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-p.ioCtx.Done():
			p.log.Error("worker stopped before the dead-letter could be written; the entry stays pending",
				"task_id", l.entry.TaskID, "message_id", l.d.id)
			p.inflight.forget(l.d)
			return
		case <-t.C:
		}
		err := p.writeLetter(l)
		if err == nil {
			p.inflight.forget(l.d)
			p.log.Info("dead-letter written after retrying", "task_id", l.entry.TaskID, "message_id", l.d.id)
			return
		}
		p.log.Debug("dead-letter retry failed", "task_id", l.entry.TaskID, "message_id", l.d.id, "err", err)
		delay = min(2*delay, 5*time.Second)
		t.Reset(delay)
	}
}
