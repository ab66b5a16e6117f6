package maintenance

import (
	"context"
	"errors"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/task"
)

// lowWater raises the low water of the unfinished tasks (migration 00025,
// task/lowwater.go): every unfinished task with an id below it is
// lingering, so that the readers of the unfinished tasks read the recent
// ids on the primary key and the lingering tasks on their index, and no
// index names finished_at (a completion is a HOT update). Each pass:
//   - raises the low water to the cutoff pending since an earlier pass,
//     once no transaction that may have inserted a task without reading
//     that cutoff is open (task.AdvanceLowWater); until then it waits,
//     a pass at a time, blocking nothing;
//   - with no cutoff pending, publishes a new one, Lag before now
//     (task.PublishLowWater), and raises the low water to it at once when
//     no transaction is to be waited for;
//   - clears lingering on up to ClearBatch finished tasks
//     (task.ClearLingering).
//
// Correctness does not depend on the passes: a low water that is not
// raised leaves more tasks "recent", which the readers read on the
// primary key.
type lowWater struct {
	cfg     LowWaterConfig
	pool    *pgxpool.Pool
	metrics *metrics
}

func newLowWater(cfg LowWaterConfig, pool *pgxpool.Pool, m *metrics) *lowWater {
	return &lowWater{cfg: cfg, pool: pool, metrics: m}
}

// lowWaterResult is what one pass did.
type lowWaterResult struct {
	// Published is the cutoff published (uuid.Nil: none), Waiting how many
	// transactions it waits for.
	Published uuid.UUID
	Waiting   int
	// Advanced: the low water was raised to Low, and Marked tasks were
	// marked lingering.
	Advanced bool
	Low      uuid.UUID
	Marked   int64
	// Cleared counts the finished tasks cleared of lingering.
	Cleared int64
}

func (w *lowWater) service() *service {
	return &service{
		name:     componentLowWater,
		interval: w.cfg.Interval,
		msg:      "low water pass",
		level:    slog.LevelDebug,
		pass: func(ctx context.Context) ([]any, error) {
			res, err := w.runOnce(ctx)
			if !res.Advanced && res.Published == uuid.Nil && res.Cleared == 0 {
				return nil, err
			}
			return []any{"published", res.Published, "waiting", res.Waiting, "advanced", res.Advanced,
				"low", res.Low, "marked", res.Marked, "cleared", res.Cleared}, err
		},
		failed: func() { w.metrics.failures.WithLabelValues(componentLowWater).Inc() },
	}
}

// runOnce raises the low water to a pending cutoff, publishes the next
// one (raising the low water to it at once when it waits for nothing) and
// clears lingering on finished tasks; a failure of the raise does not
// stop the clearing.
func (w *lowWater) runOnce(ctx context.Context) (lowWaterResult, error) {
	var res lowWaterResult
	errRaise := w.raise(ctx, &res)
	n, errClear := task.ClearLingering(ctx, w.pool, w.cfg.ClearBatch)
	res.Cleared = n
	return res, errors.Join(errRaise, errClear)
}

func (w *lowWater) raise(ctx context.Context, res *lowWaterResult) error {
	ok, low, marked, err := task.AdvanceLowWater(ctx, w.pool)
	if err != nil {
		return err
	}
	res.Advanced, res.Low, res.Marked = ok, low, marked
	st, err := task.ReadLowWater(ctx, w.pool)
	if err != nil || st.Pending != uuid.Nil {
		return err // still waiting
	}
	if res.Published, res.Waiting, err = task.PublishLowWater(ctx, w.pool, w.cfg.Lag); err != nil || res.Published == uuid.Nil || res.Waiting > 0 {
		return err
	}
	ok, low, marked, err = task.AdvanceLowWater(ctx, w.pool)
	if err != nil {
		return err
	}
	if ok {
		res.Advanced, res.Low, res.Marked = true, low, res.Marked+marked
	}
	return nil
}
