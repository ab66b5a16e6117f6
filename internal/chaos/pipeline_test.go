//go:build reliability

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// pipelineChunks is the fan-out of each document of the pipeline
// scenario: its chunks, all joined by one task.
const pipelineChunks = 10

// enqueueDocument creates one document's pipeline in one batch, its
// edges given by refs: pipe.doc → pipelineChunks pipe.chunk → pipe.join.
func (c *cluster) enqueueDocument(doc int) {
	c.t.Helper()
	payload := func(ms, i int) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"ms": ms, "doc": doc, "i": i, "chunks": pipelineChunks})
		return b
	}
	nts := []task.NewTask{{Kind: "pipe.doc", Payload: payload(30, 0), Ref: "doc", MaxAttempts: 50}}
	var chunks []string
	for i := range pipelineChunks {
		ref := fmt.Sprintf("chunk-%d", i)
		chunks = append(chunks, ref)
		nts = append(nts, task.NewTask{Kind: "pipe.chunk", Payload: payload(100, i), Ref: ref, DependsOnRefs: []string{"doc"}, MaxAttempts: 50})
	}
	nts = append(nts, task.NewTask{Kind: "pipe.join", Payload: payload(30, 0), DependsOnRefs: chunks, MaxAttempts: 50})
	if _, err := c.store.CreateBatch(context.Background(), nts); err != nil {
		c.t.Fatalf("enqueue document %d: %v", doc, err)
	}
}

// TestPipeline: documents, each a fan-out of 10 chunks and a fan-in join
// created in one batch, flow through four workers while a random one is
// SIGKILLed 10 times (scenario 11). Beyond the suite's invariants (none
// lost, valid audit paths, the DLQ empty): no task started before every
// task it depends on had ended, by the audit trail; every edge was
// released; every join ended SUCCEEDED exactly once, with a result made
// of its 10 chunks' results (the join's handler refuses anything less).
func TestPipeline(t *testing.T) {
	c := newCluster(t, clusterOptions{})
	start := time.Now()
	ws := c.spawn("w", 4)
	docs, seconds, kills := size(100, 1000), size(10, 100), 10

	// A steady producer spreads the documents over the run (one batch
	// every 100 ms), so that the kills land while work is in flight.
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		per := max(1, docs/(10*seconds))
		for d := 0; d < docs; {
			for range min(per, docs-d) {
				c.enqueueDocument(d)
				d++
			}
			<-tick.C
		}
	}()
	// The kills: one in each of kills equal slices of the production
	// time, at a random phase within it.
	slice := time.Duration(seconds) * time.Second / time.Duration(kills)
	var mu sync.Mutex
	var recovery time.Duration
	var wg sync.WaitGroup
	for range kills {
		time.Sleep(slice/2 + rand.N(slice/2))
		killed := time.Now()
		old := ws[rand.IntN(len(ws))].kill()
		// Recovery: until no task is RUNNING under the dead consumer.
		wg.Go(func() {
			deadline := time.Now().Add(time.Minute)
			for c.runningUnder(old) != 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			recovery = max(recovery, time.Since(killed))
			mu.Unlock()
		})
	}
	wg.Wait()
	<-produced

	name := "10. pipeline: documents × 10 chunks → join, 10 SIGKILLs (4 workers)"
	r := c.finish(row{Scenario: name, Recovery: recovery, Notes: fmt.Sprintf("%d documents of %d tasks, created in one batch each with refs; recovery: longest time until a killed worker's tasks were taken over", docs, pipelineChunks+2)}, expect{}, start)
	if r.DupBound == 0 {
		t.Errorf("no kill caught a worker running tasks: the scenario tested nothing")
	}
	var problems []string
	check := func(what string, n int) {
		if n != 0 {
			problems = append(problems, fmt.Sprintf("%s: %d", what, n))
			t.Errorf("%s: %d", what, n)
		}
	}
	q := func(sql string) int {
		n := c.queryWithin(time.Minute, sql)
		if n < 0 {
			t.Fatalf("query failed: %s", sql)
		}
		return n
	}
	check("tasks not SUCCEEDED (a CANCELLED one: its dependency failed)", q(`SELECT count(*) FROM ingest_task WHERE status <> 'SUCCEEDED'`))
	check("documents missing tasks", docs*(pipelineChunks+2)-q(`SELECT count(*) FROM ingest_task`))
	check("edges missing", docs*2*pipelineChunks-q(`SELECT count(*) FROM ingest_task_dependency`))
	// A child before its parent: a run of the dependent began before the
	// dependency's end was committed (by the audit table's order and by
	// time: a start's transaction begins after the end's commit).
	check("runs of a task that began before a dependency had ended", q(`
		SELECT count(*) FROM ingest_task_dependency d
		JOIN ingest_task_transition e ON e.task_id = d.depends_on AND e.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
		JOIN ingest_task_transition s ON s.task_id = d.task_id AND s.to_status = 'RUNNING'
		WHERE s.id < e.id OR s.created_at < e.created_at`))
	check("executions that began before a dependency had ended", q(`
		SELECT count(*) FROM ingest_task_dependency d
		JOIN ingest_task_transition e ON e.task_id = d.depends_on AND e.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
		JOIN chaos_effect x ON x.task_id = d.task_id
		WHERE x.run_at < e.created_at`))
	check("edges still holding", q(`SELECT count(*) FROM ingest_task_dependency WHERE released_at IS NULL`))
	check("tasks still held", q(`SELECT count(*) FROM ingest_task WHERE coalesce(waiting_for, 0) <> 0`))
	check("joins without exactly one SUCCEEDED transition", q(`
		SELECT count(*) FROM ingest_task t WHERE kind = 'pipe.join' AND
		(SELECT count(*) FROM ingest_task_transition s WHERE s.task_id = t.id AND s.to_status = 'SUCCEEDED') <> 1`))
	check("joins whose result is not that of their 10 chunks", q(fmt.Sprintf(`
		SELECT count(*) FROM ingest_task WHERE kind = 'pipe.join' AND
		(result IS NULL OR result->>'chunks' <> '%d' OR result->>'sum' <> '%d' OR result->'doc' <> payload->'doc')`,
		pipelineChunks, pipelineChunks*(pipelineChunks-1)/2)))
	check("chunks without their result", q(`SELECT count(*) FROM ingest_task WHERE kind = 'pipe.chunk' AND (result IS NULL OR result->'i' <> payload->'i')`))
	joinRuns := q(`SELECT count(*) FROM chaos_effect x JOIN ingest_task t ON t.id = x.task_id WHERE t.kind = 'pipe.join'`)
	note := fmt.Sprintf("%d join executions for %d joins (a kill during a run repeats it)", joinRuns, docs)
	if len(problems) > 0 {
		note = joinNote(note, strings.Join(problems, "; "))
	}
	amendRow(name, note, len(problems) > 0)
}
