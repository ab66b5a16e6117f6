package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/pgplan"
	"github.com/ingest-worker/ingest/pgsession"
)

// Relay defaults (docs/ARCHITECTURE.md §5: INGEST_OUTBOX_*); the retry
// backoff's are package internal/backoff's.
const (
	DefaultMaxAttempts     = 10
	DefaultBatchSize       = 20
	DefaultPublishInterval = time.Second
	DefaultLease           = 30 * time.Second
	DefaultPublishTimeout  = 5 * time.Second
	DefaultListenRetryMin  = 100 * time.Millisecond
	DefaultListenRetryMax  = 5 * time.Second
	DefaultParallel        = 2
	DefaultDirectBacklog   = 16

	listenerApplicationName = "ingest-outbox-listener"
)

// Bounds of RelayConfig (INGEST_OUTBOX_PUBLISH_BATCH_SIZE,
// INGEST_OUTBOX_MAX_ATTEMPTS).
const (
	// MaxBatchSize bounds BatchSize.
	MaxBatchSize = 10000
	// MaxAttemptsLimit bounds MaxAttempts, well inside the int column
	// attempt_count it is compared with.
	MaxAttemptsLimit = 1_000_000
)

// RelayConfig configures a Relay. Zero fields take the Default* values.
type RelayConfig struct {
	// ID names this relay in outbox_event.claimed_by (the relay that
	// published a row, or holds a direct claim on it) and in the
	// application_name of its passes' sessions. It must be unique among
	// running relays; the default is hostname-pid-random.
	ID string
	// BatchSize is how many rows of outbox_row, and of the outbox log, one
	// pass claims and publishes in one pipelined round trip
	// (INGEST_OUTBOX_PUBLISH_BATCH_SIZE).
	BatchSize int
	// PublishInterval is the polling period, the fallback for a missed or
	// lost NOTIFY (INGEST_OUTBOX_PUBLISH_INTERVAL_MS).
	PublishInterval time.Duration
	// Lease is how long a claim is exclusive: how long a pass may stay
	// idle in its transaction (publishing) before another relay's claim
	// terminates it and publishes its rows again (a duplicate entry,
	// harmless), and how long a direct claim holds its rows. Postgres
	// ends a pass's session idle for ten leases itself.
	Lease time.Duration
	// PublishTimeout bounds each step of a pass after its claim: the XADD
	// round trip, and the update that marks the rows and commits. A pass
	// that has claimed runs to the end even when Run's context is
	// cancelled, so a shutdown leaves no row claimed. Lease must exceed
	// twice this.
	PublishTimeout time.Duration
	// MaxAttempts is the number of failed publishes after which a row goes
	// DEAD (INGEST_OUTBOX_MAX_ATTEMPTS).
	MaxAttempts int
	// Backoff is the retry delay after failed publishes, the same policy
	// and formula as a failed task's (package internal/backoff): Base and
	// Max are INGEST_OUTBOX_RETRY_BASE_BACKOFF_MS and
	// INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS. The zero Policy takes
	// backoff.Default.
	Backoff backoff.Policy
	// ListenRetryMin and ListenRetryMax bound the reconnect backoff of the
	// LISTEN connection; the relay keeps polling while it is down.
	ListenRetryMin time.Duration
	ListenRetryMax time.Duration
	// Parallel is how many passes run at once while there is a backlog
	// (passes that claim full batches): while one waits for Postgres to
	// mark its rows, another claims and publishes the next rows.
	Parallel int
	// DirectBacklog is how many committed batches may wait for direct
	// publishing at once (see Writer); beyond that, new rows go
	// the usual way (NOTIFY, claim).
	DirectBacklog int
	// Listen is where the LISTEN connection comes from (the zero value: a
	// connection like the pool's). With Listen.None the relay does not
	// listen and finds committed rows by polling every PublishInterval.
	Listen pgsession.Source
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c RelayConfig) WithDefaults() RelayConfig {
	if c.ID == "" {
		c.ID = defaultRelayID()
	}
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PublishInterval = cmp.Or(c.PublishInterval, DefaultPublishInterval)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.Backoff = cmp.Or(c.Backoff, backoff.Default)
	c.ListenRetryMin = cmp.Or(c.ListenRetryMin, DefaultListenRetryMin)
	c.ListenRetryMax = cmp.Or(c.ListenRetryMax, DefaultListenRetryMax)
	c.Parallel = cmp.Or(c.Parallel, DefaultParallel)
	c.DirectBacklog = cmp.Or(c.DirectBacklog, DefaultDirectBacklog)
	return c
}

// Validate checks the configuration (zero fields taking their defaults)
// and names the bad field: "outbox: BatchSize: must be from 1 to 10000,
// got 0". The errors wrap ErrConfig.
func (c RelayConfig) Validate() error {
	c = c.WithDefaults()
	errBackoff := c.Backoff.Validate()
	switch {
	case len(c.ID) > 200:
		return configErr("ID", "must be at most 200 bytes, got %d", len(c.ID))
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return configErr("BatchSize", "must be from 1 to %d, got %d", MaxBatchSize, c.BatchSize)
	case c.PublishInterval < time.Millisecond:
		return configErr("PublishInterval", "must be at least 1ms, got %s", c.PublishInterval)
	case c.PublishTimeout < time.Millisecond:
		return configErr("PublishTimeout", "must be at least 1ms, got %s", c.PublishTimeout)
	case c.Lease <= 2*c.PublishTimeout:
		return configErr("Lease", "must be longer than twice PublishTimeout (%s), got %s", c.PublishTimeout, c.Lease)
	case c.MaxAttempts < 1 || c.MaxAttempts > MaxAttemptsLimit:
		return configErr("MaxAttempts", "must be from 1 to %d, got %d", MaxAttemptsLimit, c.MaxAttempts)
	case errBackoff != nil:
		return configWithin("Backoff", errBackoff)
	case c.ListenRetryMin <= 0:
		return configErr("ListenRetryMin", "must be more than 0s, got %s", c.ListenRetryMin)
	case c.Parallel < 1 || c.Parallel > 64:
		return configErr("Parallel", "must be from 1 to 64, got %d", c.Parallel)
	case c.DirectBacklog < 1 || c.DirectBacklog > 1024:
		return configErr("DirectBacklog", "must be from 1 to 1024, got %d", c.DirectBacklog)
	case c.ListenRetryMax < c.ListenRetryMin:
		return configErr("ListenRetryMax", "must be at least ListenRetryMin (%s), got %s", c.ListenRetryMin, c.ListenRetryMax)
	}
	return nil
}

func defaultRelayID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "relay"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// DrainResult counts what one pass did.
type DrainResult struct {
	// Claimed rows: at most BatchSize of outbox_row and BatchSize of the
	// outbox log.
	Claimed int
	// Published rows: XADDed and marked SENT.
	Published int
	// Retried rows: the XADD failed, RETRYING with backoff.
	Retried int
	// Dead rows: the XADD failed for the last allowed time, now DEAD.
	Dead int
	// Held rows: their tasks, delayed and fallen due, were parked by
	// their groups' windows (a release publishes them later) and the rows
	// deleted (see holdSQL).
	Held int
	// Stale rows: their claim had been taken over by another relay (this
	// one stalled past its lease, and its transaction was ended) before
	// this pass could mark them, so the pass changed nothing; their
	// entries may be in the stream twice.
	Stale int
}

// Relay publishes outbox rows through its Publisher (Redis or Kafka). Any number of relays may run at
// once, in one process or many: a pass holds its rows by row locks (FOR
// UPDATE SKIP LOCKED) in a transaction bounded by a lease (pass.go).
type Relay struct {
	cfg     RelayConfig
	pool    *pgxpool.Pool
	pub     Publisher
	logger  *slog.Logger
	metrics *relayMetrics

	listens atomic.Int64 // LISTEN connections established, for tests

	// from is where the claims and the due timer read the claim index
	// (scan.go); late, the reads by id that lower it (late.go).
	from *scanFrom
	late lateReads

	// Direct publishing (see Writer): running is set while Run
	// runs; directSlots holds one token per claim taken and not yet
	// published or discarded; direct carries committed claims to Run.
	running     atomic.Bool
	directSlots chan struct{}
	direct      chan claimed

	// wake starts a pass: a NOTIFY, or Wake from this process.
	wake chan struct{}

	// afterPublish, when set (by tests), runs between the XADD and the
	// update that marks the rows.
	afterPublish func()
}

// NewRelay returns a relay reading outbox_event through pool and publishing
// to rdb (a RedisPublisher). Its metrics are registered on reg (nil: none);
// several relays may share one registerer.
func NewRelay(cfg RelayConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	var pub Publisher
	if rdb != nil {
		pub = NewRedisPublisher(rdb)
	}
	return NewRelayWith(cfg, pool, pub, logger, reg)
}

// NewRelayWith returns a relay publishing through pub (Kafka mode passes a
// kafka.Publisher); otherwise it is NewRelay.
func NewRelayWith(cfg RelayConfig, pool *pgxpool.Pool, pub Publisher, logger *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case pool == nil:
		return nil, configErr("pool", "is required (a Postgres pool)")
	case pub == nil:
		return nil, configErr("pub", "is required (a publisher, or for NewRelay a Redis client)")
	}
	logger = discardIfNil(logger).With("component", "outbox-relay", "relay", cfg.ID)
	m, err := newRelayMetrics(reg, pool, logger)
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, pool: pool, pub: pub, logger: logger, metrics: m,
		from:        &scanFrom{every: max(frontEvery, cfg.PublishInterval), now: time.Now},
		late:        lateReads{floor: -1},
		directSlots: make(chan struct{}, cfg.DirectBacklog), direct: make(chan claimed, cfg.DirectBacklog),
		wake: make(chan struct{}, 1)}, nil
}

// Config returns the relay's configuration with defaults filled in.
func (r *Relay) Config() RelayConfig { return r.cfg }

// Run publishes until ctx is cancelled, then returns nil once the pass in
// flight has finished. It wakes on every NOTIFY of a committed outbox row,
// polls every PublishInterval besides (a poll reads the rows created since
// the last ones for rows that committed late, late.go), and after every
// pass, whatever woke it, sets a timer for the earliest unpublished row
// when that falls due before the next poll (see armDue); while a pass
// claims a full batch it goes on at once. A lost LISTEN connection is
// re-established with backoff while polling continues.
//
// While Run runs, the relay also publishes the claims handed to it by
// direct publishing (see Writer); on return it has published those
// handed over before ctx was cancelled.
func (r *Relay) Run(ctx context.Context) error {
	if r.running.Swap(true) {
		return errors.New("outbox relay: Run is already running")
	}
	wake := r.wake
	var wg sync.WaitGroup
	defer wg.Wait()
	// Deferred after wg.Wait, so it runs first: no claim is taken once the
	// direct publishers start draining.
	defer r.running.Store(false)
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.listen(ctx, wake)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.publishDirect(ctx)
	}()

	ticker := time.NewTicker(r.cfg.PublishInterval)
	defer ticker.Stop()
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	atOnce := false
	for {
		claimed := r.drain(ctx)
		atOnce = r.armDue(ctx, due, atOnce && claimed == 0)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			// The poll: rows committed late, by id (late.go).
			r.readLate(ctx)
		case <-wake:
		case <-due.C:
		}
	}
}

// Wake starts a pass of r's Run soon, as a NOTIFY of a committed outbox
// row does; wakes before the pass starts count once. For a transaction of
// this process that wrote rows without notifying (WakeByCaller).
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// nextDueSQL returns how long until the earliest unsent row due at or
// after $1 (the relay's bound, scan.go) that no live claim holds falls due
// (negative: it is due already), by the database's clock, reading
// outbox_event_claim_idx in order from the bound; no row: none. It takes
// no lock: a row that another relay's pass holds looks due, the pass that
// follows finds nothing to lock, and armDue leaves the relay to its poll
// (stuck).
const nextDueSQL = `
SELECT extract(epoch FROM next_retry_at - now())::float8 FROM outbox_row
WHERE status IN ('NEW', 'RETRYING') AND next_retry_at >= $1 AND (claimed_until IS NULL OR claimed_until < now())
ORDER BY next_retry_at, id LIMIT 1`

// armDue sets timer to wake the relay when the earliest unpublished row
// falls due, when that is before the next poll: a delayed task's row (or a
// publish retry) is then claimed at its due time rather than up to
// PublishInterval later. It runs after every pass, whatever woke the relay:
// the earliest row may have been written by the commit that woke it, or
// have fallen due while the pass ran (ten rows due a few milliseconds
// apart: the pass the first one woke publishes only those due when it
// claimed). A row due already is claimed at once, unless the relay has
// just done that and claimed nothing (stuck says so: the row is locked,
// say), which leaves it to the polls; armDue reports whether it armed for
// such a row. A failed query only leaves the rows to the polls.
func (r *Relay) armDue(ctx context.Context, timer *time.Timer, stuck bool) (atOnce bool) {
	var secs float64
	if err := r.nextDue(ctx, &secs); err != nil {
		if !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil {
			r.logger.Debug("outbox relay: reading the next due time failed; polling", "err", err)
		}
		timer.Stop()
		return false
	}
	d := time.Duration(secs * float64(time.Second))
	switch {
	case d >= r.cfg.PublishInterval || (d <= 0 && stuck):
		timer.Stop() // the next poll comes first
		return false
	case d <= 0:
		timer.Reset(0)
		return true
	}
	timer.Reset(d + time.Millisecond)
	return false
}

// nextDue reads nextDueSQL into secs, with the claim's planner settings,
// so that it reads the claim index in order whatever the statistics say.
func (r *Relay) nextDue(ctx context.Context, secs *float64) error {
	return queryRowPlanned(ctx, r.pool, nextDueSQL, []any{r.from.due()}, secs)
}

// queryRowPlanned reads the one row of sql (with args) into dest, with the
// claim's planner settings (claimPlanSQL) sent before it in the same round
// trip, for a statement that must read the claim index as a range however
// stale the statistics (pgx.ErrNoRows: no row).
func queryRowPlanned(ctx context.Context, db pgplan.Batcher, sql string, args []any, dest ...any) error {
	batch := &pgx.Batch{}
	batch.Queue(claimPlanSQL)
	batch.Queue(sql, args...)
	br := db.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	return errors.Join(err, br.Close())
}

// drain runs passes while they claim full batches: one, and once it has
// claimed a full batch, Parallel at a time. It returns how many rows they
// claimed.
func (r *Relay) drain(ctx context.Context) int {
	n := r.pass(ctx)
	if n < r.cfg.BatchSize {
		return n
	}
	var total atomic.Int64
	total.Add(int64(n))
	var wg sync.WaitGroup
	for range r.cfg.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := r.pass(ctx)
				total.Add(int64(n))
				if n < r.cfg.BatchSize {
					return
				}
			}
		}()
	}
	wg.Wait()
	return int(total.Load())
}

// pass runs one pass and returns how many rows it claimed (a full batch:
// there may be more).
func (r *Relay) pass(ctx context.Context) int {
	if ctx.Err() != nil {
		return 0
	}
	res, err := r.DrainOnce(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Error("outbox relay pass failed", "err", err)
		}
		return 0
	}
	return res.Claimed
}

// DrainOnce runs one pass: in one transaction it locks up to BatchSize due
// rows, publishes them in one pipelined XADD round trip, marks each SENT,
// or RETRYING or DEAD when its XADD failed, and commits. For tests and
// callers with a scheduler of their own; Run calls it.
//
// Once rows are claimed the pass finishes even if ctx is cancelled (each
// step bounded by PublishTimeout). On an error the transaction is rolled
// back: the rows it could not mark are due again at once and published
// again. DrainOnce is safe for concurrent use.
func (r *Relay) DrainOnce(ctx context.Context) (DrainResult, error) {
	c, err := r.claim(ctx)
	if err != nil || c.conn == nil {
		return DrainResult{}, err
	}
	res, err := r.finish(ctx, c)
	if err != nil || res.Stale > 0 {
		// The rows it could not mark are free again, and may sort
		// before the bound that claims since its own have set.
		r.from.reset()
	}
	return res, err
}

// finish publishes the rows of claim c and marks them: the part of a pass
// after its claim.
func (r *Relay) finish(ctx context.Context, c claimed) (DrainResult, error) {
	// Once claimed, the pass runs to the end even if ctx is cancelled: each
	// step gets its own deadline.
	ctx = context.WithoutCancel(ctx)
	var ids []string
	var errs []error
	if len(c.rows) > 0 {
		pubCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
		ids, errs = r.publish(pubCtx, c.rows)
		cancel()
	}
	if c.conn != nil {
		return r.commitPass(ctx, c, ids, errs)
	}
	return r.record(ctx, c, ids, errs)
}

// record marks the rows of direct claim c after their XADDs: SENT with
// their entry ids, or RETRYING or DEAD with their errors, each update
// guarded by the claim (a pass's rows: commitPass).
func (r *Relay) record(ctx context.Context, c claimed, ids []string, errs []error) (DrainResult, error) {
	res := DrainResult{Claimed: len(c.rows)}
	if r.afterPublish != nil {
		r.afterPublish()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	sent, sentIDs, failed, failMsgs := splitPublished(c.rows, ids, errs)
	var errSent, errFailed error
	if len(sent) > 0 {
		res.Published, errSent = r.markSent(ctx, c, sent, sentIDs)
		if errSent == nil {
			res.Stale += len(sent) - res.Published
		}
	}
	if len(failed) > 0 {
		var applied int
		res.Retried, res.Dead, applied, errFailed = r.markFailed(ctx, c, failed, failMsgs)
		if errFailed == nil {
			res.Stale += len(failed) - applied
		}
	}
	if err := errors.Join(errSent, errFailed); err != nil {
		return res, err
	}
	r.logPass(res, failMsgs)
	return res, nil
}

// splitPublished splits rows by the outcome of their publish (ids[i] or
// errs[i]): the published rows with their entry ids, the failed ones with
// their errors, truncated for last_error.
func splitPublished(rows []row, ids []string, errs []error) (sent []row, sentIDs []string, failed []row, failMsgs []string) {
	for i, rw := range rows {
		if errs[i] == nil {
			sent, sentIDs = append(sent, rw), append(sentIDs, ids[i])
		} else {
			failed, failMsgs = append(failed, rw), append(failMsgs, truncateError(errs[i].Error()))
		}
	}
	return sent, sentIDs, failed, failMsgs
}

func (r *Relay) logPass(res DrainResult, failMsgs []string) {
	if res.Retried > 0 || res.Dead > 0 {
		r.logger.Warn("outbox publish failed", "retried", res.Retried, "dead", res.Dead, "err", failMsgs[0])
	}
	if res.Stale > 0 {
		r.logger.Warn("outbox relay lost its lease before marking rows: another relay published them again",
			"stale", res.Stale)
	}
	r.logger.Debug("outbox relay pass", "claimed", res.Claimed, "published", res.Published, "held", res.Held)
}

// row is one claimed outbox row.
type row struct {
	id        int64
	taskID    uuid.UUID
	stream    string
	kind      string
	createdAt time.Time
	// traceparent is the task's (ingest_task.traceparent), "" when none.
	traceparent string
	// priority is the task's (0 or 2: the default).
	priority int
	// logged: the row is outbox_log's (taken by logTakeSQL), not
	// outbox_row's.
	logged bool
}

// claimed is the rows a relay is to publish, and what holds them: the
// open transaction of a pass (conn), whose row locks hold them until it
// ends, or, for direct publishing, a claim (claimed_by, claimed_until)
// that guards every later update.
type claimed struct {
	until time.Time
	rows  []row
	// conn holds the transaction of a pass (see pass.go); orphans are
	// the rows it locked whose task is gone.
	conn    *pgxpool.Conn
	orphans []int64
	// withdrawn are the rows it locked whose tasks it parked (hold):
	// deleted at its commit, not published.
	withdrawn []int64
	// log is what it took of outbox_log (log.go).
	log logTaken
	// unwritten: the rows are not in outbox_event yet (see reserve); the
	// relay writes them after the XADD. committed is when the claim was
	// handed over.
	unwritten bool
	committed time.Time
}

// claimPlanSQL, sent before the claim in its transaction (passSettingsSQL
// repeats it) and before the other reads of the claim index
// (queryRowPlanned, the reads by id), leaves the planner one way to read due
// rows: outbox_event_claim_idx in order, stopping after a batch. The row estimates of a queue table are
// often far off (a backlog arrives faster than ANALYZE, or autovacuum is
// off), and a low estimate made the planner read every unsent row with a
// bitmap scan and sort them, on every claim: 80 ms instead of 8 ms per
// 1,000 rows with 200,000 unsent, and a relay that fell behind its
// inserts. The settings end with the transaction.
const claimPlanSQL = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`

// publish hands one message per row to the relay's Publisher (one round
// trip), times it, and returns each message's id or error.
func (r *Relay) publish(ctx context.Context, rows []row) ([]string, []error) {
	start := time.Now()
	spans := startPublishSpans(rows)
	msgs := make([]Message, len(rows))
	for i, rw := range rows {
		msgs[i] = Message{Stream: rw.stream, TaskID: rw.taskID, Kind: rw.kind, Traceparent: rw.traceparent, Priority: rw.priority}
	}
	ids, errs := r.pub.Publish(ctx, msgs)
	if len(ids) != len(rows) || len(errs) != len(rows) {
		err := fmt.Errorf("publisher returned %d ids and %d errors for %d messages", len(ids), len(errs), len(rows))
		ids, errs = make([]string, len(rows)), make([]error, len(rows))
		for i := range errs {
			errs[i] = err
		}
	}
	result := resultSuccess
	for _, err := range errs {
		if err != nil {
			result = resultFailure
			break
		}
	}
	endPublishSpans(spans, ids, errs)
	r.metrics.publishSeconds.WithLabelValues(result).Observe(time.Since(start).Seconds())
	return ids, errs
}

// claimedSQL gives the rows of ids $3 (each with a value of $4) in id
// order; the marking UPDATEs below join it to outbox_event through the
// primary key, updating in that order. They take no lock first (a lock is
// a WAL record of its own): their guard, the claim (claimedGuard), is
// re-checked by Postgres on the latest version of a row that changed
// meanwhile, and their SET reads that version.
const claimedSQL = `
    SELECT s.id, s.val FROM unnest($3::bigint[], $4::text[]) AS s(id, val) ORDER BY s.id`

// claimedGuard holds for a row still unsent under the claim ($1, $2). It
// is a CASE, so that no plan reads the target rows from the claim index
// (the whole backlog, which its predicate matches) instead of the key.
const claimedGuard = `CASE WHEN o.claimed_by = $1 AND o.claimed_until = $2 AND o.status IN ('NEW', 'RETRYING') THEN true ELSE false END`

// markSentSQL marks published rows of a direct claim SENT ($4: their entry
// ids; a pass's rows: markSentLockedSQL). The guard is the claim: rows whose claim was taken over (claimed_by or claimed_until
// changed) are left alone. It returns each row's publish delay, from when
// it became due (dueSinceSQL: its creation or, for a row written due later
// (a delayed task) and never failed, its due time).
//
// $5 is each row's destination (Relay.dest): the stream of its task's
// priority in Redis mode, which the row then names.
var markSentSQL = `
WITH c AS (
    SELECT s.id, s.val, s.dest FROM unnest($3::bigint[], $4::text[], $5::text[]) AS s(id, val, dest) ORDER BY s.id
)
UPDATE outbox_row o SET status = 'SENT', sent_at = now(), stream_id = c.val, stream = c.dest
FROM c
WHERE o.id = c.id AND ` + claimedGuard + `
RETURNING extract(epoch FROM o.sent_at - (` + dueSinceSQL("o") + `))::float8`

func (r *Relay) markSent(ctx context.Context, c claimed, rows []row, streamIDs []string) (int, error) {
	ids := make([]int64, len(rows))
	dests := make([]string, len(rows))
	for i, rw := range rows {
		ids[i], dests[i] = rw.id, r.dest(rw)
	}
	dbRows, err := pgplan.Query(ctx, r.pool, markSentSQL, r.cfg.ID, c.until, ids, streamIDs, dests)
	if err != nil {
		return 0, fmt.Errorf("mark %d outbox rows sent: %w", len(rows), err)
	}
	delays, err := pgx.CollectRows(dbRows, pgx.RowTo[float64])
	if err != nil {
		return 0, fmt.Errorf("mark %d outbox rows sent: %w", len(rows), err)
	}
	for _, d := range delays {
		r.metrics.publishDelay.Observe(d)
	}
	r.metrics.publishTotal.WithLabelValues(resultSuccess).Add(float64(len(delays)))
	return len(delays), nil
}

// dest is where rw's message is published: its stream, or, when the
// publisher is a Router, the stream of its priority there.
func (r *Relay) dest(rw row) string {
	if rt, ok := r.pub.(Router); ok {
		return rt.Route(rw.stream, rw.priority)
	}
	return rw.stream
}

// markFailedSQL records a failed publish of rows $3 (errors $4) of a direct
// claim ($1, $2; a pass's rows: markFailedLockedSQL): attempt_count + 1, then DEAD (no retry time) when that reaches
// $5 (max attempts), else RETRYING due after package backoff's delay for
// that many failures, with base $6 and max $7 in (fractional) ms and
// jitter $8. The claim is released. The decision is made here against the
// row's current attempt_count.
var markFailedSQL = `
WITH c AS (` + claimedSQL + `
)
UPDATE outbox_row o SET
    attempt_count = o.attempt_count + 1,
    status        = ` + failedStatusSQL("o.attempt_count + 1", "$5") + `,
    next_retry_at = ` + failedRetryAtSQL("o.attempt_count + 1", "$5", "$6", "$7", "$8") + `,
    last_error    = c.val,
    claimed_by    = NULL,
    claimed_until = NULL
FROM c
WHERE o.id = c.id AND ` + claimedGuard + `
RETURNING o.status`

// failedStatusSQL is the status of a row after failed publishes (the SQL
// expression attempts): DEAD once they reach max attempts (an expression
// too), else RETRYING.
func failedStatusSQL(attempts, max string) string {
	return `CASE WHEN ` + attempts + ` >= ` + max + ` THEN 'DEAD' ELSE 'RETRYING' END`
}

// failedRetryAtSQL is the next_retry_at of that row: none once DEAD, else
// package backoff's delay for that many failures (base, maxDelay in ms,
// jitter: SQL expressions) from now.
func failedRetryAtSQL(attempts, max, base, maxDelay, jitter string) string {
	return failedRetryFromSQL("now()", attempts, max, base, maxDelay, jitter)
}

// failedRetryFromSQL is failedRetryAtSQL from the time from (an SQL
// expression) instead of now().
func failedRetryFromSQL(from, attempts, max, base, maxDelay, jitter string) string {
	return `CASE WHEN ` + attempts + ` >= ` + max + ` THEN NULL
                         ELSE ` + from + ` + ` + backoff.SQL(attempts, base, maxDelay, jitter, "random()") + ` END`
}

// countFailed counts the statuses that failed rows were left in, DEAD or
// RETRYING, in outbox_publish_total.
func (r *Relay) countFailed(statuses []string) (retried, dead int) {
	for _, s := range statuses {
		if Status(s) == StatusDead {
			dead++
		} else {
			retried++
		}
	}
	r.metrics.publishTotal.WithLabelValues(resultFailure).Add(float64(retried))
	r.metrics.publishTotal.WithLabelValues(resultDead).Add(float64(dead))
	return retried, dead
}

func (r *Relay) markFailed(ctx context.Context, c claimed, rows []row, msgs []string) (retried, dead, applied int, err error) {
	ids := make([]int64, len(rows))
	for i, rw := range rows {
		ids[i] = rw.id
	}
	baseMS, maxMS, jitter := r.cfg.Backoff.SQLArgs()
	dbRows, err := pgplan.Query(ctx, r.pool, markFailedSQL, r.cfg.ID, c.until, ids, msgs, r.cfg.MaxAttempts, baseMS, maxMS, jitter)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("mark %d outbox rows failed: %w", len(rows), err)
	}
	statuses, err := pgx.CollectRows(dbRows, pgx.RowTo[string])
	if err != nil {
		return 0, 0, 0, fmt.Errorf("mark %d outbox rows failed: %w", len(rows), err)
	}
	retried, dead = r.countFailed(statuses)
	return retried, dead, len(statuses), nil
}
