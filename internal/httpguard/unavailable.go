package httpguard

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
	"github.com/redis/go-redis/v9"
)

// RetryAfter is what a 503 asks the client to wait before it retries
// (the Retry-After header, in whole seconds).
const RetryAfter = 5 * time.Second

// RetryAfterHeader is RetryAfter as the value of a Retry-After header.
func RetryAfterHeader() string { return strconv.Itoa(int(RetryAfter / time.Second)) }

// Unavailable reports whether err means that PostgreSQL or Redis cannot be
// reached at the moment, so that the same request may succeed later: a
// failed or refused connection (pgconn.ConnectError, a dial or network
// error, a reset or cut connection), a closed pool or client, a
// connection-pool timeout, a network timeout or an expired deadline, PostgreSQL shutting down,
// starting up or out of connections (SQLSTATE class 08, 57P01-57P03,
// 53300), Redis loading its data set or a cluster without a master
// (LOADING, CLUSTERDOWN, MASTERDOWN, TRYAGAIN, max clients). A context
// cancelled by the client is not one of them, nor is any error the
// server answered about the request itself.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") ||
			pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03" || pgErr.Code == "53300"
	}
	if errors.Is(err, puddle.ErrClosedPool) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return true
	}
	if redis.IsLoadingError(err) || redis.IsClusterDownError(err) || redis.IsMasterDownError(err) ||
		redis.IsTryAgainError(err) || redis.IsMaxClientsError(err) {
		return true
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	if errors.As(err, &opErr) || errors.As(err, &dnsErr) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
