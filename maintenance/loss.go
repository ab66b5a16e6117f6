package maintenance

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/pgsession"
)

// LossChannel is the Postgres notification channel on which any process
// reports evidence that Redis lost data (ReportRedisLoss), and on which the
// leader listens.
const LossChannel = "ingest_redis_loss"

// lossListenerApplicationName names the leader's loss listener in
// pg_stat_activity.
const lossListenerApplicationName = "ingest-loss-listener"

// maxUrgentPasses bounds an urgent rescue: that many passes of
// Rescuer.PagesPerRun pages of Rescuer.BatchSize candidates per class (a
// million with the defaults).
const maxUrgentPasses = 1000

// ReportRedisLoss tells the leader, whichever process it is, that Redis
// lost data: reason says what was seen (a consumer group gone, say). The
// leader's rescuer then runs at once without its grace, and again until it
// has examined every candidate, so that tasks whose stream entries were
// lost run again within seconds instead of after Rescuer.Grace. Reports
// from many processes at once cost one rescue: the leader coalesces them.
// A report made while no process leads is lost; the scheduled passes
// still rescue the tasks, after their grace.
func (m *Maintainer) ReportRedisLoss(ctx context.Context, reason string) error {
	m.kickRescuer()
	if _, err := m.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, LossChannel, clip.String(reason, 200)); err != nil {
		return fmt.Errorf("report Redis data loss: %w", err)
	}
	return nil
}

// kickRescuer asks this process's rescuer, if it runs (this process
// leads), for an urgent pass; a request already waiting absorbs it.
func (m *Maintainer) kickRescuer() {
	for _, s := range m.services {
		if s.kick != nil && m.IsLeader() {
			select {
			case s.kick <- struct{}{}:
			default:
			}
		}
	}
}

// listenLoss listens on LossChannel while ctx (the leadership) lasts and
// turns each report into a request on kick. A failed connection is
// re-established with backoff.
func (m *Maintainer) listenLoss(ctx context.Context, kick chan<- struct{}) {
	if !m.cfg.Listen.Enabled() {
		m.logger.Info("the leader does not LISTEN for Redis loss reports (no PostgreSQL session: the database URL goes through a transaction pooler and no direct listen URL is set); its own reports still rescue at once")
		return
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := m.listenOnce(ctx, kick)
		if ctx.Err() != nil {
			return
		}
		m.logger.Warn("listening for Redis data loss reports failed; retrying", "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// listenOnce listens on a connection of its own until ctx ends or the
// connection fails.
func (m *Maintainer) listenOnce(ctx context.Context, kick chan<- struct{}) error {
	// A connection of its own, outside the pool: a LISTENing session must
	// not serve other queries, and it is closed when the listening ends.
	// By default one leaves the pool (no new connection to wait for); with
	// Config.Listen set, one is opened as it says.
	var conn *pgx.Conn
	if m.cfg.Listen == (pgsession.Source{}) {
		pc, err := m.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conn = pc.Hijack()
	} else {
		var err error
		if conn, err = m.cfg.Listen.Connect(ctx, m.pool, lossListenerApplicationName); err != nil {
			return err
		}
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{LossChannel}.Sanitize()); err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		m.logger.Warn("Redis data loss reported: rescuing without the grace", "reason", n.Payload)
		select {
		case kick <- struct{}{}:
		default:
		}
	}
}
