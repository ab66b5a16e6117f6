package api

import (
	"errors"
	"regexp"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/task"
)

// singleDependencies refuses what only a batch may hold: a ref, and a
// depends_on entry that is no task id.
func singleDependencies(nt task.NewTask) *inputError {
	if nt.Ref != "" {
		return badInput("ref", "ref names an item of a batch: use POST /v1/tasks:batch")
	}
	if len(nt.DependsOnRefs) > 0 {
		return badInput("depends_on", "depends_on %q is not a task id (refs name items of POST /v1/tasks:batch)", clip.String(nt.DependsOnRefs[0], 64))
	}
	return nil
}

// batchRefs makes a depends_on entry of a batch that is the ref of one of
// its items a ref, also when it reads as a task id.
func batchRefs(nts []task.NewTask) {
	refs := map[string]bool{}
	for _, nt := range nts {
		if nt.Ref != "" {
			refs[nt.Ref] = true
		}
	}
	for i := range nts {
		ids := nts[i].DependsOn[:0:0]
		for _, id := range nts[i].DependsOn {
			if refs[id.String()] {
				nts[i].DependsOnRefs = append(nts[i].DependsOnRefs, id.String())
				continue
			}
			ids = append(ids, id)
		}
		if len(ids) != len(nts[i].DependsOn) {
			nts[i].DependsOn = ids
		}
	}
}

// taskPosition reads the batch position a store error of a batch starts
// with ("task 3: ...").
var taskPosition = regexp.MustCompile(`^task (\d+): `)

// batchFieldError names the field of a batch's store error by its
// position, as the request's own checks do ("[3].depends_on").
func batchFieldError(err error) error {
	var ferr *task.FieldError
	if !errors.As(err, &ferr) {
		return err
	}
	m := taskPosition.FindStringSubmatch(ferr.Msg)
	if m == nil || ferr.Field == "" {
		return err
	}
	return &task.FieldError{Field: "[" + m[1] + "]." + ferr.Field, Msg: ferr.Msg, TooLarge: ferr.TooLarge}
}
