package testenv

import (
	"context"
	"github.com/redis/go-redis/v9"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

func TestNewDatabaseIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	a, b := NewDatabase(t), NewDatabase(t)
	if a.Name == b.Name {
		t.Fatalf("two tests got the same database %s", a.Name)
	}
	ctx := context.Background()
	for _, db := range []*Database{a, b} {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task`).Scan(&n); err != nil {
			t.Fatalf("%s: ingest_task missing: %v", db.Name, err)
		}
	}
	if _, err := a.Pool.Exec(ctx, `CREATE TABLE only_in_a (x int)`); err != nil {
		t.Fatal(err)
	}
	var exists bool
	if err := b.Pool.QueryRow(ctx, `SELECT to_regclass('only_in_a') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("databases are not isolated: exists=%v err=%v", exists, err)
	}
}

func TestRedisBackendsAnswer(t *testing.T) {
	t.Parallel()
	RedisBackends(t, func(t *testing.T, b Backend) {
		stream, _ := Keys(t)
		if err := b.Client.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []string{"k", "v"}}).Err(); err != nil {
			t.Fatalf("%s: XADD: %v", b.Name, err)
		}
	})
}
