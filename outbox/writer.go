package outbox

import (
	"context"

	"github.com/google/uuid"
)

// Mode is how a Writer with a relay hands the tasks its transactions make
// due to that relay (see the package's note on direct publishing).
type Mode int

const (
	// PublishClaimed writes the rows in the transaction, claimed by the
	// relay (insertClaimed), and hands them over once it has committed. A
	// process that dies first leaves ordinary claimed rows, which any
	// relay publishes once the claim expires: it needs nothing but relays.
	PublishClaimed Mode = iota
	// PublishAfterCommit writes no row in a transaction that creates
	// tasks (StageCreated): once it has committed the relay XADDs them
	// and writes each one's row once, SENT (reserve), half the writes. A
	// process that dies in between leaves tasks with no outbox row, which
	// only the rescuer of package maintenance republishes, after its
	// grace: use it only where a rescuer runs. Tasks that existed before
	// the transaction (Stage) get claimed rows, as with PublishClaimed.
	PublishAfterCommit
)

// Writer writes the outbox rows of tasks due now in the transaction that
// makes them due, and is the one place that decides how they reach the
// stream:
//
//   - the zero Writer (no relay) writes the rows of created tasks to the
//     outbox log (InsertLog; those of tasks with a group or a sequence,
//     and of tasks made due again, NEW rows: Insert); a relay finds them
//     on the NOTIFY of the commit;
//   - a Writer whose relay runs and has room (see DirectBacklog) hands the
//     tasks to it after the commit, as its Mode says;
//   - otherwise (the relay is not running, or its DirectBacklog claims are
//     in flight) it writes NEW rows: a relay that is not running is simply
//     not used.
//
// The guarantee is the same on every path: a task committed due now is
// published, at least once. A Writer is a value, safe for concurrent use
// (its relay is).
type Writer struct {
	relay *Relay
	mode  Mode
}

// NewWriter returns a writer that hands tasks to relay r as mode says; a
// nil r gives the zero Writer.
func NewWriter(r *Relay, mode Mode) Writer {
	return Writer{relay: r, mode: mode}
}

// StageCreated writes in tx what the outbox needs to publish msgs, tasks
// due now that tx creates (they have no outbox row yet), and returns the
// claim to finish once tx has ended: Publish when it committed, Discard
// when it did not. Call it only in a transaction the caller commits
// itself: a claim taken in someone else's transaction cannot be finished
// (use the zero Writer there).
func (w Writer) StageCreated(ctx context.Context, tx Querier, msgs []Message) (Claim, error) {
	if w.relay != nil && w.mode == PublishAfterCommit && len(msgs) > 0 {
		if c, ok := w.relay.reserve(msgs); ok {
			return c, nil
		}
		return Claim{}, insertCreated(ctx, tx, msgs)
	}
	if w.relay == nil {
		return Claim{}, insertCreated(ctx, tx, msgs)
	}
	return w.Stage(ctx, tx, msgs)
}

// insertCreated writes the rows of created tasks msgs: to the log
// (InsertLog) for tasks without a group or sequence, NEW rows of
// outbox_row (Insert) for the others.
func insertCreated(ctx context.Context, db Execer, msgs []Message) error {
	var logged, kept []Message
	for _, m := range msgs {
		if m.Grouped {
			kept = append(kept, m)
		} else {
			logged = append(logged, m)
		}
	}
	if err := byStream(logged, func(stream string, ids []uuid.UUID) error { return InsertLog(ctx, db, stream, ids...) }); err != nil {
		return err
	}
	return insertMessages(ctx, db, kept)
}

// Stage is StageCreated for tasks that existed before tx and that tx
// makes due again (a parked task released): their rows are written in tx
// whatever the Mode, claimed by a running relay with room, so that a
// crash before the publish leaves a row that a relay finds.
func (w Writer) Stage(ctx context.Context, tx Querier, msgs []Message) (Claim, error) {
	if w.relay == nil || len(msgs) == 0 {
		return Claim{}, insertMessages(ctx, tx, msgs)
	}
	return w.relay.insertClaimed(ctx, tx, msgs)
}

// insertMessages writes one NEW row per message (Insert), one statement
// per run of messages to the same stream.
func insertMessages(ctx context.Context, db Execer, msgs []Message) error {
	return byStream(msgs, func(stream string, ids []uuid.UUID) error { return Insert(ctx, db, stream, ids...) })
}

// byStream calls write with the task ids of each run of msgs to the same
// stream, in order, until one fails.
func byStream(msgs []Message, write func(stream string, ids []uuid.UUID) error) error {
	for len(msgs) > 0 {
		n := 1
		for n < len(msgs) && msgs[n].Stream == msgs[0].Stream {
			n++
		}
		if err := write(msgs[0].Stream, taskIDs(msgs[:n])); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// WakeByCaller, added to a transaction's set_config settings, tells
// outbox_event's trigger (migration 00034) that the caller wakes a relay
// itself once the transaction has committed: the unsent rows the
// transaction writes send no NOTIFY, whose commit PostgreSQL serializes
// with every other notifying commit of the server, and the trigger
// records instead that there are rows to publish, which WakeDueSQL reads.
// Use it only through Writer.Wakes: a transaction whose caller does not
// wake a running relay leaves its rows to the relays' polls.
const WakeByCaller = `set_config('ingest.outbox_wake', 'caller', true)`

// WakeDueSQL, the last statement of a transaction that set WakeByCaller,
// reads whether it wrote rows to publish: if true, the caller wakes its
// relay (Writer.Wake) once the transaction has committed.
const WakeDueSQL = `SELECT coalesce(current_setting('ingest.outbox_wake', true), '') = 'due'`

// Wakes reports whether w's relay is running, so that a transaction of
// this process may write rows with WakeByCaller and Wake the relay after
// its commit instead of notifying every relay.
func (w Writer) Wakes() bool { return w.relay != nil && w.relay.running.Load() }

// Wake starts a pass of w's relay (none for the zero Writer).
func (w Writer) Wake() {
	if w.relay != nil {
		w.relay.Wake()
	}
}
