package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/pgsession"
)

// listenSQL subscribes the listener connection to the trigger's channel.
var listenSQL = "LISTEN " + pgx.Identifier{NotifyChannel}.Sanitize()

// listen holds a dedicated connection that LISTENs on NotifyChannel and
// nudges wake on every notification, until ctx is cancelled. A lost
// connection is re-established with capped, jittered exponential backoff;
// Run keeps polling meanwhile, and every (re)connect nudges wake once, since
// notifications sent while it was down are lost.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	if !r.cfg.Listen.Enabled() {
		r.logger.Info("outbox relay does not LISTEN (no PostgreSQL session: the database URL goes through a transaction pooler and no direct listen URL is set); polling", "interval", r.cfg.PublishInterval)
		return
	}
	redial := pgsession.Redial{Min: r.cfg.ListenRetryMin, Max: r.cfg.ListenRetryMax}
	for {
		connected, err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		if connected {
			redial.Connected()
		}
		wait := redial.Pause()
		r.logger.Warn("outbox LISTEN connection lost; polling until it is back", "err", err, "retry_in", wait)
		if !pgsession.Sleep(ctx, wait) {
			return
		}
	}
}

// listenOnce connects, LISTENs and forwards notifications until the
// connection fails or ctx is cancelled. connected reports whether LISTEN
// had succeeded.
func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) (connected bool, err error) {
	conn, err := r.cfg.Listen.Connect(ctx, r.pool, listenerApplicationName)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, listenSQL); err != nil {
		return false, fmt.Errorf("listen %s: %w", NotifyChannel, err)
	}
	if r.listens.Add(1) > 1 {
		r.logger.Info("outbox LISTEN connection re-established")
	}
	nudge(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		nudge(wake)
	}
}

// nudge wakes Run without blocking; wakes coalesce while a pass runs.
func nudge(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
