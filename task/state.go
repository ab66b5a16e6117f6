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

// StartOutcome is the result of trying to start one task: a closed set,
// one value for each thing a worker does differently with the message
// that carried the task.
type StartOutcome string

const (
	// Started: the task was QUEUED or RETRYING and due; it is RUNNING
	// under the caller's lease.
	Started StartOutcome = "STARTED"
	// TakenOver: the task was RUNNING under an expired lease; the
	// abandoned run counted as a failed attempt and the task is RUNNING
	// under the caller's lease.
	TakenOver StartOutcome = "TAKEN_OVER"
	// DiedOnTakeover: the task was RUNNING under an expired lease and the
	// abandoned run was its last attempt: this call moved it to DEAD, and
	// the caller dead-letters its message.
	DiedOnTakeover StartOutcome = "DIED_ON_TAKEOVER"
	// CancelledOnTakeover: the task was RUNNING under an expired lease
	// with a cancel request: this call moved it to CANCELLED, no attempt
	// counted.
	CancelledOnTakeover StartOutcome = "CANCELLED_ON_TAKEOVER"
	// Finished: the task had already finished (SUCCEEDED, DEAD or
	// CANCELLED; Task.Status says which).
	Finished StartOutcome = "FINISHED"
	// LeaseHeld: the task is RUNNING under a live lease (another run's,
	// possibly the caller's own under another message).
	LeaseHeld StartOutcome = "LEASE_HELD"
	// NotDue: the task is QUEUED or RETRYING with next_retry_at in the
	// future.
	NotDue StartOutcome = "NOT_DUE"
	// Parked: the task waits parked (Task.Parked: its kind is paused or
	// was at a limit) since before this call; the release of parked tasks
	// publishes it again.
	Parked StartOutcome = "PARKED"
	// Held: the task is QUEUED and held by its dependencies (or a
	// sequence predecessor) that have not ended (Task.WaitingFor > 0);
	// the release of its last one publishes it again.
	Held StartOutcome = "HELD"
	// ParkedAtLimit: StartLimited parked the task, due and waiting,
	// because its kind is at its concurrency or rate limit; a freed slot
	// or the leader's releaser wakes it.
	ParkedAtLimit StartOutcome = "PARKED_AT_LIMIT"
	// Throttled: StartLimited held back the takeover of the task (RUNNING
	// under an expired lease) because its kind is at a limit; it did not
	// change: try again later.
	Throttled StartOutcome = "THROTTLED"
	// NotFound: no task has that id.
	NotFound StartOutcome = "NOT_FOUND"
)

// waitingOutcome is the outcome of a QUEUED or RETRYING task that did not
// start: Held when held by its dependencies, Parked when parked, else
// NotDue.
func waitingOutcome(t *Task) StartOutcome {
	if t.WaitingFor > 0 {
		return Held
	}
	if t.Parked() {
		return Parked
	}
	return NotDue
}
