package task_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
)

// keyOf is a test key: 32 bytes of b, as INGEST_ENCRYPTION_KEYS writes it.
func keyOf(b byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32))
}

func keyring(t *testing.T, spec string) *seal.Keyring {
	t.Helper()
	r, err := seal.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b []byte) bool {
	ca, err1 := task.Canonical(a)
	cb, err2 := task.Canonical(b)
	return err1 == nil && err2 == nil && bytes.Equal(ca, cb)
}

// storeOn returns another store on b's database.
func (b *bundle) storeOn(t *testing.T, cfg task.Config) *task.Store {
	t.Helper()
	s, err := task.NewStore(cfg, b.db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestEncryptedRoundTrip checks that with a keyring payloads and results
// reach PostgreSQL encrypted (no plaintext in a column, payload_sha keyed)
// and come back in clear from Create, Get and Start.
func TestEncryptedRoundTrip(t *testing.T) {
	t.Parallel()
	kr := keyring(t, "k1:"+keyOf(1))
	b := setup(t, task.Config{Keyring: kr})
	payload := json.RawMessage(`{"name": "Ada Lovelace", "n": 1}`)
	created := b.create(t, task.NewTask{Payload: payload})
	if string(created.Payload) != `{"n":1,"name":"Ada Lovelace"}` {
		t.Fatalf("Create returned payload %s; want the canonical plaintext", created.Payload)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE payload::text LIKE '%Lovelace%' OR payload->>'kid' IS DISTINCT FROM 'k1'`); n != 0 {
		t.Fatalf("%d rows hold the payload in clear or not under k1", n)
	}
	if !strings.HasPrefix(created.PayloadSHA, "k1:") {
		t.Fatalf("payload_sha = %q; want the keyed digest of k1", created.PayloadSHA)
	}
	if got := b.get(t, created.ID); string(got.Payload) != string(created.Payload) || got.PayloadEncrypted != nil {
		t.Fatalf("Get = %s (%+v); want the plaintext", got.Payload, got.PayloadEncrypted)
	}
	r := b.start(t, "w", time.Minute, created.ID, task.Started)
	if string(r.Task.Payload) != string(created.Payload) || r.Task.PayloadError() != nil {
		t.Fatalf("Start gave payload %s (%v); want the plaintext", r.Task.Payload, r.Task.PayloadError())
	}
	if _, err := b.store.SucceedWith(b.ctx, "w", task.Success{ID: created.ID, Result: json.RawMessage(`{"ssn":"123-45-6789"}`)}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE result::text LIKE '%6789%' OR result->>'kid' IS DISTINCT FROM 'k1'`); n != 0 {
		t.Fatal("the result is stored in clear")
	}
	if got := b.get(t, created.ID); string(got.Result) != `{"ssn":"123-45-6789"}` || got.ResultEncrypted != nil {
		t.Fatalf("Get result = %s (%+v); want the plaintext", got.Result, got.ResultEncrypted)
	}
	// An encrypted and a plaintext task side by side: a keyring reads both.
	plain := setup(t, task.Config{})
	p := plain.create(t, task.NewTask{})
	if got, err := plain.storeOn(t, task.Config{Keyring: kr}).Get(plain.ctx, p.ID); err != nil || !sameJSON(got.Payload, []byte(`{"n":1}`)) {
		t.Fatalf("a keyring's Get of a plaintext payload = %s, %v", got.Payload, err)
	}
}

// TestEncryptedWithoutKey checks what a store without the key (none, or
// another) sees: Get names the key id instead of a payload, Start starts
// the task with a PayloadError, and nothing is lost: the row is intact
// and a store with the key reads it.
func TestEncryptedWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	tk := b.create(t, task.NewTask{Payload: json.RawMessage(`{"secret":"s3"}`)})
	b.start(t, "w", time.Minute, tk.ID, task.Started)
	if _, err := b.store.SucceedWith(b.ctx, "w", task.Success{ID: tk.ID, Result: json.RawMessage(`"r"`)}); err != nil {
		t.Fatal(err)
	}
	queued := b.create(t, task.NewTask{Payload: json.RawMessage(`{"secret":"s4"}`)})
	for _, tc := range []struct {
		name    string
		kr      *seal.Keyring
		missing bool
	}{
		{"NoKeyring", nil, true},
		{"OtherKeyID", keyring(t, "k2:"+keyOf(2)), true},
		{"WrongKeyUnderTheID", keyring(t, "k1:"+keyOf(9)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := b.storeOn(t, task.Config{Keyring: tc.kr})
			got, err := s.Get(b.ctx, tk.ID)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			for _, e := range []*task.Encrypted{got.PayloadEncrypted, got.ResultEncrypted} {
				if e == nil || e.KeyID != "k1" || e.Missing != tc.missing || !strings.Contains(e.Error, `key id "k1"`) {
					t.Fatalf("Get = payload %s %+v, result %s %+v; want both encrypted with key id k1 (missing %v)",
						got.Payload, got.PayloadEncrypted, got.Result, got.ResultEncrypted, tc.missing)
				}
			}
			if got.Payload != nil || got.Result != nil {
				t.Fatal("Get returned the stored envelope as a payload or result")
			}
			js, _ := json.Marshal(got)
			if !strings.Contains(string(js), `"payload_encrypted":{"key_id":"k1"`) {
				t.Fatalf("the task's JSON %s lacks payload_encrypted", js)
			}
		})
	}
	// A create without the key that meets the task by its idempotency
	// key gets it back marked encrypted, in a batch twice.
	keyed := b.create(t, task.NewTask{Payload: json.RawMessage(`{"secret":"s5"}`), IdempotencyKey: "idem"})
	res, err := b.storeOn(t, task.Config{}).CreateBatch(b.ctx, []task.NewTask{
		{Kind: "test", Payload: json.RawMessage(`1`), IdempotencyKey: "idem"},
		{Kind: "test", Payload: json.RawMessage(`2`), IdempotencyKey: "idem"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.Existing || r.Task.ID != keyed.ID || r.Task.Payload != nil || r.Task.PayloadEncrypted == nil || r.Task.PayloadEncrypted.KeyID != "k1" {
			t.Fatalf("CreateBatch without the key = %+v; want the existing task, its payload encrypted with k1", r)
		}
	}
	// A worker without the key starts the task, learns that it cannot
	// open it, and records a failed attempt: retried, never lost.
	s := b.storeOn(t, task.Config{})
	rs, err := s.Start(b.ctx, "w2", time.Minute, queued.ID)
	if err != nil || rs[0].Outcome != task.Started {
		t.Fatalf("Start = %+v, %v", rs, err)
	}
	perr := rs[0].Task.PayloadError()
	if !errors.Is(perr, task.ErrEncrypted) || rs[0].Task.Payload != nil {
		t.Fatalf("PayloadError = %v (payload %s); want ErrEncrypted and no payload", perr, rs[0].Task.Payload)
	}
	if _, err := s.Fail(b.ctx, "w2", task.Failure{ID: queued.ID, Error: perr.Error()}); err != nil {
		t.Fatal(err)
	}
	got := b.get(t, queued.ID)
	if got.Status != task.Retrying || !strings.Contains(got.LastError, `key id "k1"`) || string(got.Payload) != `{"secret":"s4"}` {
		t.Fatalf("after the failed attempt: %s, %q, payload %s; want RETRYING naming the key id, the payload intact", got.Status, got.LastError, got.Payload)
	}
}

// TestMovedCiphertextRefused checks that a payload or result copied from
// one task to another (or from the payload to the result) does not open.
func TestMovedCiphertextRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	a := b.create(t, task.NewTask{Payload: json.RawMessage(`{"owner":"a"}`)})
	c := b.create(t, task.NewTask{Payload: json.RawMessage(`{"owner":"c"}`)})
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET payload = (SELECT payload FROM ingest_task WHERE id = $1), result = (SELECT payload FROM ingest_task WHERE id = $2) WHERE id = $2`, a.ID, c.ID); err != nil {
		t.Fatal(err)
	}
	got := b.get(t, c.ID)
	for _, e := range []*task.Encrypted{got.PayloadEncrypted, got.ResultEncrypted} {
		if e == nil || e.Missing || e.KeyID != "k1" {
			t.Fatalf("Get of the task with a moved ciphertext = payload %s %+v, result %s %+v; want both refused", got.Payload, got.PayloadEncrypted, got.Result, got.ResultEncrypted)
		}
	}
	rs, err := b.store.Start(b.ctx, "w", time.Minute, c.ID)
	if err != nil || rs[0].Task.PayloadError() == nil {
		t.Fatalf("Start = %+v, %v; want a PayloadError", rs, err)
	}
}

// TestReservedEncMember checks that a payload or result that could be
// taken for an envelope is refused with an error naming the field.
func TestReservedEncMember(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	_, err := b.store.Create(b.ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"$enc":"v1","kid":"k1","ct":"AA=="}`)})
	var fe *task.FieldError
	if !errors.As(err, &fe) || fe.Field != "payload" || !strings.Contains(fe.Msg, "$enc") {
		t.Fatalf("Create = %v; want a payload FieldError naming $enc", err)
	}
	if _, err := b.store.Create(b.ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"a":{"$enc":1}}`)}); err != nil {
		t.Fatalf("a nested $enc member is refused: %v", err)
	}
	if _, err := b.store.CheckResult([]byte(`{"$enc":"x"}`)); !errors.As(err, &fe) || fe.Field != "result" {
		t.Fatalf("CheckResult = %v; want a result FieldError", err)
	}
}

// TestDedupAcrossKeys checks payload dedup with encryption: tasks of the
// same payload dedup under one key, under the previous key before a
// rotation, against a plaintext task, and after a rotation.
func TestDedupAcrossKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	payload := json.RawMessage(`{"doc": 7}`)
	nt := task.NewTask{Kind: "d", Payload: payload, DedupByPayload: true}
	first := b.create(t, nt)
	k1 := b.storeOn(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	k21 := b.storeOn(t, task.Config{Keyring: keyring(t, "k2:"+keyOf(2)+",k1:"+keyOf(1))})
	for _, s := range []*task.Store{k1, k21} {
		r, err := s.Create(b.ctx, nt)
		if err != nil || !r.Existing || r.Task.ID != first.ID || !sameJSON(r.Task.Payload, payload) {
			t.Fatalf("Create = %+v, %v; want the plaintext task %s", r, err, first.ID)
		}
	}
	// An encrypted task of another payload, under k1; a store of k2,k1
	// finds it by its k1 digest.
	nt2 := task.NewTask{Kind: "d", Payload: json.RawMessage(`{"doc": 8}`), DedupByPayload: true}
	r, err := k1.Create(b.ctx, nt2)
	if err != nil || r.Existing {
		t.Fatal(r, err)
	}
	second := r.Task
	if r, err := k21.Create(b.ctx, nt2); err != nil || !r.Existing || r.Task.ID != second.ID || string(r.Task.Payload) != `{"doc":8}` {
		t.Fatalf("Create under k2 = %+v, %v; want the k1 task %s", r, err, second.ID)
	}
	// After a rotation, a store of k2 alone still dedups both.
	rotateAll(t, b, k21)
	k2 := b.storeOn(t, task.Config{Keyring: keyring(t, "k2:"+keyOf(2))})
	for _, c := range []struct {
		nt task.NewTask
		id uuid.UUID
	}{{nt, first.ID}, {nt2, second.ID}} {
		if r, err := k2.Create(b.ctx, c.nt); err != nil || !r.Existing || r.Task.ID != c.id {
			t.Fatalf("Create after the rotation = %+v, %v; want %s", r, err, c.id)
		}
	}
}

// rotateAll runs s.Rotate over the whole table until a pass has nothing
// left to do, and returns the total.
func rotateAll(t *testing.T, b *bundle, s *task.Store) task.RotateBatch {
	t.Helper()
	var total task.RotateBatch
	deadline := time.Now().Add(time.Minute)
	for pass := 0; ; pass++ {
		var sum task.RotateBatch
		after := uuid.Nil
		for {
			rb, err := s.Rotate(b.ctx, after, 7, false)
			if err != nil {
				t.Fatalf("Rotate: %v", err)
			}
			sum.Scanned += rb.Scanned
			sum.Payloads += rb.Payloads
			sum.Results += rb.Results
			sum.Conflicts += rb.Conflicts
			after = rb.Next
			if rb.Done {
				break
			}
		}
		total.Payloads += sum.Payloads
		total.Results += sum.Results
		total.Conflicts += sum.Conflicts
		if sum.Payloads == 0 && sum.Results == 0 && sum.Conflicts == 0 {
			return total
		}
		if time.Now().After(deadline) {
			t.Fatalf("rotation still finds work after %d passes: %+v", pass, sum)
		}
	}
}

// TestRotateUnderLoad re-encrypts under a new key while producers create
// tasks and workers start them and record their results, some of them
// with the old key list: every task is kept, every payload and result is
// under the new key afterwards and opens with it alone, with its value.
func TestRotateUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	old := b.storeOn(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	both := b.storeOn(t, task.Config{Keyring: keyring(t, "k2:"+keyOf(2)+",k1:"+keyOf(1))})
	payloadOf := func(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)) }
	resultOf := func(p json.RawMessage) json.RawMessage { return json.RawMessage(`{"of":` + string(p) + `}`) }
	var mu sync.Mutex
	want := map[uuid.UUID]json.RawMessage{}
	var n atomic.Int64
	create := func(s *task.Store) {
		i := int(n.Add(1))
		r, err := s.Create(b.ctx, task.NewTask{Kind: "r", Payload: payloadOf(i)})
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		want[r.Task.ID] = r.Task.Payload
		mu.Unlock()
	}
	// History: plaintext tasks and tasks under k1, half of them done.
	for i := 0; i < 40; i++ {
		create([]*task.Store{b.store, old}[i%2])
	}
	work := func(s *task.Store, owner string, limit int) int {
		mu.Lock()
		var ids []uuid.UUID
		for id := range want {
			ids = append(ids, id)
			if len(ids) == limit {
				break
			}
		}
		mu.Unlock()
		rs, err := s.Start(b.ctx, owner, time.Minute, ids...)
		if err != nil {
			t.Error(err)
			return 0
		}
		var succ []task.Success
		var fails []task.Failure
		for _, r := range rs {
			switch {
			case r.Outcome != task.Started:
			case r.Task.PayloadError() != nil: // as a worker does: a failed attempt
				fails = append(fails, task.Failure{ID: r.ID, Error: r.Task.PayloadError().Error()})
			default:
				succ = append(succ, task.Success{ID: r.ID, Result: resultOf(r.Task.Payload)})
			}
		}
		if _, err := s.SucceedWith(b.ctx, owner, succ...); err != nil {
			t.Error(err)
		}
		if _, err := s.Fail(b.ctx, owner, fails...); err != nil {
			t.Error(err)
		}
		return len(succ)
	}
	work(old, "w0", 20)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g, s := range []*task.Store{old, both} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				create(s)
				create(s)
				work(s, fmt.Sprintf("w%d", g+1), 3)
			}
		}()
	}
	// Rotate while the load runs, then once more after it stopped (the
	// old-key worker kept writing k1 values meanwhile).
	var during task.RotateBatch
	passes := 0
	for ; n.Load() < 300 || passes < 3; passes++ {
		after := uuid.Nil
		for {
			rb, err := both.Rotate(b.ctx, after, 7, false)
			if err != nil {
				close(stop)
				wg.Wait()
				t.Fatal(err)
			}
			during.Payloads += rb.Payloads
			during.Results += rb.Results
			during.Conflicts += rb.Conflicts
			if after = rb.Next; rb.Done {
				break
			}
		}
	}
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	// One task under the old key and one in clear, written after the
	// last pass: the dry run must count them (and whatever the old-key
	// worker wrote meanwhile).
	create(old)
	create(b.store)
	dry, err := both.Rotate(b.ctx, uuid.Nil, 10000, true)
	if err != nil || dry.Payloads < 2 {
		t.Fatalf("dry run = %+v, %v; want k1 and plaintext payloads to count", dry, err)
	}
	if again, _ := both.Rotate(b.ctx, uuid.Nil, 10000, true); again.Payloads != dry.Payloads || again.Results != dry.Results {
		t.Fatalf("a dry run wrote: %+v then %+v", dry, again)
	}
	rotateAll(t, b, both)

	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE payload->>'kid' IS DISTINCT FROM 'k2'
	                    OR (result IS NOT NULL AND result->>'kid' IS DISTINCT FROM 'k2') OR payload_sha NOT LIKE 'k2:%'`); n != 0 {
		t.Fatalf("%d tasks hold a payload, result or payload_sha not of k2", n)
	}
	k2 := b.storeOn(t, task.Config{Keyring: keyring(t, "k2:"+keyOf(2))})
	if total := b.count(t, `SELECT count(*) FROM ingest_task`); total != len(want) {
		t.Fatalf("%d tasks in the table; %d were created", total, len(want))
	}
	results := 0
	for id, p := range want {
		got, err := k2.Get(b.ctx, id)
		if err != nil || got.PayloadEncrypted != nil || got.ResultEncrypted != nil || !sameJSON(got.Payload, p) {
			t.Fatalf("Get(%s) with k2 alone = %s %+v %+v, %v; want %s", id, got.Payload, got.PayloadEncrypted, got.ResultEncrypted, err, p)
		}
		if got.Result != nil {
			results++
			if !sameJSON(got.Result, resultOf(p)) {
				t.Fatalf("result of %s = %s; want %s", id, got.Result, resultOf(p))
			}
		}
	}
	if results == 0 {
		t.Fatal("no task has a result: the load did not run")
	}
	t.Logf("%d tasks, %d with results, all under k2; %d passes under load re-encrypted %d payloads and %d results (%d conflicts)",
		len(want), results, passes, during.Payloads, during.Results, during.Conflicts)
}

// TestRotateUnreadableAndNoKeyring checks that a value under a key the
// keyring lacks is counted by key id and left alone, and that a store
// without a keyring refuses to rotate.
func TestRotateUnreadableAndNoKeyring(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	tk := b.create(t, task.NewTask{})
	before := b.count(t, `SELECT count(*) FROM ingest_task WHERE payload->>'kid' = 'k1'`)
	k2 := b.storeOn(t, task.Config{Keyring: keyring(t, "k2:"+keyOf(2))})
	rb, err := k2.Rotate(b.ctx, uuid.Nil, 0, false)
	if err != nil || rb.Unreadable["k1"] != 1 || rb.Payloads != 0 || !rb.Done || rb.Next != tk.ID {
		t.Fatalf("Rotate = %+v, %v; want one unreadable k1 payload", rb, err)
	}
	if after := b.count(t, `SELECT count(*) FROM ingest_task WHERE payload->>'kid' = 'k1'`); after != before {
		t.Fatal("an unreadable payload was changed")
	}
	if _, err := b.storeOn(t, task.Config{}).Rotate(b.ctx, uuid.Nil, 0, false); !errors.Is(err, task.ErrNoKeyring) {
		t.Fatalf("Rotate without keys = %v; want ErrNoKeyring", err)
	}
	var fe *task.FieldError
	if _, err := k2.Rotate(b.ctx, uuid.Nil, 10001, false); !errors.As(err, &fe) || fe.Field != "batch_size" {
		t.Fatalf("Rotate(10001) = %v; want a batch_size FieldError", err)
	}
}

// TestEnableOnLiveDatabase turns encryption on for a database whose
// tasks, in every state, were written in clear: the keyed store reads
// them at once, and a rotation encrypts every payload and result in place
// without changing a state, an audit trail or updated_at; the running
// task then completes under its lease.
func TestEnableOnLiveDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	ids := map[task.State]uuid.UUID{}
	for _, st := range task.States {
		ids[st] = b.create(t, task.NewTask{Payload: json.RawMessage(fmt.Sprintf(`{"state":%q}`, st))}).ID
	}
	for _, st := range []task.State{task.Running, task.Retrying, task.Succeeded, task.Dead} {
		b.start(t, "w", time.Hour, ids[st], task.Started)
	}
	b.fail(t, "w", task.Failure{ID: ids[task.Retrying], Error: "e", RetryAfter: time.Hour})
	b.fail(t, "w", task.Failure{ID: ids[task.Dead], Error: "boom", Permanent: true})
	if _, err := b.store.SucceedWith(b.ctx, "w", task.Success{ID: ids[task.Succeeded], Result: json.RawMessage(`{"done":true}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Cancel(b.ctx, "op", "", ids[task.Cancelled]); err != nil {
		t.Fatal(err)
	}
	type row struct {
		status  string
		updated time.Time
		audit   int
	}
	read := func() map[uuid.UUID]row {
		out := map[uuid.UUID]row{}
		for _, id := range ids {
			var r row
			if err := b.db.QueryRow(b.ctx, `SELECT status, updated_at, (SELECT count(*) FROM ingest_task_transition WHERE task_id = $1)
			    FROM ingest_task WHERE id = $1`, id).Scan(&r.status, &r.updated, &r.audit); err != nil {
				t.Fatal(err)
			}
			out[id] = r
		}
		return out
	}
	before := read()
	keyed := b.storeOn(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	rb, err := keyed.Rotate(b.ctx, uuid.Nil, 0, false)
	if err != nil || rb.Payloads != len(task.States) || rb.Results != 1 || rb.Conflicts != 0 {
		t.Fatalf("Rotate = %+v, %v; want %d payloads and 1 result", rb, err, len(task.States))
	}
	if after := read(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the rotation changed states, audit rows or updated_at:\n%v\n%v", before, after)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE payload->>'kid' IS DISTINCT FROM 'k1'`); n != 0 {
		t.Fatalf("%d payloads not under k1", n)
	}
	for st, id := range ids {
		got, err := keyed.Get(b.ctx, id)
		if err != nil || !sameJSON(got.Payload, []byte(fmt.Sprintf(`{"state":%q}`, st))) || string(got.Status) != string(st) {
			t.Fatalf("Get(%s) = %s %s, %v", st, got.Status, got.Payload, err)
		}
	}
	if got, _ := keyed.Get(b.ctx, ids[task.Succeeded]); !sameJSON(got.Result, []byte(`{"done":true}`)) {
		t.Fatalf("result = %s", got.Result)
	}
	if res, err := keyed.Succeed(b.ctx, "w", ids[task.Running]); err != nil || !res[0].Applied {
		t.Fatalf("Succeed of the running task after the rotation = %+v, %v", res, err)
	}
}

// TestRotateDoesNotOverwrite holds a result write open while a rotation
// runs: the rotation's UPDATE waits for the row, then writes the payload
// it re-encrypted and leaves the result it did not read as the run wrote
// it; a result changed after the rotation read it is a conflict, left
// alone.
func TestRotateDoesNotOverwrite(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	both := b.storeOn(t, task.Config{Keyring: keyring(t, "k2:"+keyOf(2)+",k1:"+keyOf(1))})
	running := b.create(t, task.NewTask{Payload: json.RawMessage(`{"r":1}`)})
	b.start(t, "w", time.Hour, running.ID, task.Started)

	// Rotation blocked behind the run's success, which commits after
	// the rotation read the row.
	blockedRotate := func(change func(tx pgx.Tx, s *task.Store) error) task.RotateBatch {
		t.Helper()
		tx, err := b.db.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(b.ctx)
		inTx, err := task.NewStore(task.Config{Keyring: keyring(t, "k1:"+keyOf(1))}, tx)
		if err != nil {
			t.Fatal(err)
		}
		if err := change(tx, inTx); err != nil {
			t.Fatal(err)
		}
		done := make(chan task.RotateBatch, 1)
		go func() {
			rb, err := both.Rotate(b.ctx, uuid.Nil, 0, false)
			if err != nil {
				t.Error(err)
			}
			done <- rb
		}()
		deadline := time.Now().Add(30 * time.Second)
		for b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE ingest_task t SET%payload_sha%'`) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the rotation never waited for the row")
			}
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		return <-done
	}
	rb := blockedRotate(func(_ pgx.Tx, s *task.Store) error {
		_, err := s.SucceedWith(b.ctx, "w", task.Success{ID: running.ID, Result: json.RawMessage(`{"out":1}`)})
		return err
	})
	got := b.get(t, running.ID)
	if rb.Payloads != 1 || got.Status != task.Succeeded || !sameJSON(got.Result, []byte(`{"out":1}`)) {
		t.Fatalf("Rotate = %+v, task %s result %s; want the payload rotated and the run's result kept", rb, got.Status, got.Result)
	}
	// The result, under k1, read by a rotation and changed before its
	// write: a conflict, the newer value kept.
	rb = blockedRotate(func(tx pgx.Tx, _ *task.Store) error {
		// The same result sealed anew under k1 (a fresh nonce): another value.
		v, err := keyring(t, "k1:"+keyOf(1)).Seal(seal.Result, running.ID, []byte(`{"out":1}`))
		if err != nil {
			return err
		}
		_, err = tx.Exec(b.ctx, `UPDATE ingest_task SET result = $2::jsonb WHERE id = $1`, running.ID, string(v))
		return err
	})
	if rb.Conflicts != 1 || rb.Results != 0 {
		t.Fatalf("Rotate = %+v; want the changed result counted as a conflict", rb)
	}
	if got := b.get(t, running.ID); !sameJSON(got.Result, []byte(`{"out":1}`)) {
		t.Fatalf("result = %s", got.Result)
	}
	if final := rotateAll(t, b, both); final.Results != 1 {
		t.Fatalf("a later rotation = %+v; want the result re-encrypted", final)
	}
}

// TestEncryptedDependencyResults checks that a dependent receives its
// dependencies' results in clear when results are stored encrypted, and
// that a store without the key refuses to hand over ciphertexts.
func TestEncryptedDependencyResults(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{Keyring: keyring(t, "k1:"+keyOf(1))})
	dep := b.create(t, task.NewTask{})
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{{Kind: "test", Payload: json.RawMessage(`{}`), DependsOn: []uuid.UUID{dep.ID}}})
	if err != nil {
		t.Fatal(err)
	}
	b.runOK(t, dep.ID, `{"secret":"swordfish"}`)
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE result::text LIKE '%swordfish%'`); n != 0 {
		t.Fatal("the dependency's result is stored in clear")
	}
	got, err := b.store.DependencyResults(b.ctx, res[0].Task.ID)
	if err != nil || !sameJSON(got[dep.ID], []byte(`{"secret":"swordfish"}`)) {
		t.Fatalf("DependencyResults = %s, %v; want the plaintext result", got[dep.ID], err)
	}
	if _, err := b.storeOn(t, task.Config{}).DependencyResults(b.ctx, res[0].Task.ID); err == nil || !strings.Contains(err.Error(), "k1") {
		t.Fatalf("DependencyResults without the key: %v; want an error naming key id k1", err)
	}
}
