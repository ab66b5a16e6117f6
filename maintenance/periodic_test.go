package maintenance_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestScheduleNext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		s     maintenance.Schedule
		after string
		want  []string // the next slots, in order
	}{
		{"Every30s", maintenance.Schedule{Every: 30 * time.Second}, "2026-03-01T10:00:05Z",
			[]string{"2026-03-01T10:00:30Z", "2026-03-01T10:01:00Z", "2026-03-01T10:01:30Z"}},
		{"EveryOnASlot", maintenance.Schedule{Every: 30 * time.Second}, "2026-03-01T10:00:30Z",
			[]string{"2026-03-01T10:01:00Z"}},
		{"EveryHourFromTheEpoch", maintenance.Schedule{Every: time.Hour}, "2026-03-01T10:59:59Z",
			[]string{"2026-03-01T11:00:00Z", "2026-03-01T12:00:00Z"}},
		{"Every7sFromTheEpoch", maintenance.Schedule{Every: 7 * time.Second}, "1970-01-01T00:00:13Z",
			[]string{"1970-01-01T00:00:14Z", "1970-01-01T00:00:21Z"}},
		{"EveryBeforeTheEpoch", maintenance.Schedule{Every: 7 * time.Second}, "1969-12-31T23:59:55Z",
			[]string{"1970-01-01T00:00:00Z", "1970-01-01T00:00:07Z"}},
		{"CronDaily", maintenance.Schedule{Cron: "0 3 * * *"}, "2026-03-01T03:00:00Z",
			[]string{"2026-03-02T03:00:00Z", "2026-03-03T03:00:00Z"}},
		{"CronBeforeToday", maintenance.Schedule{Cron: "0 3 * * *"}, "2026-03-01T02:59:59Z",
			[]string{"2026-03-01T03:00:00Z"}},
		{"CronQuarterHours", maintenance.Schedule{Cron: "*/15 * * * *"}, "2026-03-01T10:07:00Z",
			[]string{"2026-03-01T10:15:00Z", "2026-03-01T10:30:00Z", "2026-03-01T10:45:00Z", "2026-03-01T11:00:00Z"}},
		{"CronDescriptor", maintenance.Schedule{Cron: "@hourly"}, "2026-03-01T10:07:00Z",
			[]string{"2026-03-01T11:00:00Z"}},
		{"CronLocalInputIsUTC", maintenance.Schedule{Cron: "0 3 * * *"}, "2026-03-01T05:00:00+03:00",
			[]string{"2026-03-01T03:00:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := utc(tt.after)
			for _, w := range tt.want {
				at = tt.s.Next(at)
				if !at.Equal(utc(w)) || at.Location() != time.UTC {
					t.Fatalf("next slot %v, want %s (UTC)", at, w)
				}
			}
		})
	}
	if got := maintenance.PeriodicKey("sync", utc("2026-03-01T10:00:30+01:00")); got != "periodic:sync:2026-03-01T09:00:30Z" {
		t.Errorf("PeriodicKey = %q", got)
	}
}

func TestParseSchedules(t *testing.T) {
	t.Parallel()
	got, err := maintenance.ParseSchedules("INGEST_PERIODIC",
		[]byte(`[{"kind":"sync","every":"30s"},{"kind":"report","cron":"0 3 * * *","payload":{"x":1}},{"name":"sync-b","kind":"sync","every":"1h","max_attempts":2,"timeout_ms":5000}]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Name != "sync" || got[0].Every != 30*time.Second || string(got[0].Payload) != "{}" ||
		got[1].Cron != "0 3 * * *" || string(got[1].Payload) != `{"x":1}` ||
		got[2].Name != "sync-b" || got[2].MaxAttempts != 2 || got[2].Timeout != 5*time.Second {
		t.Fatalf("parsed %+v", got)
	}
	if s, err := maintenance.ParseSchedules("X", []byte(" ")); err != nil || s != nil {
		t.Fatalf("empty: %v, %v; want none", s, err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"NotArray", `{"kind":"a"}`, "INGEST_PERIODIC: not a JSON array"},
		{"NoKind", `[{"every":"1s"}]`, "INGEST_PERIODIC[0].kind"},
		{"Neither", `[{"kind":"a","every":"1s"},{"kind":"b"}]`, "INGEST_PERIODIC[1].every"},
		{"Both", `[{"kind":"a","every":"1s","cron":"* * * * *"}]`, "INGEST_PERIODIC[0].every"},
		{"BadDuration", `[{"kind":"a","every":"soon"}]`, "INGEST_PERIODIC[0].every"},
		{"TooOften", `[{"kind":"a","every":"10ms"}]`, "INGEST_PERIODIC[0].every: must be at least 1s, got 10ms"},
		{"BadCron", `[{"kind":"a","cron":"61 * * * *"}]`, "INGEST_PERIODIC[0].cron"},
		{"UnknownField", `[{"kind":"a","every":"1s","evry":"2s"}]`, "INGEST_PERIODIC[0]: json: unknown field"},
		{"BadPayload", `[{"kind":"a","every":"1s","payload":"\u0000"}]`, "INGEST_PERIODIC[0].payload"},
		{"DuplicateName", `[{"kind":"a","every":"1s"},{"kind":"a","cron":"@daily"}]`, "INGEST_PERIODIC[1].name"},
		{"NegativeTimeout", `[{"kind":"a","every":"1s","timeout_ms":-1}]`, "INGEST_PERIODIC[0].timeout_ms"},
		// Out of range, not wrapped (18446744073711 ms overflowed to 1.4 ms)
		// nor narrowed to the int column.
		{"HugeTimeout", `[{"kind":"a","every":"1s","timeout_ms":18446744073711}]`, "INGEST_PERIODIC[0].timeout_ms: timeout_ms must be a whole number from 0 to 2147483647"},
		{"HugeMaxAttempts", `[{"kind":"a","every":"1s","max_attempts":4294967297}]`, "INGEST_PERIODIC[0].max_attempts: max_attempts must be a whole number from 1 to 1000000"},
		{"KindWithEscape", `[{"kind":"a\u001b[2J","every":"1s"}]`, "INGEST_PERIODIC[0].kind: kind must not hold control or bidirectional characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := maintenance.ParseSchedules("INGEST_PERIODIC", []byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// The library's configuration is checked the same way.
	err = maintenance.Config{Periodic: maintenance.PeriodicConfig{Schedules: []maintenance.Schedule{{Kind: "a", Every: time.Millisecond}}}}.Validate()
	if !errors.Is(err, maintenance.ErrConfig) || !strings.HasPrefix(err.Error(), "maintenance: Periodic.Schedules[0].every: must be at least 1s") {
		t.Fatalf("Validate = %v, want ErrConfig naming Periodic.Schedules[0].every", err)
	}
}

// slots returns the slot times of the periodic tasks of kind, oldest
// first, from their idempotency keys.
func slots(t *testing.T, store *task.Store, kind string) []time.Time {
	t.Helper()
	var out []time.Time
	cursor := ""
	for {
		ts, next, err := store.List(context.Background(), task.ListParams{Kind: kind, Limit: task.MaxListLimit, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range ts {
			at, ok := strings.CutPrefix(tk.IdempotencyKey, "periodic:"+kind+":")
			if !ok {
				t.Fatalf("task %s has key %q, not a periodic one", tk.ID, tk.IdempotencyKey)
			}
			out = append(out, utc(at))
		}
		if next == "" {
			break
		}
		cursor = next
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// TestPeriodicSkipsMissedSlots drives one periodic service on a test
// clock: a new leadership creates only the latest slot within the grace,
// a running one every slot as it comes, and nothing is created twice.
func TestPeriodicSkipsMissedSlots(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := utc("2026-03-01T10:00:00Z")
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(s string) { mu.Lock(); now = utc(s); mu.Unlock() }
	p, err := maintenance.NewPeriodic(maintenance.PeriodicConfig{Grace: 30 * time.Second, Schedules: []maintenance.Schedule{
		{Kind: "tick", Every: 10 * time.Second},
		{Kind: "daily", Cron: "0 3 * * *"},
	}}, store, clock)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pass := func(at string, wantCreated, wantExisting int) {
		t.Helper()
		set(at)
		c, e, err := p.RunOnce(ctx)
		if err != nil || c != wantCreated || e != wantExisting {
			t.Fatalf("pass at %s: created %d existing %d (%v), want %d and %d", at, c, e, err, wantCreated, wantExisting)
		}
	}
	// A new leader 5 s after a slot: that slot only, not the 2 before it
	// within the grace, nor the daily 03:00 (7 h old).
	pass("2026-03-01T10:00:05Z", 1, 0)
	pass("2026-03-01T10:00:09Z", 0, 0)
	pass("2026-03-01T10:00:10Z", 1, 0)
	pass("2026-03-01T10:00:31Z", 2, 0) // a late pass creates the slots it missed within the grace
	// A new leadership at once: the latest slot exists already.
	p.Reset()
	pass("2026-03-01T10:00:32Z", 0, 1)
	// Everything down for an hour: no burst, the latest slot only.
	p.Reset()
	pass("2026-03-01T11:00:01Z", 1, 0)
	// The daily slot comes while leading.
	pass("2026-03-02T02:59:55Z", 3, 0) // the tick slots within the grace only, not the rest of the night
	pass("2026-03-02T03:00:00Z", 2, 0) // the tick and the daily at 03:00
	want := []time.Time{utc("2026-03-01T10:00:00Z"), utc("2026-03-01T10:00:10Z"), utc("2026-03-01T10:00:20Z"),
		utc("2026-03-01T10:00:30Z"), utc("2026-03-01T11:00:00Z"),
		utc("2026-03-02T02:59:30Z"), utc("2026-03-02T02:59:40Z"), utc("2026-03-02T02:59:50Z"), utc("2026-03-02T03:00:00Z")}
	if got := slots(t, store, "tick"); !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("tick slots %v, want %v", got, want)
	}
	if got := slots(t, store, "daily"); len(got) != 1 || !got[0].Equal(utc("2026-03-02T03:00:00Z")) {
		t.Errorf("daily slots %v, want only 2026-03-02T03:00:00Z", got)
	}
}

// TestPeriodicAcrossLeaders runs three maintainers on one database with a
// schedule every second, takes the leader away mid-run (a graceful stop,
// or its connections cut as if the process died), then stops every
// process, and restarts one after a downtime: one task per slot, no gap
// beyond the failover, no task for the slots of the downtime but the
// latest, and no burst after the restart.
func TestPeriodicAcrossLeaders(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"LeaderStopped", "LeaderCut"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testPeriodicAcrossLeaders(t, mode == "LeaderCut")
		})
	}
}

func testPeriodicAcrossLeaders(t *testing.T, cut bool) {
	database := testenv.NewDatabase(t)
	db := database.Pool
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	// The first leader reaches Postgres through a proxy that can cut it off.
	u, err := url.Parse(database.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.addr()
	poolA, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(poolA.Close)
	cfg := maintenance.Config{
		Elector:         maintenance.ElectorConfig{TTL: time.Second, RetryInterval: 100 * time.Millisecond},
		RescuerDisabled: true, RetentionDisabled: true, ConsumersDisabled: true,
		Periodic: maintenance.PeriodicConfig{Interval: 100 * time.Millisecond, Grace: 5 * time.Second,
			Schedules: []maintenance.Schedule{{Kind: "tick", Every: time.Second}}},
	}
	count := func() int { return len(slots(t, store, "tick")) }
	a := startElected(t, cfg, poolA)
	testenv.Eventually(t, 10*time.Second, "a to lead", a.m.IsLeader)
	es := []*elected{a, startElected(t, cfg, db), startElected(t, cfg, db)}
	if ns := es[0].m.NextSlots(utc("2026-03-01T10:00:00.5Z")); len(ns) != 1 || !ns[0].At.Equal(utc("2026-03-01T10:00:01Z")) ||
		ns[0].IdempotencyKey != "periodic:tick:2026-03-01T10:00:01Z" {
		t.Fatalf("NextSlots = %+v", ns)
	}
	testenv.Eventually(t, 10*time.Second, "3 slots created", func() bool { return count() >= 3 })
	if !a.m.IsLeader() {
		t.Fatal("a no longer leads")
	}
	stopped := time.Now()
	if cut {
		p.close()
	} else {
		a.stop(t)
	}
	testenv.Eventually(t, 30*time.Second, "a new leader", func() bool { return es[1].m.IsLeader() || es[2].m.IsLeader() })
	failover := time.Since(stopped)
	n := count()
	testenv.Eventually(t, 30*time.Second, "3 more slots", func() bool { return count() >= n+3 })
	for _, e := range es {
		e.stop(t)
	}
	down := time.Now()
	before := slots(t, store, "tick")
	for i := 1; i < len(before); i++ {
		// A slot a second, the failover's slots missed at most, and 2 s of
		// room for a new leader's first pass coming after it was seen.
		if gap := before[i].Sub(before[i-1]); gap > 3*time.Second+failover {
			t.Errorf("slots %v and %v: a gap of %s with a failover of %s", before[i-1], before[i], gap, failover)
		}
	}

	// Every process down for 3 slots (the time passing is the scenario).
	time.Sleep(3 * time.Second)
	restarted := time.Now()
	again := startElected(t, cfg, db)
	testenv.Eventually(t, 30*time.Second, "a slot after the restart", func() bool { return count() > len(before) })
	up := time.Now()
	again.stop(t)
	after := slots(t, store, "tick")[len(before):]
	last := before[len(before)-1]
	var inDowntime int
	for _, at := range after {
		if at.Before(restarted) { // a slot of the downtime (up, later, may let more slots come)
			inDowntime++
		}
		if !at.After(last) {
			t.Errorf("slot %v after the restart is not after the last slot before it (%v)", at, last)
		}
	}
	if inDowntime > 1 {
		t.Errorf("the restart created %d slots of the downtime (%v to %v): %v, want at most the latest", inDowntime, down, up, after)
	}
	var created []time.Time
	rows, err := db.Query(context.Background(), `SELECT created_at FROM ingest_task WHERE kind = 'tick'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c time.Time
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		created = append(created, c)
	}
	for _, c := range created {
		if c.After(down) && c.Before(restarted) {
			t.Errorf("a task was created at %v, while every process was down", c)
		}
	}
	t.Logf("failover %s; %d slots before the downtime, %d after the restart", failover, len(before), len(after))
}
