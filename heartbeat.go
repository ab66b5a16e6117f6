package ingest

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// runHeartbeat runs heartbeatOnce every TaskLease/3 until stop is closed,
// then waits for a refresh of idle times still under way.
func (p *processor) runHeartbeat(stop <-chan struct{}) {
	t := time.NewTicker(p.cfg.TaskLease / 3)
	defer t.Stop()
	defer p.touches.Wait()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			p.heartbeatOnce(p.ioCtx)
		}
	}
}

// heartbeatOnce renews the leases of all running tasks in one store call,
// cancels the handlers whose lease was lost or whose task an operator
// cancelled, and resets the idle time of
// their entries (and of entries held for a DLQ retry) with one XCLAIM
// JUSTID, so no reclaimer takes them.
//
// The lease renewal (Postgres) does not wait for Redis: a frozen or slow
// Redis must not let the leases of running tasks expire, which would hand
// them to another worker and run them twice.
func (p *processor) heartbeatOnce(ctx context.Context) {
	ids := p.inflight.leased()
	touch := p.inflight.held()
	if len(ids) > 0 {
		renewed, cancel, err := p.store.Renew(ctx, p.cfg.Consumer, p.cfg.TaskLease, ids...)
		if err != nil {
			// Keep the entries fresh anyway: the handlers still run here.
			p.log.Warn("renew task leases failed", "count", len(ids), "err", err)
			renewed = ids
		}
		ok := make(map[uuid.UUID]bool, len(renewed))
		for _, id := range renewed {
			ok[id] = true
		}
		touch = append(touch, p.inflight.renewed(ids, ok, func(mid string, r *run) {
			r.cancel(errLeaseLost)
			p.log.Warn("task lease lost; cancelling its handler", "task_id", r.task.ID, "message_id", mid, "attempt", r.task.Attempt)
		})...)
		// A cancel whose NOTIFY this process missed (listener down).
		for _, id := range cancel {
			p.cancelRun(id, "lease renewal")
		}
	}
	// The idle-time refresh runs on its own goroutine (one at a time): a
	// Redis that hangs, even past the call's deadline, must not delay the
	// next lease renewal.
	if p.touching.CompareAndSwap(false, true) {
		p.touches.Add(1)
		go func() {
			defer p.touches.Done()
			defer p.touching.Store(false)
			p.touch(ctx, touch)
		}()
	}
}

// touch resets the idle time of entries still handled here. It holds
// settleMu, so it never overwrites the idle time an entry was settled with
// (entries settled since the caller listed them are skipped), and gives up
// after a third of the lease so the next renewal is not delayed by Redis.
func (p *processor) touch(ctx context.Context, ids []string) {
	p.settleMu.Lock()
	defer p.settleMu.Unlock()
	live := p.inflight.live(ids)
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.TaskLease/3)
	defer cancel()
	if err := p.tr.touch(ctx, live); err != nil {
		p.log.Warn("refresh idle time of running entries failed", "count", len(live), "err", err)
	}
}
