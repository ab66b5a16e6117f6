package task

import "slices"

// State is the status of a task (column ingest_task.status).
type State string

const (
	// Queued: created or redriven, waiting for its first (or a fresh) run.
	Queued State = "QUEUED"
	// Running: a worker holds the lease (lease_owner until lease_until) and
	// is running the handler.
	Running State = "RUNNING"
	// Retrying: a run failed and attempts remain; runnable again from
	// next_retry_at.
	Retrying State = "RETRYING"
	// Succeeded: terminal; the handler returned nil.
	Succeeded State = "SUCCEEDED"
	// Dead: terminal until an operator redrives it; attempts are exhausted
	// or the failure was permanent.
	Dead State = "DEAD"
	// Cancelled: terminal until an operator redrives it; an operator
	// cancelled the task (Store.Cancel), before it ran or while it ran.
	Cancelled State = "CANCELLED"
)

// States lists every state.
var States = []State{Queued, Running, Retrying, Succeeded, Dead, Cancelled}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether no worker will run a task in state s again:
// SUCCEEDED, DEAD or CANCELLED (see terminalStates).
func (s State) Terminal() bool { return slices.Contains(terminalStates, s) }

// allowed is the transition table of docs/ARCHITECTURE.md §2.2; "" is the state before
// creation.
var allowed = map[State][]State{
	"":        {Queued},
	Queued:    {Running, Cancelled},
	Retrying:  {Running, Cancelled},
	Running:   {Running, Succeeded, Retrying, Dead, Cancelled},
	Dead:      {Queued},
	Cancelled: {Queued},
	Succeeded: {},
}

// CanTransition reports whether from → to is an allowed transition ("" as
// from means creation). Running → Running is the takeover of an expired
// lease; Dead → Queued and Cancelled → Queued are the redrive.
func CanTransition(from, to State) bool {
	for _, s := range allowed[from] {
		if s == to {
			return true
		}
	}
	return false
}

// StartOutcome is the result of trying to start one task.
type StartOutcome string

const (
	// Started: the task is RUNNING under the caller's lease.
	Started StartOutcome = "STARTED"
	// Skipped: the task is terminal, or RUNNING under another live lease,
	// or this call's takeover used up its last attempt and moved it to DEAD
	// (StartResult.Died).
	Skipped StartOutcome = "SKIPPED"
	// NotDue: the task is RETRYING (or QUEUED) with next_retry_at in the
	// future.
	NotDue StartOutcome = "NOT_DUE"
	// NotFound: no task has that id.
	NotFound StartOutcome = "NOT_FOUND"
	// Throttled: the task's kind is at its concurrency or rate limit
	// (StartLimited); the task did not start.
	Throttled StartOutcome = "THROTTLED"
)
