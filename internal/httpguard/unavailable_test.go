package httpguard_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/httpguard"
)

func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	return addr
}

// TestUnavailable: the failures of reaching PostgreSQL and Redis, as the
// clients return them (wrapped as the store wraps them), are told from
// the errors about a request itself.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := closedAddr(t)
	_, pgDown := pgx.Connect(ctx, "postgres://u:pw@"+addr+"/db?connect_timeout=5")
	pool, err := pgxpool.New(ctx, "postgres://u:pw@"+addr+"/db")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	_, poolClosed := pool.Exec(ctx, "SELECT 1")
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	redisDown := rdb.Ping(ctx).Err()
	rdb.Close()
	redisClosed := rdb.Ping(ctx).Err()

	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"PostgresRefused", fmt.Errorf("create task: %w", pgDown), true},
		{"PoolClosed", fmt.Errorf("list: %w", poolClosed), true},
		{"RedisRefused", fmt.Errorf("xlen: %w", redisDown), true},
		{"RedisClientClosed", redisClosed, true},
		{"RedisPoolTimeout", redis.ErrPoolTimeout, true},
		{"AdminShutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"CannotConnectNow", fmt.Errorf("x: %w", &pgconn.PgError{Code: "57P03"}), true},
		{"ConnectionFailure", &pgconn.PgError{Code: "08006"}, true},
		{"TooManyConnections", &pgconn.PgError{Code: "53300"}, true},
		{"Deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"UniqueViolation", &pgconn.PgError{Code: "23505"}, false},
		{"CheckViolation", &pgconn.PgError{Code: "23514"}, false},
		{"InvalidByteSequence", &pgconn.PgError{Code: "22021"}, false},
		{"ClientGone", fmt.Errorf("x: %w", context.Canceled), false},
		{"NoRows", pgx.ErrNoRows, false},
		{"RedisNil", redis.Nil, false},
		{"Other", errors.New("something else"), false},
		{"Nil", nil, false},
	} {
		if tt.err == nil && tt.name != "Nil" {
			t.Fatalf("%s: no error to classify", tt.name)
		}
		if got := httpguard.Unavailable(tt.err); got != tt.want {
			t.Errorf("%s: Unavailable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
	if s, err := strconv.Atoi(httpguard.RetryAfterHeader()); err != nil || time.Duration(s)*time.Second != httpguard.RetryAfter {
		t.Fatalf("RetryAfterHeader %q, RetryAfter %s", httpguard.RetryAfterHeader(), httpguard.RetryAfter)
	}
}
