package pguuid_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/pguuid"
)

func connect(tb testing.TB, register bool) *pgx.Conn {
	tb.Helper()
	db := testenv.NewEmptyDatabase(tb)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		tb.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg.ConnConfig)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	if register {
		pguuid.Register(conn.TypeMap())
	}
	return conn
}

// TestRoundTrip: with the types registered, uuid.UUID values, arrays of
// them and NULLs go to PostgreSQL and back unchanged, in both the binary
// and the text protocol, and a uuid.UUID given for a text parameter is
// still its canonical string.
func TestRoundTrip(t *testing.T) {
	conn := connect(t, true)
	ctx := context.Background()
	id := uuid.MustParse("0195a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
	ids := []uuid.UUID{uuid.New(), id, uuid.Nil}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec} {
		var got uuid.UUID
		var gotIDs []uuid.UUID
		var null *uuid.UUID
		var text, fromSQL string
		if err := conn.QueryRow(ctx, `SELECT $1::uuid, $2::uuid[], $3::uuid, $4::text, $1::uuid::text`, mode,
			id, ids, (*uuid.UUID)(nil), id).Scan(&got, &gotIDs, &null, &text, &fromSQL); err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if got != id || fromSQL != id.String() || text != id.String() {
			t.Errorf("mode %v: got %s (PostgreSQL read %s, text parameter %s), want %s", mode, got, fromSQL, text, id)
		}
		if len(gotIDs) != len(ids) || gotIDs[0] != ids[0] || gotIDs[1] != ids[1] || gotIDs[2] != ids[2] {
			t.Errorf("mode %v: array %v, want %v", mode, gotIDs, ids)
		}
		if null != nil {
			t.Errorf("mode %v: NULL scanned as %s", mode, null)
		}
	}
	// Other Go types for uuid columns are handled as before.
	var s string
	if err := conn.QueryRow(ctx, `SELECT $1::uuid::text`, id.String()).Scan(&s); err != nil || s != id.String() {
		t.Errorf("a string for a uuid parameter: %q, %v", s, err)
	}
}

// BenchmarkEncodeIDs encodes and sends an array of 1,000 task ids, as the
// hot statements do, with and without the registered types.
func BenchmarkEncodeIDs(b *testing.B) {
	ids := make([]uuid.UUID, 1000)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	for _, c := range []struct {
		name     string
		register bool
	}{{"pgx-default", false}, {"registered", true}} {
		b.Run(c.name, func(b *testing.B) {
			conn := connect(b, c.register)
			ctx := context.Background()
			for b.Loop() {
				var n int
				if err := conn.QueryRow(ctx, `SELECT cardinality($1::uuid[])`, ids).Scan(&n); err != nil || n != len(ids) {
					b.Fatal(n, err)
				}
			}
		})
	}
}
