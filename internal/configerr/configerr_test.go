package configerr_test

import (
	"errors"
	"testing"

	"github.com/ingest-worker/ingest/internal/configerr"
)

func TestForm(t *testing.T) {
	errKind := errors.New("invalid x config")
	inner := configerr.New("backoff", nil, "Max", "must be at least Base (%s), got %s", "1s", "0s")
	for _, tc := range []struct {
		name string
		err  error
		want string
		kind error
	}{
		{"New", configerr.New("reclaim", nil, "MinIdle", "must be at least 1ms, got %s", "0s"), "reclaim: MinIdle: must be at least 1ms, got 0s", nil},
		{"NewWithKind", configerr.New("maintenance", errKind, "Elector.TTL", "must be at least 10ms, got 1ms"), "maintenance: Elector.TTL: must be at least 10ms, got 1ms", errKind},
		{"Within", configerr.Within("task", nil, "Backoff", inner), "task: Backoff.Max: must be at least Base (1s), got 0s", nil},
		{"WithinKind", configerr.Within("outbox", errKind, "Backoff", inner), "outbox: Backoff.Max: must be at least Base (1s), got 0s", errKind},
		{"WithinOther", configerr.Within("task", nil, "Backoff", errors.New("broken")), "task: Backoff: broken", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
			if tc.kind != nil && !errors.Is(tc.err, tc.kind) {
				t.Errorf("%v does not wrap its package's sentinel", tc.err)
			}
			if e, ok := errors.AsType[*configerr.Error](tc.err); !ok || e.Package == "" || e.Setting == "" {
				t.Errorf("%v is no *configerr.Error with a package and a setting", tc.err)
			}
		})
	}
	if configerr.Within("task", nil, "Backoff", nil) != nil {
		t.Error("Within(nil) is not nil")
	}
}
