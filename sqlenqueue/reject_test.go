package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/sqlenqueue"
	"github.com/ingest-worker/ingest/task"
)

// apiError posts body to POST /v1/tasks of handler h and returns the
// error message and field of its refusal.
func apiError(t *testing.T, h http.Handler, body string) (status int, msg, field string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/tasks", strings.NewReader(body)))
	var e struct {
		Error string `json:"error"`
		Field string `json:"field"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("API answer %d %q: %v", rec.Code, rec.Body, err)
	}
	return rec.Code, e.Error, e.Field
}

// TestRejectionsMatchTheAPI sends each bad task to ingest_enqueue and to
// the HTTP API: the function raises the API's message as a coded
// exception (22023, or 54000 where the API answers 413) whose column
// names the API's field, and writes nothing.
func TestRejectionsMatchTheAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	store := newStore(t, db, task.Config{})
	h, err := api.New(api.Config{}, store, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := `"` + strings.Repeat("x", task.DefaultMaxPayloadBytes-1) + `"`
	cases := []struct {
		name, kind, payload, opts string
	}{
		{"kind empty", "", `{}`, `{}`},
		{"kind space", " \t\u00a0\u3000", `{}`, `{}`},
		{"kind too long", strings.Repeat("é", 101), `{}`, `{}`},
		{"kind escape", "a\x1b[2Jb", `{}`, `{}`},
		{"kind del", "ab\x7f", `{}`, `{}`},
		{"kind c1", "a\u0085b", `{}`, `{}`},
		{"kind bidi", "é\u202eb", `{}`, `{}`},
		{"kind line separator", "é\u2028é", `{}`, `{}`},
		{"kind inner newline", "a\nb", `{}`, `{}`},
		{"payload null", "k", `null`, `{}`},
		{"payload too large", "k", big + ` `, `{}`},
		{"unknown option", "k", `{}`, `{"urgency":5}`},
		{"priority zero", "k", `{}`, `{"priority":0}`},
		{"priority too low", "k", `{}`, `{"priority":5}`},
		{"priority negative", "k", `{}`, `{"priority":-1}`},
		{"priority fraction", "k", `{}`, `{"priority":1.5}`},
		{"priority beyond int64", "k", `{}`, `{"priority":99999999999999999999}`},
		{"priority string", "k", `{}`, `{"priority":"1"}`},
		{"priority bool", "k", `{}`, `{"priority":true}`},
		{"key type", "k", `{}`, `{"idempotency_key":5}`},
		{"key too long", "k", `{}`, fmt.Sprintf(`{"idempotency_key":%q}`, strings.Repeat("k", task.MaxIdempotencyKeyLength+1))},
		{"key control", "k", `{}`, `{"idempotency_key":"a\tb"}`},
		{"group_key type", "k", `{}`, `{"group_key":5}`},
		{"group_key too long", "k", `{}`, fmt.Sprintf(`{"group_key":%q}`, strings.Repeat("g", task.MaxGroupKeyLength+1))},
		{"group_key control", "k", `{}`, `{"group_key":"a\u202eb"}`},
		{"group_key space", "k", `{}`, `{"group_key":" acme"}`},
		{"sequence key type", "k", `{}`, `{"sequence_key":5}`},
		{"sequence key too long", "k", `{}`, fmt.Sprintf(`{"sequence_key":%q}`, strings.Repeat("k", task.MaxSequenceKeyLength+1))},
		{"sequence key control", "k", `{}`, `{"sequence_key":"a\u202eb"}`},
		{"max_attempts zero", "k", `{}`, `{"max_attempts":0}`},
		{"max_attempts negative", "k", `{}`, `{"max_attempts":-3}`},
		{"max_attempts too large", "k", `{}`, `{"max_attempts":1000001}`},
		{"max_attempts beyond int64", "k", `{}`, `{"max_attempts":99999999999999999999}`},
		{"max_attempts fraction", "k", `{}`, `{"max_attempts":1.5}`},
		{"max_attempts string", "k", `{}`, `{"max_attempts":"3"}`},
		{"max_attempts bool", "k", `{}`, `{"max_attempts":true}`},
		{"delay_ms negative", "k", `{}`, `{"delay_ms":-1}`},
		{"delay_ms beyond horizon", "k", `{}`, fmt.Sprintf(`{"delay_ms":%d}`, task.DelayRange.Max+1)},
		{"delay_ms array", "k", `{}`, `{"delay_ms":[1]}`},
		{"timeout_ms too large", "k", `{}`, fmt.Sprintf(`{"timeout_ms":%d}`, task.TimeoutRange.Max+1)},
		{"timeout_ms fraction", "k", `{}`, `{"timeout_ms":0.5}`},
		{"run_at words", "k", `{}`, `{"run_at":"tomorrow"}`},
		{"run_at no such day", "k", `{}`, `{"run_at":"2026-02-30T00:00:00Z"}`},
		{"run_at space", "k", `{}`, `{"run_at":"2026-01-02 15:04:05Z"}`},
		{"run_at no zone", "k", `{}`, `{"run_at":"2026-01-02T15:04:05"}`},
		{"run_at hour 24", "k", `{}`, `{"run_at":"2026-01-02T24:00:00Z"}`},
		{"run_at object", "k", `{}`, `{"run_at":{}}`},
		{"run_at year 0", "k", `{}`, `{"run_at":"0000-06-01T10:00:00.5+02:00"}`},
		{"run_at beyond horizon", "k", `{}`, `{"run_at":"2999-01-01T00:00:00.123+00:00"}`},
		{"run_at and delay_ms", "k", `{}`, `{"run_at":"2026-01-02T15:04:05Z","delay_ms":5}`},
	}
	for _, tc := range cases {
		opts := map[string]json.RawMessage{}
		if err := json.Unmarshal([]byte(tc.opts), &opts); err != nil {
			t.Fatal(err)
		}
		kind, _ := json.Marshal(tc.kind)
		opts["kind"], opts["payload"] = kind, json.RawMessage(tc.payload)
		body, _ := json.Marshal(opts)
		status, want, wantField := apiError(t, h, string(body))
		wantCode := sqlenqueue.CodeInvalid
		if status == http.StatusRequestEntityTooLarge {
			wantCode = sqlenqueue.CodeTooLarge
		} else if status != http.StatusBadRequest {
			t.Fatalf("%s: the API answered %d %q", tc.name, status, want)
		}

		_, err := db.Exec(ctx, `SELECT ingest_enqueue($1, $2, $3)`, tc.kind, tc.payload, tc.opts)
		pg := pgError(t, err)
		if pg.Code != wantCode || pg.Message != want || pg.ColumnName != wantField {
			t.Errorf("%s: ingest_enqueue raised %s %q (column %q)\n     the API says %s %q (field %q)", tc.name,
				pg.Code, pg.Message, pg.ColumnName, wantCode, want, wantField)
		}
		if ferr := sqlenqueue.FieldError(err); ferr == nil || ferr.Field != wantField || ferr.TooLarge != (status == http.StatusRequestEntityTooLarge) {
			t.Errorf("%s: FieldError = %+v", tc.name, ferr)
		}

		// The batch form names the task's position.
		_, err = db.Exec(ctx, `SELECT ingest_enqueue_batch(jsonb_build_array('{"kind":"ok","payload":1}'::jsonb, $1::jsonb))`, string(body))
		pg = pgError(t, err)
		if pg.Code != wantCode || pg.Message != "task 1: "+want || pg.ColumnName != wantField {
			t.Errorf("%s: ingest_enqueue_batch raised %s %q (column %q); want %s %q", tc.name, pg.Code, pg.Message, pg.ColumnName, wantCode, "task 1: "+want)
		}
	}
	assertNothingWritten(t, db)
}

// TestRejectionsBeyondTheAPI covers what the HTTP API has no field for
// (traceparent, dedup_by_payload, the shape of the arguments): the
// messages are task.NewTask.Validate's where Go has one.
func TestRejectionsBeyondTheAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	goMsg := func(nt task.NewTask) string {
		nt.Kind, nt.Payload = "k", json.RawMessage(`{}`)
		ferr := nt.Validate(task.DefaultMaxPayloadBytes)
		if ferr == nil {
			t.Fatalf("Go accepts %+v", nt)
		}
		return ferr.Msg
	}
	long := "00-" + strings.Repeat("a", 32) + "-" + strings.Repeat("b", 16) + "-01-" + strings.Repeat("x", 80)
	cases := []struct {
		name, sql, field, msg string
	}{
		{"traceparent malformed", `SELECT ingest_enqueue('k', '{}', '{"traceparent":"00-abc"}')`, "traceparent",
			goMsg(task.NewTask{Traceparent: "00-abc"})},
		{"traceparent zero trace id", `SELECT ingest_enqueue('k', '{}', '{"traceparent":"00-00000000000000000000000000000000-b7ad6b7169203331-01"}')`, "traceparent",
			goMsg(task.NewTask{Traceparent: "00-00000000000000000000000000000000-b7ad6b7169203331-01"})},
		{"traceparent upper case", `SELECT ingest_enqueue('k', '{}', '{"traceparent":"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"}')`, "traceparent",
			goMsg(task.NewTask{Traceparent: "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"})},
		{"traceparent version 00 with more", fmt.Sprintf(`SELECT ingest_enqueue('k', '{}', '{"traceparent":%q}')`, long), "traceparent",
			goMsg(task.NewTask{Traceparent: long})},
		{"traceparent version ff", `SELECT ingest_enqueue('k', '{}', '{"traceparent":"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}')`, "traceparent",
			goMsg(task.NewTask{Traceparent: "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})},
		{"traceparent type", `SELECT ingest_enqueue('k', '{}', '{"traceparent":1}')`, "traceparent", "traceparent must be a JSON string, got number"},
		{"dedup_by_payload type", `SELECT ingest_enqueue('k', '{}', '{"dedup_by_payload":"yes"}')`, "dedup_by_payload", "dedup_by_payload must be a JSON boolean, got string"},
		{"options not an object", `SELECT ingest_enqueue('k', '{}', '[]')`, "options", "options must be a JSON object, got array"},
		{"kind as an option", `SELECT ingest_enqueue('k', '{}', '{"kind":"x"}')`, "kind", `unknown field "kind"`},
		{"null kind", `SELECT ingest_enqueue(NULL, '{}')`, "kind", "kind is required"},
		{"null payload", `SELECT ingest_enqueue('k', NULL)`, "payload", "payload is required (any JSON value but null)"},
		{"tasks not an array", `SELECT ingest_enqueue_batch('{}')`, "tasks", "tasks must be a JSON array, got object"},
		{"tasks NULL", `SELECT ingest_enqueue_batch(NULL)`, "tasks", "tasks must be a JSON array, got NULL"},
		{"task not an object", `SELECT ingest_enqueue_batch('[{"kind":"k","payload":1}, 5]')`, "", "task 1: the task must be a JSON object, got number"},
		{"batch kind type", `SELECT ingest_enqueue_batch('[{"kind":5,"payload":1}]')`, "kind", "task 0: kind must be a JSON string, got number"},
		{"batch unknown field", `SELECT ingest_enqueue_batch('[{"kind":"k","payload":1,"sequence_key":"a","flavour":"b"}]')`, "flavour", `task 0: unknown field "flavour"`},
	}
	for _, tc := range cases {
		_, err := db.Exec(ctx, tc.sql)
		pg := pgError(t, err)
		if pg.Code != sqlenqueue.CodeInvalid || pg.Message != tc.msg || pg.ColumnName != tc.field {
			t.Errorf("%s: raised %s %q (column %q); want %s %q (column %q)", tc.name, pg.Code, pg.Message, pg.ColumnName,
				sqlenqueue.CodeInvalid, tc.msg, tc.field)
		}
	}
	// An unknown field's hint lists the accepted ones.
	_, err := db.Exec(ctx, `SELECT ingest_enqueue('k', '{}', '{"urgency":1}')`)
	if hint := pgError(t, err).Hint; !strings.Contains(hint, strings.Join(sqlenqueue.Options, ", ")) {
		t.Errorf("hint %q does not list the options %v", hint, sqlenqueue.Options)
	}
	assertNothingWritten(t, db)
}

// TestPayloadLimitFollowsTheSetting: an operator who raises or lowers
// INGEST_MAX_PAYLOAD_BYTES sets ingest.max_payload_bytes on
// ingest_enqueue_batch, and both functions follow it.
func TestPayloadLimitFollowsTheSetting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	if _, err := db.Exec(ctx, `ALTER FUNCTION ingest_enqueue_batch(jsonb) SET ingest.max_payload_bytes = '10'`); err != nil {
		t.Fatal(err)
	}
	want := task.NewTask{Kind: "k", Payload: json.RawMessage(`"123456789"`)}.Validate(10)
	if _, err := db.Exec(ctx, `SELECT ingest_enqueue('k', '"123456789"')`); pgError(t, err).Message != want.Msg {
		t.Errorf("ingest_enqueue over the limit: %v; want %q", err, want.Msg)
	}
	if _, err := db.Exec(ctx, `SELECT ingest_enqueue_batch('[{"kind":"k","payload":"123456789"}]')`); pgError(t, err).Code != sqlenqueue.CodeTooLarge {
		t.Errorf("ingest_enqueue_batch over the limit: %v; want code %s", err, sqlenqueue.CodeTooLarge)
	}
	if _, err := db.Exec(ctx, `SELECT ingest_enqueue('k', '"1234567"')`); err != nil {
		t.Errorf("a payload of 9 bytes: %v", err)
	}
}
