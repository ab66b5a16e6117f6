package ingest

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// heartbeater keeps the runs of a worker alive and reachable: every
// TaskLease/3 it renews their leases in Postgres and refreshes the idle
// time of their entries through the transport, and it carries cancel
// requests (the LISTEN loop, and those the renewal reports) to the runs'
// handlers. It reads what runs from inflight and owns its goroutines.
type heartbeater struct {
	store    *task.Store
	tr       transport
	inflight *inflight
	log      *slog.Logger
	owner    string        // the worker's consumer name, the lease owner
	lease    time.Duration // Config.TaskLease
	// listen is false under Config.CancelListenDisabled.
	listen bool
	// ioCtx carries all its I/O; cancelled last at shutdown.
	ioCtx context.Context
	// settleMu is the processor's: it serialises the refresh of idle times
	// with the settling of entries (see touch).
	settleMu *sync.Mutex
	// touching is set while an idle-time refresh runs (touches tracks it
	// for stop).
	touching atomic.Bool
	touches  sync.WaitGroup
	// skipBeat, when set (by this package's tests, before start), skips
	// the beats for which it reports true.
	skipBeat func() bool
	// listener tracks the LISTEN loop for cancel requests (cancel.go).
	listener   sync.WaitGroup
	stop, done chan struct{}
}

// newHeartbeater returns the heartbeater of a worker configured by cfg.
func newHeartbeater(ioCtx context.Context, cfg Config, store *task.Store, tr transport, f *inflight, settleMu *sync.Mutex, log *slog.Logger) *heartbeater {
	return &heartbeater{
		store: store, tr: tr, inflight: f, log: log, owner: cfg.Consumer, lease: cfg.TaskLease,
		listen: !cfg.CancelListenDisabled, ioCtx: ioCtx, settleMu: settleMu,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// start runs the heartbeat until stopBeating, and the cancel listener until
// the worker's I/O stops.
func (h *heartbeater) start() {
	go func() {
		defer close(h.done)
		h.run(h.stop)
	}()
	h.startCancelListener()
}

// stopBeating stops the heartbeat and waits for it (the cancel listener
// runs on until the worker's I/O stops; see waitListener).
func (h *heartbeater) stopBeating() {
	close(h.stop)
	<-h.done
}

// waitListener waits for the cancel listener to return.
func (h *heartbeater) waitListener() { h.listener.Wait() }

// run runs heartbeatOnce every TaskLease/3 until stop is closed, then
// waits for a refresh of idle times still under way.
func (h *heartbeater) run(stop <-chan struct{}) {
	t := time.NewTicker(h.lease / 3)
	defer t.Stop()
	defer h.touches.Wait()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if h.skipBeat == nil || !h.skipBeat() {
				h.heartbeatOnce(h.ioCtx)
			}
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
func (h *heartbeater) heartbeatOnce(ctx context.Context) {
	ids := h.inflight.leased()
	touch := h.inflight.held()
	if len(ids) > 0 {
		at := time.Now()
		renewed, cancel, err := h.store.Renew(ctx, h.owner, h.lease, ids...)
		if err != nil {
			// Keep the entries fresh anyway: the handlers still run here.
			h.log.Warn("renew task leases failed", "count", len(ids), "err", err)
			renewed, at = ids, time.Time{}
		}
		ok := make(map[uuid.UUID]bool, len(renewed))
		for _, id := range renewed {
			ok[id] = true
		}
		touch = append(touch, h.inflight.renewed(ids, ok, at, func(mid string, r *run) {
			r.cancel(errLeaseLost)
			h.log.Warn("task lease lost; cancelling its handler", "task_id", r.task.ID, "message_id", mid, "attempt", r.task.Attempt)
		})...)
		// A cancel whose NOTIFY this process missed (listener down).
		for _, id := range cancel {
			h.cancelRun(id, "lease renewal")
		}
	}
	// The idle-time refresh runs on its own goroutine (one at a time): a
	// Redis that hangs, even past the call's deadline, must not delay the
	// next lease renewal.
	if h.touching.CompareAndSwap(false, true) {
		h.touches.Add(1)
		go func() {
			defer h.touches.Done()
			defer h.touching.Store(false)
			h.touch(ctx, touch)
		}()
	}
}

// touch resets the idle time of entries still handled here. It holds
// settleMu, so it never overwrites the idle time an entry was settled with
// (entries settled since the caller listed them are skipped), and gives up
// after a third of the lease so the next renewal is not delayed by Redis.
func (h *heartbeater) touch(ctx context.Context, ids []string) {
	h.settleMu.Lock()
	defer h.settleMu.Unlock()
	live := h.inflight.live(ids)
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.lease/3)
	defer cancel()
	if err := h.tr.touch(ctx, live); err != nil {
		h.log.Warn("refresh idle time of running entries failed", "count", len(live), "err", err)
	}
}
