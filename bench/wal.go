package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WAL is the server's write-ahead log position and record count at one
// moment: what a run wrote is the difference of two readings. It is the
// whole server's (autovacuum included, and anything else that writes
// there), so a run's figure is honest only on a server of its own or an
// otherwise idle one.
type WAL struct {
	// LSN is pg_current_wal_lsn() in bytes: exact at the moment it is read.
	LSN int64
	// Records is pg_stat_wal.wal_records. Backends report it when they
	// end a transaction while idle for a second, when they exit, or after
	// ten idle seconds, so a reading taken at once may miss the newest.
	Records int64
}

// WALUsage is what a run wrote to the WAL, per task.
type WALUsage struct {
	Bytes          int64   `json:"bytes"`
	Records        int64   `json:"records"`
	BytesPerTask   float64 `json:"bytes_per_task"`
	RecordsPerTask float64 `json:"records_per_task"`
}

const walSQL = `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, (SELECT wal_records FROM pg_stat_wal)`

// ReadWAL reads the server's WAL position and record count.
func ReadWAL(ctx context.Context, pool *pgxpool.Pool) (WAL, error) {
	var w WAL
	var lsn float64
	if err := pool.QueryRow(ctx, walSQL).Scan(&lsn, &w.Records); err != nil {
		return w, fmt.Errorf("read the WAL position: %w", err)
	}
	w.LSN = int64(lsn)
	return w, nil
}

// SettledWAL reads the WAL once the record count has stopped moving: it
// closes the pool's idle connections (their backends report their counts
// as they exit) and reads until two readings 300 ms apart agree, for at
// most 12 s (a backend that stays idle reports after 10 s).
func SettledWAL(ctx context.Context, pool *pgxpool.Pool) (WAL, error) {
	pool.Reset()
	prev, err := ReadWAL(ctx, pool)
	if err != nil {
		return prev, err
	}
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return prev, ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
		cur, err := ReadWAL(ctx, pool)
		if err != nil {
			return cur, err
		}
		// The readings themselves write nothing; a moved count is a
		// late report (or another client's work).
		if cur.Records == prev.Records {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

// Usage is what the WAL grew by from w to later, spread over tasks.
func (w WAL) Usage(later WAL, tasks int) WALUsage {
	u := WALUsage{Bytes: later.LSN - w.LSN, Records: later.Records - w.Records}
	if tasks > 0 {
		u.BytesPerTask = float64(u.Bytes) / float64(tasks)
		u.RecordsPerTask = float64(u.Records) / float64(tasks)
	}
	return u
}
