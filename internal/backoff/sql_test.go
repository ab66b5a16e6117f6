package backoff_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// micros is the SQL expression as whole microseconds: the resolution of a
// PostgreSQL interval, read exactly (extract returns numeric).
func micros(expr string) string {
	return `SELECT (extract(epoch FROM ` + expr + `) * 1000000)::bigint`
}

// TestSQLMatchesDelay evaluates the SQL expression in PostgreSQL, with
// placeholders as the callers pass them, and compares it with the Go
// oracle for a fixed draw u.
func TestSQLMatchesDelay(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t).Pool
	ctx := context.Background()
	query := micros(backoff.SQL("$1", "$2", "$3", "$4", "$5"))

	attempts := []int{-3, 0, 1, 2, 10, 40, 62, 63, 64, 1000, math.MaxInt32, math.MaxInt64}
	bases := []time.Duration{0, time.Millisecond, 1500 * time.Microsecond, time.Second}
	maxes := []time.Duration{0, 10 * time.Minute}
	jitters := []float64{0, 0.1}
	draws := []float64{0, 0.5, 0.999}
	cases := 0
	for _, base := range bases {
		for _, maxD := range maxes {
			p0 := backoff.Policy{Base: base, Max: maxD}
			if p0.Validate() != nil {
				continue // Max below Base
			}
			for _, jitter := range jitters {
				p := p0
				p.Jitter = jitter
				baseMS, maxMS, j := p.SQLArgs()
				for _, attempt := range attempts {
					for _, u := range draws {
						cases++
						want := p.Delay(attempt, u)
						var got int64
						if err := db.QueryRow(ctx, query, int64(attempt), baseMS, maxMS, j, u).Scan(&got); err != nil {
							t.Fatalf("%+v attempt %d u %v: %v", p, attempt, u, err)
						}
						if diff := time.Duration(got)*time.Microsecond - want; diff < -time.Microsecond || diff > time.Microsecond {
							t.Errorf("%+v attempt %d u %v: SQL %d µs, Go %s (off by %s)", p, attempt, u, got, want, diff)
						}
					}
				}
			}
		}
	}
	if cases < 300 {
		t.Fatalf("only %d cases ran", cases)
	}
}

// TestSQLRandomWithinBounds runs the expression as production does (u =
// random(), attempt from an int column) and checks every delay lies in
// Bounds, and that the draws differ per row.
func TestSQLRandomWithinBounds(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t).Pool
	ctx := context.Background()
	p := backoff.Policy{Base: 100 * time.Millisecond, Max: time.Minute, Jitter: 0.2}
	baseMS, maxMS, j := p.SQLArgs()
	query := `SELECT a, (extract(epoch FROM ` + backoff.SQL("a", "$1", "$2", "$3", "random()") + `) * 1000000)::bigint
		FROM generate_series(1, 12) AS a, generate_series(1, 50)`
	rows, err := db.Query(ctx, query, baseMS, maxMS, j)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[int]map[int64]bool{}
	for rows.Next() {
		var attempt int
		var us int64
		if err := rows.Scan(&attempt, &us); err != nil {
			t.Fatal(err)
		}
		d := time.Duration(us) * time.Microsecond
		lo, hi := p.Bounds(attempt)
		if d < lo-time.Microsecond || d > hi+time.Microsecond {
			t.Fatalf("attempt %d: SQL delay %s outside Bounds [%s, %s]", attempt, d, lo, hi)
		}
		if seen[attempt] == nil {
			seen[attempt] = map[int64]bool{}
		}
		seen[attempt][us] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 12; attempt++ {
		if len(seen[attempt]) < 40 {
			t.Fatalf("attempt %d: %d distinct delays in 50 rows: random() is not drawn per row", attempt, len(seen[attempt]))
		}
	}
}
