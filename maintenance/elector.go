package maintenance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The election runs on one row of ingest_leader per election name, with
// single statements only (no session state, no advisory lock), so that it
// works through a transaction-pooling PgBouncer too. Expiry is always
// database time (now()); no clock is compared with another machine's.

// acquireSQL makes elector $2 the leader of $1 for $3 µs when the row is
// missing, expired, or already its own (then it is a renewal that keeps
// elected_at). It returns a row only when $2 leads.
const acquireSQL = `
INSERT INTO ingest_leader AS l (name, leader_id, elected_at, expires_at)
VALUES ($1, $2, now(), now() + $3 * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE SET
    leader_id  = excluded.leader_id,
    elected_at = CASE WHEN l.leader_id = excluded.leader_id THEN l.elected_at ELSE excluded.elected_at END,
    expires_at = excluded.expires_at
WHERE l.expires_at < now() OR l.leader_id = excluded.leader_id
RETURNING l.leader_id`

// renewSQL extends the lease of leader $2 of $1 to now() + $3 µs; it
// changes nothing when $2 is no longer the leader.
const renewSQL = `UPDATE ingest_leader SET expires_at = now() + $3 * interval '1 microsecond' WHERE name = $1 AND leader_id = $2`

// resignSQL gives up the leadership of $1 if $2 holds it, so that a
// follower takes over at its next attempt instead of after the TTL.
const resignSQL = `DELETE FROM ingest_leader WHERE name = $1 AND leader_id = $2`

// errNotLeader: a renewal found the row naming another leader (or none).
var errNotLeader = errors.New("the leader row no longer names this process")

// elector runs the statements of the election for one identity.
//
// Safety: a successful acquire or renewal sets expires_at = now() + TTL,
// where now() is the start of the statement's transaction: later than the
// moment the elector sent it. The elector's local deadline is that send
// time + TTL - Margin on its monotonic clock, so it passes at least Margin
// before any other elector can see the row expired, whatever the network
// delays and without synchronised clocks (only equal clock rates are
// assumed). The Maintainer stops its services at the local deadline.
type elector struct {
	cfg ElectorConfig
	id  string // ingest_leader.leader_id: cfg.ID and a random suffix
	db  *pgxpool.Pool
}

func newElector(cfg ElectorConfig, db *pgxpool.Pool) (*elector, error) {
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, fmt.Errorf("leader id: %w", err)
	}
	return &elector{cfg: cfg, id: cfg.ID + "#" + hex.EncodeToString(suffix), db: db}, nil
}

// lease is how long a successful statement sent at sent lets this elector
// lead: until its local deadline.
func (e *elector) lease(sent time.Time) time.Time {
	return sent.Add(e.cfg.TTL - e.cfg.Margin)
}

// acquire tries to become (or stay) the leader. It returns the local
// deadline and true when this elector leads; false when another does.
// The attempt is given until the deadline a success would have: a later
// answer would be worthless.
func (e *elector) acquire(ctx context.Context) (time.Time, bool, error) {
	sent := time.Now()
	deadline := e.lease(sent)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var id string
	err := e.db.QueryRow(ctx, acquireSQL, e.cfg.Name, e.id, e.cfg.TTL.Microseconds()).Scan(&id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("acquire leadership of %q: %w", e.cfg.Name, err)
	}
	return deadline, true, nil
}

// renew extends the lease of a leader whose local deadline is deadline
// and returns the new deadline. Any error means the leadership is lost:
// errNotLeader when another elector leads, else the statement failed or
// did not answer before the deadline.
func (e *elector) renew(ctx context.Context, deadline time.Time) (time.Time, error) {
	sent := time.Now()
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	tag, err := e.db.Exec(ctx, renewSQL, e.cfg.Name, e.id, e.cfg.TTL.Microseconds())
	switch {
	case err != nil:
		return time.Time{}, fmt.Errorf("renew leadership of %q: %w", e.cfg.Name, err)
	case tag.RowsAffected() == 0:
		return time.Time{}, errNotLeader
	}
	return e.lease(sent), nil
}

// resign deletes the leader row if this elector holds it.
func (e *elector) resign(ctx context.Context) error {
	if _, err := e.db.Exec(ctx, resignSQL, e.cfg.Name, e.id); err != nil {
		return fmt.Errorf("resign leadership of %q: %w", e.cfg.Name, err)
	}
	return nil
}
