package task_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

func TestNewStoreConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     task.Config
		wantErr string
	}{
		{"ZeroTakesDefaults", task.Config{}, ""},
		{"Custom", task.Config{Stream: "s", MaxAttempts: 1, MaxPayloadBytes: 2, Backoff: task.Backoff{Base: 1, Max: 1}}, ""},
		{"NegativeMaxAttempts", task.Config{MaxAttempts: -1}, "task: MaxAttempts: must be from 1 to 1000000, got -1"},
		{"TinyPayloadLimit", task.Config{MaxPayloadBytes: 1}, "task: MaxPayloadBytes: must be from 2 to"},
		{"BadBackoff", task.Config{Backoff: task.Backoff{Base: time.Second}}, "task: Backoff.Max: must be at least Base (1s), got 0s"},
		{"NegativeBackoff", task.Config{Backoff: task.Backoff{Base: -time.Second, Max: time.Second}}, "task: Backoff.Base: must be at least 0s, got -1s"},
		{"ZeroDelayKept", task.Config{Backoff: task.Backoff{Jitter: 0.1}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := task.NewStore(tt.cfg, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewStore() error = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewStore() = %v", err)
			}
			if tt.cfg.Backoff != (task.Backoff{}) && s.Config().Backoff != tt.cfg.Backoff {
				t.Fatalf("Config().Backoff = %+v, want the configured %+v", s.Config().Backoff, tt.cfg.Backoff)
			}
			if tt.name == "ZeroTakesDefaults" {
				want := task.Config{Stream: task.DefaultStream, MaxAttempts: task.DefaultMaxAttempts,
					MaxPayloadBytes: task.DefaultMaxPayloadBytes, MaxResultBytes: task.DefaultMaxResultBytes, Backoff: task.DefaultBackoff}
				if got := s.Config(); got != want {
					t.Fatalf("Config() = %+v, want the defaults %+v", got, want)
				}
			}
		})
	}
}
