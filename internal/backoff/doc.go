// Package backoff owns the retry delay policy of failed task runs and failed
// outbox publishes: its defaults, its validation, and its one formula,
//
//	delay(attempt) = min(Base × 2^(attempt-1), Max) × (1 + Jitter × (2u - 1))
//
// where attempt is the number of failures so far (below 1 counts as 1) and
// u, uniform in [0, 1), is the random draw. The formula exists twice, in
// one place: Policy.Delay evaluates it in Go (the oracle tests compare
// against), and SQL writes it as a PostgreSQL expression for the guarded
// UPDATEs that decide a retry inside the database (package task's Fail, the
// outbox relay's failed publishes). Both cap the exponent at the same
// MaxDoublings and compute in fractional milliseconds, so they agree to the
// microsecond, the resolution of a PostgreSQL interval.
package backoff
