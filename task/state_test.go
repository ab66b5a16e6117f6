package task_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/task"
)

func TestCanTransition(t *testing.T) {
	t.Parallel()
	// The table of docs/ARCHITECTURE.md §2.2, written out independently of the code's.
	allowed := map[[2]task.State]bool{
		{"", task.Queued}:               true, // enqueue
		{task.Queued, task.Running}:     true, // start
		{task.Retrying, task.Running}:   true, // start when due
		{task.Running, task.Running}:    true, // takeover of an expired lease
		{task.Running, task.Succeeded}:  true,
		{task.Running, task.Retrying}:   true, // failure with attempts left, or release
		{task.Running, task.Dead}:       true, // exhausted or permanent
		{task.Dead, task.Queued}:        true, // redrive
		{task.Queued, task.Cancelled}:   true, // cancel of a waiting task
		{task.Retrying, task.Cancelled}: true,
		{task.Running, task.Cancelled}:  true, // cancel of a running task, at its completion
		{task.Cancelled, task.Queued}:   true, // redrive
	}
	all := append([]task.State{""}, task.States...)
	all = append(all, "BOGUS")
	n := 0
	for _, from := range all {
		for _, to := range all {
			want := allowed[[2]task.State{from, to}]
			if want {
				n++
			}
			t.Run(fmt.Sprintf("%sTo%s", name(from), name(to)), func(t *testing.T) {
				if got := task.CanTransition(from, to); got != want {
					t.Errorf("CanTransition(%q, %q) = %v, want %v", from, to, got, want)
				}
			})
		}
	}
	if n != len(allowed) {
		t.Fatalf("the test table has %d allowed pairs but only %d were checked", len(allowed), n)
	}
}

func name(s task.State) string {
	switch s {
	case "":
		return "Nothing"
	case "BOGUS":
		return "Bogus"
	}
	return string(s[:1]) + strings.ToLower(string(s[1:]))
}

func TestState(t *testing.T) {
	t.Parallel()
	tests := []struct {
		state           task.State
		valid, terminal bool
	}{
		{task.Queued, true, false},
		{task.Running, true, false},
		{task.Retrying, true, false},
		{task.Succeeded, true, true},
		{task.Dead, true, true},
		{task.Cancelled, true, true},
		{"", false, false},
		{"queued", false, false},
		{"BOGUS", false, false},
	}
	for _, tt := range tests {
		if got := tt.state.Valid(); got != tt.valid {
			t.Errorf("State(%q).Valid() = %v, want %v", tt.state, got, tt.valid)
		}
		if got := tt.state.Terminal(); got != tt.terminal {
			t.Errorf("State(%q).Terminal() = %v, want %v", tt.state, got, tt.terminal)
		}
	}
	if len(task.States) != 6 {
		t.Errorf("States has %d entries, want the 6 of docs/ARCHITECTURE.md §2.1", len(task.States))
	}
}
