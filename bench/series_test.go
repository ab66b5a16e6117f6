package bench_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/bench"
	"github.com/ingest-worker/ingest/internal/testenv"
)

// TestRunHoldSeries: a run with Sample and Hold reports a sample per
// period, with the rescuer probe's pages and every table of bench.Tables,
// writes them as CSV as they come, flags the periods the held
// transactions overlapped (none before HoldAfter, some after, none once
// they are released) and sums clean and held periods in its HoldSummary.
// Numbers are not asserted.
func TestRunHoldSeries(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
	var progress, csvOut bytes.Buffer
	rep, err := bench.Run(context.Background(), bench.Options{Tasks: 4000, Rate: 500, Concurrency: 200,
		Sample: 500 * time.Millisecond, Hold: 2 * time.Second, HoldAfter: 2 * time.Second, SeriesOut: &csvOut}, db.Pool, rdb, &progress)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if len(rep.Series) < 4 {
		t.Fatalf("%d samples, want one per 500ms of a run of %.1fs\n%s", len(rep.Series), rep.WorkSeconds, progress.String())
	}
	var succeeded int64
	for i, s := range rep.Series {
		for _, name := range bench.Tables {
			if _, ok := s.Tables[name]; !ok {
				t.Errorf("sample %d lacks table %s: %+v", i, name, s.Tables)
			}
		}
		if s.Succeeded < succeeded {
			t.Errorf("sample %d: succeeded went back from %d to %d", i, succeeded, s.Succeeded)
		}
		succeeded = s.Succeeded
	}
	first, last := rep.Series[0], rep.Series[len(rep.Series)-1]
	if first.Held {
		t.Errorf("the first period (to %.1fs) is flagged held, the hold starts at 2s", first.At)
	}
	held := 0
	for _, s := range rep.Series {
		if s.Held {
			held++
		}
	}
	if held == 0 {
		t.Errorf("no period flagged held:\n%s", progress.String())
	}
	if last.Held && last.At > 5 {
		t.Errorf("the last period (to %.1fs) is flagged held, the hold ended at 4s", last.At)
	}
	if last.Succeeded != 4000 {
		t.Errorf("the last sample counts %d SUCCEEDED, want 4000", last.Succeeded)
	}
	var pages int64
	for _, s := range rep.Series {
		pages += s.RescuePageMS.Count
	}
	if pages == 0 {
		t.Errorf("the rescuer probe timed no page")
	}
	h := rep.Hold
	if h == nil || h.Held.Periods == 0 || h.Clean.Periods == 0 || h.Held.Periods > held {
		t.Errorf("hold summary %+v, with %d held periods", h, held)
	}
	rows, err := csv.NewReader(&csvOut).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(rep.Series)+1 || rows[0][0] != "at_s" {
		t.Errorf("CSV has %d rows (header %v), want a header and %d samples", len(rows), rows[0], len(rep.Series))
	}
}

// TestRunSoakRetention: a soak run with Retention deletes SUCCEEDED tasks
// as the run goes (Run checks that none is lost: every task's success
// was seen and the tasks left are SUCCEEDED), reports the deletions (the
// samples, from retention's metric, at most the run's total, counted in
// the database), and times every route
// of SoakRoutes in each sample, each answering 200.
func TestRunSoakRetention(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
	var progress bytes.Buffer
	rep, err := bench.Run(context.Background(), bench.Options{Tasks: 3000, Rate: 1000, Concurrency: 200, Soak: true,
		Sample: 500 * time.Millisecond, Retention: 200 * time.Millisecond}, db.Pool, rdb, &progress)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if rep.RetentionDeleted == 0 {
		t.Errorf("retention deleted no task during the run\n%s", progress.String())
	}
	if rep.Succeeded != 3000 {
		t.Errorf("%d SUCCEEDED, want 3000", rep.Succeeded)
	}
	var deleted int64
	for i, s := range rep.Series {
		deleted += s.RetentionDeleted
		for _, route := range bench.SoakRoutes {
			if ms, ok := s.HTTPMS[route]; !ok || ms <= 0 {
				t.Errorf("sample %d: %s took %v ms (negative: the status it answered)", i, route, ms)
			}
		}
		for _, name := range bench.Tables {
			if s.Tables[name].TotalBytes <= 0 || len(s.Tables[name].IndexBytes) == 0 {
				t.Errorf("sample %d: %s sizes %+v", i, name, s.Tables[name])
			}
		}
	}
	var deletes int64
	for _, s := range rep.Series {
		deletes += s.Deletes.Count
	}
	if deletes == 0 {
		t.Errorf("no sample timed a DELETE of retention")
	}
	if deleted == 0 || deleted > rep.RetentionDeleted {
		t.Errorf("the samples count %d deletions, the report %d", deleted, rep.RetentionDeleted)
	}
}
