// Package opsmetrics holds the counters of operators' actions that the API
// and the dashboard share: both may serve from one process (ingest-worker
// run) and register on one registry, so each counter is registered once
// and reused.
package opsmetrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// DeletedName is the counter of tasks deleted by an operator, labelled
// via ("api" or "ui").
const DeletedName = "ingest_task_deleted_total"

// Deleted returns the counter of deleted tasks registered on reg (the one
// already registered there, if any). A nil reg returns an unregistered
// counter.
func Deleted(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: DeletedName,
		Help: "Tasks deleted by an operator (terminal tasks, with their audit and outbox rows), by the interface used (api, ui).",
	}, []string{"via"})
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if prev, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return prev, nil
			}
		}
		return nil, err
	}
	return c, nil
}
