package task

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// ReserveInTx reserves starts for ids of kind as StartLimited does for a
// rate-limited kind, in the caller's transaction tx (which may have begun
// long before), and returns the chosen ids.
func ReserveInTx(ctx context.Context, tx pgx.Tx, kind string, ids []uuid.UUID) ([]uuid.UUID, error) {
	var (
		found, limited, rated   bool
		chosen, newSlots, other []uuid.UUID
	)
	err := tx.SendBatch(ctx, reserveBatch(pgplan.Settings, kind, ids, true, func(row pgx.Row) error {
		return row.Scan(&found, &limited, &rated, &chosen, &newSlots, &other)
	})).Close()
	return chosen, err
}

// RateLogMargin is rateLogMargin, for tests that wait past it.
const RateLogMargin = rateLogMargin

// planIDs and planOwner are example arguments of the plan tests' statements.
const planIDs, planOwner = `'{00000000-0000-7000-8000-000000000001,00000000-0000-7000-8000-000000000002}'`, `'w'`

// HotStatements are the statements of the hot path and the redrive, by
// name, each with example arguments as SQL literals (for the plan tests,
// which EXPLAIN EXECUTE them): those of HotPathStatements that a task's
// run sends, and the redrive.
func HotStatements() map[string][2]string {
	all := HotPathStatements()
	out := map[string][2]string{"redrive": {redriveSQL, planIDs}}
	for _, name := range []string{"start", "renew", "succeed", "progress", "fail", "release"} {
		out[name] = [2]string{all[name][1], all[name][2]}
	}
	return out
}

// RescueStatements are the rescuer's candidate queries and its re-check,
// each with example arguments as SQL literals (for the plan test).
func RescueStatements() map[string][2]string {
	const page = `'00000000-0000-0000-0000-000000000000', 100, 60000`
	return map[string][2]string{
		"queued":        {rescueSQL[RescueQueued], page},
		"retrying":      {rescueSQL[RescueRetrying], page},
		"running":       {rescueSQL[RescueRunning], page},
		"still-missing": {stillMissingSQL, `'{00000000-0000-7000-8000-000000000001}', '{0}'`},
	}
}

// ParkedStatements are the statements that find a kind's parked tasks on
// ingest_task_parked_idx, each with example arguments as SQL literals
// (for the plan test).
func ParkedStatements() map[string][2]string {
	return map[string][2]string{
		"any-parked": {anyParkedSQL, `'plan'`},
		"unpark":     {unparkSQL, `'plan', 1000`},
	}
}

// RetentionStatements are the statements that delete finished tasks,
// each with example arguments as SQL literals (for the plan test).
func RetentionStatements() map[string][2]string {
	return map[string][2]string{
		"expired":  {expiredSQL, `86400000, 86400000, 604800000, 1000, 86400000`},
		"terminal": {deleteTerminalSQL, `'{00000000-0000-7000-8000-000000000001}'`},
	}
}

// HotPathStatements are every statement that a task's way from creation
// to completion runs, including the kind limits' and the reclaimer's
// (for the plan test on a never-analyzed database): each with the
// settings the code sends it with ("" for none), and example arguments
// as SQL literals.
func HotPathStatements() map[string][3]string {
	const ids, owner = planIDs, planOwner
	p := func(sql, args string) [3]string { return [3]string{pgplan.Settings, sql, args} }
	n := func(sql, args string) [3]string { return [3]string{"", sql, args} }
	c := func(sql, args string) [3]string { return [3]string{pgplan.CountSettings, sql, args} }
	const insertArgs = ids + `, '{plan,plan}', '{"{}","{}"}', '{a,b}', '{"",k}', '{0,0}', '{NULL,NULL}', '{0,0}', '{0,0}', '{"",""}', '{f,f}', '{"",""}', '{0,0}', '{0,0}', '{"",""}', '{f,f}'`
	return map[string][3]string{
		"start":             p(startSQL, ids+", "+owner+", 60000, 1024, 10"),
		"renew":             p(renewSQL, ids+", "+owner+", 60000"),
		"progress":          n(progressSQL, `'00000000-0000-7000-8000-000000000001', 1, 50, 'half', ''`),
		"succeed":           p(succeedSQL, ids+", "+owner+`, '{NULL,"{\"n\": 1}"}'`),
		"fail":              p(failSQL, ids+", "+owner+`, 1, 1000, 0.1, '{boom,boom}', '{f,f}', '{0,0}', '{boom,boom}', 10`),
		"release":           p(handBackSQL, ids+", "+owner+", 'released at shutdown'"),
		"current":           p(currentSQL, ids),
		"expired-leases":    p(expiredLeasesSQL, ids+", "+owner),
		"park-due":          p(parkDueSQL, ids),
		"park":              p(parkSQL, ids),
		"not-started":       p(notStartedSQL, ids),
		"in-transit":        p(inTransitSQL, ids),
		"reserve":           p(reserveSQL, `'plan', `+ids+`, 1000, false`),
		"lock-start-kind":   p(lockStartKindSQL, `'plan'`),
		"lock-start-groups": p(lockStartGroupsSQL, `'plan', `+ids),
		"insert-plain":      n(insertPlainSQL, insertArgs),
		"insert-keyed":      n(insertKeyedSQL, insertArgs),
		"any-parked":        n(anyParkedSQL, `'plan'`),
		"key-lookup":        n(keyLookupSQL, `'{plan,plan}', '{a,b}'`),
		"dedup-lookup":      n(dedupLookupSQL, `'{plan,plan}', '{a,b}'`),
		"sequence-head":     n(seqHeadSQL, `'{plan,plan}', '{a,b}'`),
		"unpark":            n(unparkSQL, `'plan', 1000`),
		"parked-counts":     c(parkedCountsSQL, ``),
		"blocked-counts":    c(blockedCountsSQL, `''`),
	}
}

// InsertPlainSQL is the task insert of a batch without idempotency keys
// (for the benchmark that compares it with COPY).
const InsertPlainSQL = insertPlainSQL

// StartSQL is the start statement (for the test of its write).
var StartSQL = startSQL

// ReserveSQL and StartLockSetting are StartLimited's reservation and the
// setting its locks write.
var ReserveSQL = reserveSQL

const StartLockSetting = startLockSetting

// LockReleaseSQL is the lock a release of a kind's parked tasks takes.
const LockReleaseSQL = lockReleaseSQL
