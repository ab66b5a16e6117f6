package ingest

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/task"
)

// The cancel listener's reconnect backoff (capped, jittered, doubling).
const (
	cancelListenRetryMin = 100 * time.Millisecond
	cancelListenRetryMax = 10 * time.Second
)

// startCancelListener runs the cancel listener until the worker's I/O
// stops (unless Config.CancelListenDisabled); shutdown waits for it.
func (h *heartbeater) startCancelListener() {
	if !h.listen {
		return
	}
	h.listener.Add(1)
	go func() {
		defer h.listener.Done()
		h.runCancelListener(h.ioCtx)
	}()
}

// runCancelListener LISTENs for cancel requests (task.Store.ListenCancels)
// and cancels the handlers of the tasks named that run here, until ctx is
// cancelled. A lost connection is re-established with backoff; requests
// made meanwhile reach the handlers at the next lease renewal (the
// heartbeat), within TaskLease/3.
func (h *heartbeater) runCancelListener(ctx context.Context) {
	redial := pgsession.Redial{Min: cancelListenRetryMin, Max: cancelListenRetryMax}
	connects := 0
	for {
		err := h.store.ListenCancels(ctx, func() {
			redial.Connected()
			if connects++; connects > 1 {
				h.log.Info("cancel LISTEN connection re-established")
			}
		}, func(id uuid.UUID) { h.cancelRun(id, "notification") })
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, pgsession.ErrNone) {
			h.log.Info("cancel requests are not LISTENed for (no PostgreSQL session: the database URL goes through a transaction pooler and no direct listen URL is set); running tasks are cancelled at their next lease renewal")
			return
		}
		if errors.Is(err, task.ErrNoListen) {
			h.log.Warn("cannot LISTEN for cancel requests; running tasks are cancelled at their next lease renewal", "err", err)
			return
		}
		wait := redial.Pause()
		h.log.Warn("cancel LISTEN connection lost; cancel requests reach handlers at the next lease renewal until it is back", "err", err, "retry_in", wait)
		if !pgsession.Sleep(ctx, wait) {
			return
		}
	}
}

// cancelRun cancels the handler of task id, with cause ErrCancelled, if it
// runs here and has not returned; via names how the request arrived. The
// run's completion then writes CANCELLED (the request is in the row).
func (h *heartbeater) cancelRun(id uuid.UUID, via string) {
	h.inflight.cancelled(id, func(mid string, r *run) {
		r.cancel(ErrCancelled)
		h.log.Info("task cancelled by an operator; cancelling its handler", "task_id", id, "message_id", mid, "attempt", r.task.Attempt, "via", via)
	})
}
