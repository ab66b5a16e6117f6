//go:build reliability

package chaos

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/task"
)

// row is one line of the results table.
type row struct {
	Scenario   string
	Tasks      int
	Faults     int
	Lost       int
	Stuck      int
	Duplicates int
	DupBound   int
	Recovery   time.Duration
	Elapsed    time.Duration
	Notes      string
	Failed     bool
}

var report struct {
	mu   sync.Mutex
	rows []row
}

func addRow(r row) {
	report.mu.Lock()
	defer report.mu.Unlock()
	report.rows = append(report.rows, r)
}

// amendRow adds a note to the row of scenario, and marks it failed when
// failed: checks a scenario makes after finish.
func amendRow(scenario, note string, failed bool) {
	report.mu.Lock()
	defer report.mu.Unlock()
	for i := range report.rows {
		if report.rows[i].Scenario == scenario {
			report.rows[i].Notes = joinNote(report.rows[i].Notes, note)
			report.rows[i].Failed = report.rows[i].Failed || failed
		}
	}
}

func table() string {
	report.mu.Lock()
	defer report.mu.Unlock()
	var b strings.Builder
	form := "short"
	if long() {
		form = "long"
	}
	fmt.Fprintf(&b, "Reliability suite, %s form\n\n", form)
	b.WriteString("| scenario | tasks | faults | lost | stuck | duplicates (bound) | recovery | elapsed | result | notes |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range report.rows {
		res := "pass"
		if r.Failed {
			res = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d (%d) | %s | %s | %s | %s |\n", r.Scenario, r.Tasks, r.Faults,
			r.Lost, r.Stuck, r.Duplicates, r.DupBound, r.Recovery.Round(10*time.Millisecond), r.Elapsed.Round(100*time.Millisecond), res, strings.ReplaceAll(r.Notes, "|", `\|`))
	}
	return b.String()
}

func writeReport() {
	if len(report.rows) == 0 {
		return
	}
	t := table()
	fmt.Println(t)
	if path := os.Getenv("INGEST_CHAOS_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(t), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "write report:", err)
		}
	}
}

// expect says what a scenario's invariants allow.
type expect struct {
	// deadKinds are the kinds whose tasks must end DEAD; all others must
	// end SUCCEEDED.
	deadKinds []string
	// poison is the number of malformed entries injected: each must be in
	// the DLQ.
	poison int
	// noDuplicates demands zero duplicate executions whatever the faults.
	noDuplicates bool
}

// verify waits for quiet, then checks every invariant, fills r and reports
// violations as test errors.
func (c *cluster) verify(r *row, e expect) {
	c.t.Helper()
	quiet, ok := c.waitQuiet(quietTimeout())
	if !ok {
		c.t.Errorf("not quiet after %s: %d tasks not terminal, %d entries pending", quiet,
			c.query(`SELECT count(*) FROM ingest_task WHERE status IN ('QUEUED', 'RUNNING', 'RETRYING')`), c.pending())
	}
	ctx := context.Background()
	failed := func(format string, args ...any) {
		c.t.Helper()
		r.Failed = true
		c.t.Errorf(format, args...)
	}

	// Tasks and their states.
	type tk struct {
		kind   string
		status task.State
	}
	tasks := map[uuid.UUID]tk{}
	rows, _ := c.db.Pool.Query(ctx, `SELECT id, kind, status FROM ingest_task`)
	for rows.Next() {
		var id uuid.UUID
		var t tk
		if err := rows.Scan(&id, &t.kind, &t.status); err != nil {
			c.t.Fatal(err)
		}
		tasks[id] = t
	}
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	r.Tasks = len(tasks)
	mustDie := map[string]bool{}
	for _, k := range e.deadKinds {
		mustDie[k] = true
	}
	dead := map[uuid.UUID]bool{}
	var wrongEnd []string
	for id, t := range tasks {
		switch {
		case !t.status.Terminal():
			r.Stuck++
		case t.status == task.Dead:
			dead[id] = true
			if !mustDie[t.kind] {
				r.Lost++
				wrongEnd = append(wrongEnd, fmt.Sprintf("%s %s DEAD", t.kind, id))
			}
		case mustDie[t.kind]:
			wrongEnd = append(wrongEnd, fmt.Sprintf("%s %s SUCCEEDED", t.kind, id))
		}
	}
	if r.Stuck > 0 {
		failed("%d tasks not SUCCEEDED or DEAD", r.Stuck)
	}
	if len(wrongEnd) > 0 {
		failed("%d tasks ended in the wrong state, e.g. %v", len(wrongEnd), first(wrongEnd, 5))
	}

	// Transitions: a valid path from creation, exactly one terminal
	// transition, ending in the task's state.
	rows, _ = c.db.Pool.Query(ctx, `SELECT task_id, coalesce(from_status, ''), to_status, coalesce(message, '') FROM ingest_task_transition ORDER BY task_id, id`)
	paths := map[uuid.UUID][][2]task.State{}
	// Takeovers of expired leases, by whether the owner was killed by the
	// suite: the tasks a killed worker held are exactly those taken over
	// from it (they were in flight when it died).
	killed := c.killedConsumers()
	fromKilled, fromLive := 0, 0
	var liveTakeovers []string
	for rows.Next() {
		var id uuid.UUID
		var from, to task.State
		var msg string
		if err := rows.Scan(&id, &from, &to, &msg); err != nil {
			c.t.Fatal(err)
		}
		paths[id] = append(paths[id], [2]task.State{from, to})
		if owner, ok := takeoverOwner(from, msg); ok {
			if killed[owner] {
				fromKilled++
			} else {
				fromLive++
				liveTakeovers = append(liveTakeovers, id.String())
			}
		}
	}
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	var bad []string
	for id, t := range tasks {
		if msg := checkPath(paths[id], t.status); msg != "" {
			bad = append(bad, fmt.Sprintf("%s: %s", id, msg))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		failed("%d tasks with an invalid transition path, e.g. %v", len(bad), first(bad, 5))
	}

	// Side effects.
	effects := map[uuid.UUID]int{}
	rows, _ = c.db.Pool.Query(ctx, `SELECT task_id, count(*) FROM chaos_effect GROUP BY task_id`)
	for rows.Next() {
		var id uuid.UUID
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			c.t.Fatal(err)
		}
		effects[id] = n
	}
	if err := rows.Err(); err != nil {
		c.t.Fatal(err)
	}
	var unexecuted []string
	for id, t := range tasks {
		if t.status != task.Succeeded {
			continue
		}
		switch n := effects[id]; {
		case n == 0:
			r.Lost++
			unexecuted = append(unexecuted, id.String())
		case n > 1:
			r.Duplicates += n - 1
		}
	}
	if len(unexecuted) > 0 {
		failed("%d SUCCEEDED tasks never executed, e.g. %v", len(unexecuted), first(unexecuted, 5))
	}
	r.Faults = int(c.faults.Load())
	r.DupBound = int(c.inflight.Load()) + fromKilled
	if e.noDuplicates {
		r.DupBound = 0
	}
	if r.Duplicates > r.DupBound {
		failed("%d duplicate executions, more than the %d tasks in flight at the faults", r.Duplicates, r.DupBound)
	}
	if fromKilled+fromLive > 0 {
		r.Notes = joinNote(r.Notes, fmt.Sprintf("lease takeovers: %d from killed workers, %d from live ones", fromKilled, fromLive))
	}
	for _, id := range first(liveTakeovers, 3) {
		c.t.Logf("task %s was taken over from a live worker; its story:\n%s", id, c.story(id))
	}

	// Redis: nothing pending; the DLQ holds exactly the DEAD tasks and the
	// poison entries. An entry delivered just now is not left pending: a
	// duplicate that a relay frozen past its lease XADDs as it wakes (its
	// rows were published by the relay that took them over) may reach a
	// worker after the quiet above, and is acked once its start is
	// refused, within milliseconds. So the check awaits an empty PEL; an
	// entry left pending stays and fails it.
	if p := c.pendingAfter(pendingSettle); p != 0 {
		failed("XPENDING %s: %d entries pending, want 0", c.stream, p)
		c.logPending(ctx)
	}
	entries, err := c.admin.XRange(ctx, c.dlq, "-", "+").Result()
	if err != nil {
		c.t.Fatalf("XRANGE %s: %v", c.dlq, err)
	}
	inDLQ := map[uuid.UUID]int{}
	poison := 0
	for _, m := range entries {
		s, _ := m.Values["task_id"].(string)
		id, err := uuid.Parse(s)
		if _, known := tasks[id]; err != nil || len(s) != 36 || !known {
			poison++
			continue
		}
		inDLQ[id]++
	}
	var notInDLQ, notDead, twice []string
	for id := range dead {
		if inDLQ[id] == 0 {
			notInDLQ = append(notInDLQ, id.String())
		}
	}
	for id, n := range inDLQ {
		if !dead[id] {
			notDead = append(notDead, id.String())
		}
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s×%d", id, n))
		}
	}
	if len(notInDLQ) > 0 {
		failed("%d DEAD tasks missing from the DLQ, e.g. %v", len(notInDLQ), first(notInDLQ, 5))
	}
	if len(notDead) > 0 {
		failed("%d DLQ entries of tasks that are not DEAD, e.g. %v", len(notDead), first(notDead, 5))
	}
	if len(twice) > 0 {
		failed("%d DEAD tasks in the DLQ more than once, e.g. %v", len(twice), first(twice, 5))
	}
	if poison != e.poison {
		failed("%d poison entries in the DLQ, want %d", poison, e.poison)
	}
	if n := c.crashes.Load(); n > 0 {
		failed("%d worker processes exited on their own", n)
	}
	if len(dead) > 0 || poison > 0 {
		r.Notes = joinNote(r.Notes, fmt.Sprintf("%d DEAD, %d poison in DLQ", len(dead), poison))
	}
	if c.t.Failed() {
		r.Failed = true
	}
}

// takeoverOwner returns the previous owner of a takeover transition (its
// message is "lease of <owner> expired: run abandoned").
func takeoverOwner(from task.State, msg string) (string, bool) {
	if from != task.Running {
		return "", false
	}
	rest, ok := strings.CutPrefix(msg, "lease of ")
	if !ok {
		return "", false
	}
	owner, _, ok := strings.Cut(rest, " expired")
	return owner, ok
}

// checkPath checks one task's transitions; "" when valid.
func checkPath(p [][2]task.State, final task.State) string {
	if len(p) == 0 {
		return "no transitions"
	}
	if p[0][0] != "" || p[0][1] != task.Queued {
		return fmt.Sprintf("starts %q → %s, want creation → QUEUED", p[0][0], p[0][1])
	}
	terminal := 0
	for i, tr := range p {
		if i > 0 && tr[0] != p[i-1][1] {
			return fmt.Sprintf("transition %d starts at %s but the previous one ended at %s", i, tr[0], p[i-1][1])
		}
		if !task.CanTransition(tr[0], tr[1]) {
			return fmt.Sprintf("transition %d %s → %s is not allowed", i, tr[0], tr[1])
		}
		if tr[1].Terminal() {
			terminal++
		}
	}
	if terminal != 1 {
		return fmt.Sprintf("%d terminal transitions, want 1", terminal)
	}
	if last := p[len(p)-1][1]; last != final {
		return fmt.Sprintf("path ends at %s but the task is %s", last, final)
	}
	return ""
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// finish verifies the invariants, records the row and returns it.
func (c *cluster) finish(r row, e expect, start time.Time) row {
	c.t.Helper()
	c.verify(&r, e)
	r.Elapsed = time.Since(start)
	c.t.Logf("%s: tasks=%d faults=%d lost=%d stuck=%d duplicates=%d (bound %d) recovery=%s elapsed=%s %s",
		r.Scenario, r.Tasks, r.Faults, r.Lost, r.Stuck, r.Duplicates, r.DupBound, r.Recovery, r.Elapsed, r.Notes)
	addRow(r)
	return r
}

// story returns a task's transitions and the worker log lines that name it.
func (c *cluster) story(id string) string {
	var b strings.Builder
	rows, err := c.db.Pool.Query(context.Background(), `SELECT created_at, coalesce(from_status, ''), to_status, attempt_count, coalesce(worker, ''), coalesce(message, '')
		FROM ingest_task_transition WHERE task_id = $1 ORDER BY id`, id)
	if err == nil {
		for rows.Next() {
			var at time.Time
			var from, to, worker, msg string
			var n int
			_ = rows.Scan(&at, &from, &to, &n, &worker, &msg)
			fmt.Fprintf(&b, "  %s %s → %s attempts=%d worker=%s %q\n", at.Format("15:04:05.000"), from, to, n, worker, msg)
		}
		rows.Close()
	}
	rows, err = c.db.Pool.Query(context.Background(), `SELECT run_at, worker FROM chaos_effect WHERE task_id = $1 ORDER BY run_at`, id)
	if err == nil {
		for rows.Next() {
			var at time.Time
			var worker string
			_ = rows.Scan(&at, &worker)
			fmt.Fprintf(&b, "  %s executed by %s\n", at.Format("15:04:05.000"), worker)
		}
		rows.Close()
	}
	c.mu.Lock()
	ps := c.procs
	c.mu.Unlock()
	for _, p := range ps {
		data, _ := os.ReadFile(p.log)
		for _, l := range strings.Split(string(data), "\n") {
			if strings.Contains(l, id) {
				fmt.Fprintf(&b, "  [%s] %s\n", p.name, l)
			}
		}
	}
	return b.String()
}

// logPending logs the pending entries left after a scenario: their
// consumer, idle time and deliveries, and the state of their task, to tell
// what held them.
func (c *cluster) logPending(ctx context.Context) {
	ps, err := c.admin.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: c.stream, Group: "ingest-workers", Start: "-", End: "+", Count: 20}).Result()
	if err != nil {
		c.t.Logf("XPENDING %s: %v", c.stream, err)
		return
	}
	for _, p := range ps {
		state := "no entry"
		if ms, err := c.admin.XRangeN(ctx, c.stream, p.ID, p.ID, 1).Result(); err == nil && len(ms) == 1 {
			id, _ := ms[0].Values["task_id"].(string)
			var status string
			_ = c.db.Pool.QueryRow(ctx, `SELECT status FROM ingest_task WHERE id::text = $1`, id).Scan(&status)
			state = "task " + id + " " + status
		}
		c.t.Logf("pending %s: consumer %s, idle %s, delivered %d times; %s", p.ID, p.Consumer, p.Idle, p.RetryCount, state)
	}
}
