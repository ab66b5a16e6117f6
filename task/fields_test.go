package task_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// TestMaxAttemptsIsRangeChecked: a max_attempts beyond its range is
// refused naming the field and the range, never stored narrowed to the
// int column (4294967297 was stored as 1, and the task died after one
// failure; 2147483648 failed the column's CHECK as a negative number, an
// internal error). The largest accepted value is stored as it is.
func TestMaxAttemptsIsRangeChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	for _, n := range []int{4294967297, 2147483648, 3000000000, task.MaxAttemptsLimit + 1, -1} {
		_, err := b.store.Create(b.ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), MaxAttempts: n})
		var ferr *task.FieldError
		if !errors.As(err, &ferr) || !errors.Is(err, task.ErrInvalidTask) || ferr.Field != "max_attempts" ||
			!strings.Contains(ferr.Msg, "from 1 to 1000000") || !strings.Contains(ferr.Msg, strconv.Itoa(n)) {
			t.Fatalf("max_attempts %d: %v (%#v), want an invalid max_attempts naming the range", n, err, ferr)
		}
	}
	var n int
	if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM ingest_task`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tasks stored (%v), want none", n, err)
	}
	top := b.create(t, task.NewTask{MaxAttempts: task.MaxAttemptsLimit})
	var stored int64
	if err := b.db.QueryRow(b.ctx, `SELECT max_attempts FROM ingest_task WHERE id = $1`, top.ID).Scan(&stored); err != nil || stored != task.MaxAttemptsLimit {
		t.Fatalf("max_attempts %d stored as %d (%v)", task.MaxAttemptsLimit, stored, err)
	}
	// The store's own limit (INGEST_REDIS_MAX_ATTEMPTS) has the same range.
	if _, err := task.NewStore(task.Config{MaxAttempts: 3000000000}, b.db); err == nil || !strings.Contains(err.Error(), "from 1 to 1000000") {
		t.Fatalf("NewStore with MaxAttempts 3000000000: %v, want an error naming the range", err)
	}
}

// hostileNames are names a person could be fooled or attacked by on a
// terminal or a page: terminal escapes, bidirectional overrides, new lines,
// C1 controls, DEL, and bytes that are not UTF-8.
var hostileNames = []string{
	"esc\x1b[2J\x1b]0;pwned\a",
	"abc\u202edef",
	"two\nlines",
	"tab\tbed",
	"cr\rx",
	"nel\u0085x",
	"csi\u009b2J",
	"del\x7f",
	"iso\u2066late",
	"lrm\u200e",
	"alm\u061c",
	"ls\u2028x",
	"bad\xffutf8",
	"nul\x00",
}

// TestNamesRefuseControlAndBidiCharacters: a kind or an idempotency key
// holding a control character, a bidirectional control or bytes that are
// not UTF-8 is refused at create, naming the field; so is such a kind given
// to the kind settings. Names of other scripts, emoji and spaces inside
// are names.
func TestNamesRefuseControlAndBidiCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	for _, name := range hostileNames {
		for field, nt := range map[string]task.NewTask{
			"kind":            {Kind: name, Payload: json.RawMessage(`{}`)},
			"idempotency_key": {Kind: "k", Payload: json.RawMessage(`{}`), IdempotencyKey: name},
		} {
			_, err := b.store.Create(b.ctx, nt)
			var ferr *task.FieldError
			if !errors.As(err, &ferr) || ferr.Field != field || !errors.Is(err, task.ErrInvalidTask) {
				t.Errorf("%s %q: %v, want an invalid %s", field, name, err, field)
			} else if strings.ContainsFunc(ferr.Msg, func(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == 0x202e }) {
				t.Errorf("%s %q: the message %q quotes the character as it is", field, name, ferr.Msg)
			}
		}
		paused := true
		_, err := b.store.SetKind(b.ctx, "test", name, task.KindUpdate{Paused: &paused})
		var ferr *task.FieldError
		if !errors.As(err, &ferr) || ferr.Field != "kind" {
			t.Errorf("SetKind(%q): %v, want an invalid kind", name, err)
		}
	}
	var n int
	if err := b.db.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM ingest_task) + (SELECT count(*) FROM ingest_kind)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows stored (%v), want none", n, err)
	}
	for _, name := range []string{"email.send", "отчёт", "日本語 kind", "emoji 👩‍💻", `back\slash`, "a b"} {
		b.create(t, task.NewTask{Kind: name, IdempotencyKey: name})
	}
}

// TestFiltersRefuseBytesPostgresCannotTake: a NUL or bytes that are not
// UTF-8 in a filter or a note (List's kind, a bulk redrive's kind and
// error_contains, a cancel's reason) are refused naming the field, instead
// of failing in PostgreSQL as an internal error. A filter may hold other
// control characters: it finds rows stored before names were checked.
func TestFiltersRefuseBytesPostgresCannotTake(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	tk := b.create(t, task.NewTask{})
	wantField := func(what string, err error, field string) {
		t.Helper()
		var ferr *task.FieldError
		if !errors.As(err, &ferr) || ferr.Field != field || !errors.Is(err, task.ErrInvalidTask) {
			t.Fatalf("%s: %v, want an invalid %s", what, err, field)
		}
	}
	for _, bad := range []string{"\x00", "a\x00", "\xff", "k\xc3"} {
		_, _, err := b.store.List(b.ctx, task.ListParams{Kind: bad})
		wantField("List kind "+strconv.Quote(bad), err, "kind")
		_, err = b.store.RedriveMatching(b.ctx, "test", task.RedriveFilter{Status: task.Dead, Kind: bad}, task.RedriveOptions{DryRun: true})
		wantField("RedriveMatching kind "+strconv.Quote(bad), err, "kind")
		_, err = b.store.RedriveMatching(b.ctx, "test", task.RedriveFilter{Status: task.Dead, ErrorContains: bad}, task.RedriveOptions{DryRun: true})
		wantField("RedriveMatching error_contains "+strconv.Quote(bad), err, "error_contains")
		_, err = b.store.Cancel(b.ctx, "test", "why"+bad, tk.ID)
		wantField("Cancel reason "+strconv.Quote(bad), err, "reason")
	}
	if got, err := b.store.Get(b.ctx, tk.ID); err != nil || got.Status != task.Queued {
		t.Fatalf("after refused cancels: %+v, %v; want QUEUED", got, err)
	}
	if tasks, _, err := b.store.List(b.ctx, task.ListParams{Kind: "esc\x1b"}); err != nil || len(tasks) != 0 {
		t.Fatalf("a kind filter with ESC: %d tasks, %v; want none and no error", len(tasks), err)
	}
	_, _, err := b.store.List(b.ctx, task.ListParams{Limit: task.MaxListLimit + 1})
	wantField("List limit", err, "limit")
	_, _, err = b.store.List(b.ctx, task.ListParams{Cursor: "not-a-cursor"})
	wantField("List cursor", err, "cursor")
	_, err = b.store.RedriveMatching(b.ctx, "test", task.RedriveFilter{Status: task.Dead}, task.RedriveOptions{Rate: 1e-300})
	wantField("RedriveMatching rate 1e-300", err, "rate")
}

// FuzzRanges: for every value, a Range accepts exactly the values between
// its bounds, Parse agrees with Check, and Millis converts an accepted
// count of milliseconds to the same duration (no overflow); a new task's
// max_attempts, delay and timeout are accepted exactly in their ranges.
// Run: go test -run='^$' -fuzz='^FuzzRanges$' ./task
func FuzzRanges(f *testing.F) {
	for _, v := range []int64{0, 1, -1, 4294967297, 2147483648, 1_000_000, 1_000_001, 1 << 62, -1 << 63, 1<<63 - 1, 9223372036854775} {
		f.Add(v)
	}
	ranges := []task.Range{task.MaxAttemptsRange, task.DelayRange, task.TimeoutRange, task.ListLimitRange,
		task.RedriveLimitRange, task.ConcurrencyRange, task.PayloadBytesRange}
	f.Fuzz(func(t *testing.T, v int64) {
		for _, r := range ranges {
			in := v >= r.Min && v <= r.Max
			ferr := r.Check(v)
			if (ferr == nil) != in {
				t.Fatalf("%s.Check(%d) = %v, in range %v", r.Field, v, ferr, in)
			}
			if ferr != nil && (ferr.Field != r.Field || !strings.Contains(ferr.Msg, r.Text()) || !errors.Is(ferr, task.ErrInvalidTask)) {
				t.Fatalf("%s.Check(%d) = %#v: does not name the field and the range", r.Field, v, ferr)
			}
			if n, perr := r.Parse(strconv.FormatInt(v, 10)); (perr == nil) != in || (in && n != v) {
				t.Fatalf("%s.Parse(%d) = %d, %v", r.Field, v, n, perr)
			}
			if d, merr := r.Millis(v); (merr == nil) != in || (in && (d < 0 || d.Milliseconds() != v)) {
				t.Fatalf("%s.Millis(%d) = %s, %v", r.Field, v, d, merr)
			}
		}
		nt := task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), MaxAttempts: int(v)}
		if ferr := nt.Validate(1 << 20); (ferr == nil) != (v == 0 || task.MaxAttemptsRange.Contains(v)) {
			t.Fatalf("max_attempts %d: %v", v, ferr)
		}
		nt = task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), Delay: time.Duration(v)}
		if ferr := nt.Validate(1 << 20); (ferr == nil) != (v >= 0 && time.Duration(v) <= task.MaxDelay) {
			t.Fatalf("delay %s: %v", time.Duration(v), ferr)
		}
		nt = task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), Timeout: time.Duration(v)}
		if ferr := nt.Validate(1 << 20); (ferr == nil) != (v == 0 || (time.Duration(v) >= time.Millisecond && time.Duration(v) <= task.MaxTimeout)) {
			t.Fatalf("timeout %s: %v", time.Duration(v), ferr)
		}
	})
}
