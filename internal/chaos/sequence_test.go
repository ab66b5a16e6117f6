//go:build reliability

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestSequencesUnderKills: keys × tasks with a sequence key each (50 × 100
// in the long form), created interleaved, run by four workers while a
// random one is SIGKILLed 4 times (10 in the long form):
// for each key the handler runs (chaos_run; a killed worker's open run
// ended at its kill) never overlap and follow creation order, a run of a
// task being followed only by another run of it (its takeover) or by the
// next task of the key; and the usual invariants.
func TestSequencesUnderKills(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	ctx := context.Background()
	start := time.Now()
	ws := c.spawn("w", 4)
	keys, each, kills := size(10, 50), size(20, 100), size(4, 10)
	for n := 0; n < each; n++ {
		nts := make([]task.NewTask, keys)
		for k := range nts {
			p, _ := json.Marshal(map[string]any{"ms": size(300, 100), "n": n, "r": randomHex(4)})
			nts[k] = task.NewTask{Kind: "sequenced", Payload: p, MaxAttempts: 50, SequenceKey: fmt.Sprintf("key-%02d", k)}
		}
		if _, err := c.store.CreateBatch(ctx, nts); err != nil {
			t.Fatal(err)
		}
	}
	for done := 0; done < kills && c.notTerminal() != 0; done++ {
		// About every 0.75 s: each key's tasks run one after another, so
		// the run lasts at least each × ms (6 s; 10 s in the long form)
		// whatever the machine's speed, long enough for the kills.
		time.Sleep(500*time.Millisecond + rand.N(500*time.Millisecond))
		if c.notTerminal() == 0 {
			break
		}
		ws[rand.IntN(len(ws))].kill()
	}
	r := c.finish(row{Scenario: fmt.Sprintf("10. sequences: %d keys × %d tasks, %d SIGKILLs of a random worker (4 workers)", keys, each, kills)}, expect{}, start)
	if r.Faults < kills/2 {
		t.Errorf("only %d kills during the run", r.Faults)
	}

	type run struct {
		task       uuid.UUID
		no         int64
		began, end time.Time
	}
	rows, err := c.db.Pool.Query(ctx, `SELECT t.sequence_key, t.sequence_no, r.task_id, r.worker, r.started_at, r.ended_at
		FROM chaos_run r JOIN ingest_task t ON t.id = r.task_id WHERE t.kind = 'sequenced'`)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	killedAt := maps.Clone(c.killedAt)
	c.mu.Unlock()
	byKey := map[string][]run{}
	for rows.Next() {
		var key, worker string
		var x run
		var ended *time.Time
		if err := rows.Scan(&key, &x.no, &x.task, &worker, &x.began, &ended); err != nil {
			t.Fatal(err)
		}
		end, killed := killedAt[worker]
		switch {
		case ended != nil:
			end = *ended
		case !killed:
			t.Errorf("a run of task %s on %s has no end and its worker was not killed", x.task, worker)
			continue
		}
		x.end = end
		byKey[key] = append(byKey[key], x)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(byKey) != keys {
		t.Fatalf("runs of %d keys, want %d", len(byKey), keys)
	}
	bad := 0
	for key, runs := range byKey {
		sort.Slice(runs, func(i, j int) bool { return runs[i].began.Before(runs[j].began) })
		if runs[0].no != 1 {
			t.Errorf("key %s: the first run is of task %d", key, runs[0].no)
			bad++
		}
		for i := 1; i < len(runs) && bad < 20; i++ {
			prev, cur := runs[i-1], runs[i]
			if cur.began.Before(prev.end) {
				t.Errorf("key %s: task %d's run began at %s, before the run of task %d ended (%s)",
					key, cur.no, cur.began.Format(time.RFC3339Nano), prev.no, prev.end.Format(time.RFC3339Nano))
				bad++
			}
			if cur.no != prev.no && cur.no != prev.no+1 {
				t.Errorf("key %s: task %d ran after task %d", key, cur.no, prev.no)
				bad++
			}
		}
		if last := runs[len(runs)-1].no; last != int64(each) {
			t.Errorf("key %s: the last run is of task %d, want %d", key, last, each)
		}
	}
}
