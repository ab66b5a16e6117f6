package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// seqPayload is the payload of a sequenced test task: its key and its
// place (from 0) in the order the test created them.
type seqPayload struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

// seqChecker records the handler runs of sequenced tasks and reports any
// overlap of two runs of one key and any run out of creation order.
type seqChecker struct {
	mu       sync.Mutex
	running  map[string]int // key -> runs in progress
	last     map[string]int // key -> N of the latest run started
	problems []string
}

func newSeqChecker() *seqChecker {
	return &seqChecker{running: map[string]int{}, last: map[string]int{}}
}

// begin records the start of a run of p (attempt from 1): it must be the
// only run of its key, and either the next task of the key or (a retry)
// the one run last.
func (c *seqChecker) begin(p seqPayload, attempt int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running[p.Key]++
	if c.running[p.Key] > 1 {
		c.problems = append(c.problems, fmt.Sprintf("key %s: task %d started while another of the key ran", p.Key, p.N))
	}
	last, seen := c.last[p.Key]
	switch {
	case !seen && p.N != 0:
		c.problems = append(c.problems, fmt.Sprintf("key %s: task %d ran first", p.Key, p.N))
	case seen && p.N != last+1 && !(p.N == last && attempt > 1):
		c.problems = append(c.problems, fmt.Sprintf("key %s: task %d (attempt %d) ran after task %d", p.Key, p.N, attempt, last))
	}
	c.last[p.Key] = p.N
}

func (c *seqChecker) end(p seqPayload) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running[p.Key]--
}

// TestSequencesAcrossWorkers: 50 keys of 100 tasks each, created
// interleaved, run by three workers, some tasks failing their first run:
// for each key the handler runs never overlap and follow creation order
// (retries included), as the audit trail confirms (each task's first
// start after its predecessor's success).
func TestSequencesAcrossWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	const keys, each = 50, 100
	check := newSeqChecker()
	handler := func(_ context.Context, tk ingest.Task) error {
		var p seqPayload
		if err := json.Unmarshal(tk.Payload, &p); err != nil {
			return ingest.Permanent(err)
		}
		check.begin(p, tk.Attempt)
		defer check.end(p)
		if p.N%9 == 4 && tk.Attempt == 1 {
			return errors.New("transient") // retried, still in order
		}
		return nil
	}
	for _, name := range []string{"w1", "w2", "w3"} {
		b.run(b.fastConfig(name), map[string]ingest.Handler{"seq": handler}, slog.LevelError)
	}
	for n := 0; n < each; n++ {
		nts := make([]task.NewTask, keys)
		for k := range nts {
			p, _ := json.Marshal(seqPayload{Key: fmt.Sprintf("doc-%02d", k), N: n})
			nts[k] = task.NewTask{Kind: "seq", Payload: p, SequenceKey: fmt.Sprintf("doc-%02d", k)}
		}
		if _, err := b.store.CreateBatch(ctx, nts); err != nil {
			t.Fatal(err)
		}
	}
	b.eventually(5*time.Minute, "every sequenced task SUCCEEDED", func() bool {
		return b.query(`SELECT count(*) FROM ingest_task WHERE kind = 'seq' AND status = 'SUCCEEDED'`) == keys*each
	})
	check.mu.Lock()
	for _, p := range check.problems {
		t.Error(p)
	}
	check.mu.Unlock()
	if n := b.query(`SELECT count(*) FROM ingest_task_transition WHERE to_status = 'RETRYING'`); n < keys {
		t.Errorf("%d failed runs, want at least %d (the test's own failures)", n, keys)
	}
	// The audit trail: in each key, task n+1 first started after task n
	// succeeded.
	if n := b.query(`
WITH r AS (
    SELECT t.sequence_key, t.sequence_no,
        (SELECT min(tr.created_at) FROM ingest_task_transition tr WHERE tr.task_id = t.id AND tr.to_status = 'RUNNING') AS first_start,
        (SELECT max(tr.created_at) FROM ingest_task_transition tr WHERE tr.task_id = t.id AND tr.to_status = 'SUCCEEDED') AS done
    FROM ingest_task t WHERE t.kind = 'seq'
)
SELECT count(*) FROM r a JOIN r b ON b.sequence_key = a.sequence_key AND b.sequence_no = a.sequence_no + 1
WHERE b.first_start < a.done`); n != 0 {
		t.Errorf("%d tasks started before their predecessor succeeded (audit trail)", n)
	}
	// And creation order is the order of sequence_no.
	if n := b.query(`SELECT count(*) FROM ingest_task WHERE kind = 'seq' AND sequence_no <> (payload->>'n')::int + 1`); n != 0 {
		t.Errorf("%d tasks numbered out of creation order", n)
	}
}
