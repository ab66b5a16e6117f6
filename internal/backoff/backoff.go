package backoff

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ingest-worker/ingest/internal/configerr"
)

// Defaults of the task and outbox retry settings (INGEST_REDIS_RETRY_*,
// INGEST_OUTBOX_RETRY_*; docs/ARCHITECTURE.md §5).
const (
	DefaultBase   = time.Second
	DefaultMax    = 10 * time.Minute
	DefaultJitter = 0.1
)

// Default is the policy used when none is configured.
var Default = Policy{Base: DefaultBase, Max: DefaultMax, Jitter: DefaultJitter}

// MaxDoublings caps the exponent attempt-1 in both Delay and SQL. 2^63 ns
// exceeds every time.Duration, so beyond the cap min(Base × 2^(attempt-1),
// Max) is Max for any Base > 0 anyway; the cap only keeps the power finite
// (2^1024 overflows a float64, and PostgreSQL's power() raises an error).
const MaxDoublings = 63

// Policy is a capped, jittered exponential retry delay (see the package
// doc for the formula).
//
// Zero durations are allowed and mean "due at once": Base = Max = 0 retries
// without delay. The zero Policy as a whole is what configurations treat as
// "not set" (it takes Default), so a policy of no delay is written with a
// jitter, e.g. Policy{Jitter: DefaultJitter}: jitter times a zero delay is
// still zero.
type Policy struct {
	// Base is the delay after the first failure; it doubles per failure.
	Base time.Duration
	// Max caps the delay before jitter.
	Max time.Duration
	// Jitter in [0, 1) spreads delays: 0.1 is ±10%.
	Jitter float64
}

// Validate checks the policy and names the bad field: "backoff: Max:
// must be at least Base (1s), got 0s" (a Config that holds a Policy
// reports it as its own field with configerr.Within).
func (p Policy) Validate() error {
	bad := func(setting, format string, args ...any) error {
		return configerr.New("backoff", nil, setting, format, args...)
	}
	switch {
	case p.Base < 0:
		return bad("Base", "must be at least 0s, got %s", p.Base)
	case p.Max < p.Base:
		return bad("Max", "must be at least Base (%s), got %s", p.Base, p.Max)
	case !(p.Jitter >= 0 && p.Jitter < 1): // also refuses NaN
		return bad("Jitter", "must be at least 0 and less than 1, got %v", p.Jitter)
	}
	return nil
}

// Bounds returns the least and the greatest delay after attempt failures:
// Delay(attempt, 0) and the limit of Delay(attempt, u) as u nears 1.
func (p Policy) Bounds(attempt int) (lo, hi time.Duration) {
	c := p.capped(attempt)
	return duration(c * (1 - p.Jitter)), duration(c * (1 + p.Jitter))
}

// Delay returns the delay after attempt failures for the random draw u in
// [0, 1). It is the Go evaluation of the formula SQL writes for PostgreSQL.
func (p Policy) Delay(attempt int, u float64) time.Duration {
	return duration(p.capped(attempt) * (1 + p.Jitter*(2*u-1)))
}

// Random returns Delay(attempt, u) for a uniformly drawn u.
func (p Policy) Random(attempt int) time.Duration {
	return p.Delay(attempt, rand.Float64())
}

// capped is min(Base × 2^(attempt-1), Max) in nanoseconds.
func (p Policy) capped(attempt int) float64 {
	attempt = max(attempt, 1)
	d := float64(p.Base) * math.Pow(2, float64(min(attempt-1, MaxDoublings)))
	return math.Min(d, float64(p.Max))
}

// duration converts ns to a Duration, saturating where a Max near the
// largest Duration times 1 + Jitter would overflow.
func duration(ns float64) time.Duration {
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// SQLArgs returns Base and Max in fractional milliseconds (a policy such as
// 1.5 ms keeps its sub-millisecond part) and Jitter: the values for SQL's
// baseMS, maxMS and jitter parameters.
func (p Policy) SQLArgs() (baseMS, maxMS, jitter float64) {
	return millis(p.Base), millis(p.Max), p.Jitter
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// SQL returns the PostgreSQL expression, of type interval, of the delay
// after attempt failures. Each argument is an SQL expression: attempt an
// integer (failures so far, counting the one being recorded), baseMS and
// maxMS in milliseconds and jitter as SQLArgs returns them (placeholders
// such as "$3" are typed by the expression), and u the random draw,
// "random()" in production (evaluated once per row).
//
// It computes exactly what Policy.Delay computes, in milliseconds of
// float8; PostgreSQL rounds the interval to the microsecond.
func SQL(attempt, baseMS, maxMS, jitter, u string) string {
	return fmt.Sprintf(`(least((%s)::float8 * power(2::float8, least(greatest((%s)::bigint, 1) - 1, %d)), (%s)::float8)`+
		` * (1 + (%s)::float8 * (2 * (%s)::float8 - 1)) * interval '1 millisecond')`,
		baseMS, attempt, MaxDoublings, maxMS, jitter, u)
}
