package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// progressInterval is the least time between two progress writes of one
// run (Task.ReportProgress).
const progressInterval = time.Second

// progressWriteTimeout bounds one progress write.
const progressWriteTimeout = 10 * time.Second

// progressReporter writes the progress reports of one run
// (Task.ReportProgress): at most one write per progressInterval, the
// latest report winning, each fenced by the run's attempt and lease
// (task.Store.SetProgress), off the handler's goroutine.
type progressReporter struct {
	ctx   context.Context // the worker's I/O context
	store *task.Store
	log   *slog.Logger
	owner string

	mu      sync.Mutex
	pending *task.ProgressReport // the latest report not yet written
	last    time.Time            // when the latest write began
	timer   *time.Timer          // the next write, when one is scheduled
	writing bool
	done    bool          // the run ended: nothing more is written
	idle    chan struct{} // closed when a write ends (under mu: writing false)
}

func newProgressReporter(ctx context.Context, store *task.Store, log *slog.Logger, owner string) *progressReporter {
	return &progressReporter{ctx: ctx, store: store, log: log, owner: owner}
}

// report takes a checked report: written now when the last write is a
// second old, else when it is.
func (p *progressReporter) report(r task.ProgressReport) {
	r.Owner = p.owner
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.pending = &r
	if p.writing || p.timer != nil {
		return // the write in flight, or the scheduled one, takes it
	}
	p.scheduleLocked()
}

// scheduleLocked starts the write of the pending report, now or once the
// last write is progressInterval old.
func (p *progressReporter) scheduleLocked() {
	if wait := time.Until(p.last.Add(progressInterval)); wait > 0 {
		p.timer = time.AfterFunc(wait, p.flush)
		return
	}
	p.startWriteLocked()
}

// startWriteLocked writes the pending report on a goroutine of its own.
func (p *progressReporter) startWriteLocked() {
	r := *p.pending
	p.pending, p.writing, p.last = nil, true, time.Now()
	p.idle = make(chan struct{})
	go func() {
		p.write(r)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.writing = false
		close(p.idle)
		if p.pending != nil && !p.done {
			p.scheduleLocked()
		}
	}()
}

// flush is the scheduled write.
func (p *progressReporter) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timer = nil
	if p.done || p.pending == nil || p.writing {
		return
	}
	p.startWriteLocked()
}

// write writes r; a stale run's report is refused by the fence and only
// logged at debug level.
func (p *progressReporter) write(r task.ProgressReport) {
	ctx, cancel := context.WithTimeout(p.ctx, progressWriteTimeout)
	defer cancel()
	err := p.store.SetProgress(ctx, r)
	switch {
	case err == nil:
	case errors.Is(err, task.ErrStaleAttempt) || errors.Is(err, task.ErrNotFound):
		p.log.Debug("progress not written: the run is no longer current", "task_id", r.ID, "attempt", r.Attempt)
	default:
		p.log.Warn("progress not written", "task_id", r.ID, "attempt", r.Attempt, "err", err)
	}
}

// finish ends the run's reporting once its handler returned: later
// reports are dropped, a write in flight is waited for, and with
// writeLast the report not yet written is written now (a successful
// run's last progress stays with the task).
func (p *progressReporter) finish(writeLast bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.done = true
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	idle, writing, pending := p.idle, p.writing, p.pending
	p.pending = nil
	p.mu.Unlock()
	if writing {
		<-idle
	}
	if writeLast && pending != nil {
		p.write(*pending)
	}
}
