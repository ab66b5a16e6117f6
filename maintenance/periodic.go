package maintenance

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/ingest-worker/ingest/internal/configerr"
	"github.com/ingest-worker/ingest/task"
)

// Periodic tasks.
//
// Each Schedule produces one task per slot: a time given by its cron
// expression (UTC) or a multiple of its Every since the Unix epoch, so
// every process computes the same slots. The leader's periodic service
// creates the task of a slot once the slot has come, with the idempotency
// key "periodic:<name>:<slot RFC 3339>" (task.PeriodicKey): the unique
// (kind, idempotency_key) makes a second task for a slot impossible, even
// when two processes believe they lead across a leader change.
//
// Missed slots are skipped, not caught up: a new leader creates only the
// latest slot that has come, and only when it is at most Grace old (a
// slot that fell due during a failover); older ones, such as those of a
// time when every process was down, are never created. While it leads, it
// creates every slot as it comes.

// Periodic defaults.
const (
	// DefaultPeriodicInterval is how often the leader looks for slots that
	// have come: a slot's task is created within about this long after it.
	DefaultPeriodicInterval = time.Second
	// DefaultPeriodicGrace is how old a slot a new leader still creates.
	DefaultPeriodicGrace = 30 * time.Second
	// MinEvery is the shortest Every accepted.
	MinEvery = time.Second
)

// componentPeriodic names the periodic service in logs and in
// outbox_maintenance_errors_total{component}.
const componentPeriodic = "periodic"

// Schedule is one periodic task. Exactly one of Every and Cron is set.
type Schedule struct {
	// Name identifies the schedule in idempotency keys and NextSlots;
	// default Kind. Names must be unique (set it when two schedules share
	// a kind).
	Name string
	// Kind and Payload are those of the tasks created (Payload default {}).
	Kind    string
	Payload json.RawMessage
	// Every: a slot at each multiple of Every since the Unix epoch
	// (>= MinEvery).
	Every time.Duration
	// Cron: a standard 5-field cron expression (minute hour day-of-month
	// month day-of-week, or a descriptor like @hourly), in UTC unless it
	// starts with CRON_TZ=<zone>.
	Cron string
	// MaxAttempts and Timeout of the tasks created (0: the defaults).
	MaxAttempts int
	Timeout     time.Duration

	cron cron.Schedule // parsed Cron, set by validate
}

// validate checks s, sets its defaults and parses its cron expression;
// errors name the field, prefixed with where.
func (s *Schedule) validate(where string) error {
	bad := func(field, format string, args ...any) error {
		return configErr(where+"."+field, format, args...)
	}
	s.Kind = strings.TrimSpace(s.Kind)
	if s.Name == "" {
		s.Name = s.Kind
	}
	if len(bytes.TrimSpace(s.Payload)) == 0 {
		s.Payload = json.RawMessage(`{}`)
	}
	switch {
	case s.Kind == "":
		return bad("kind", "is required")
	case s.Every == 0 && s.Cron == "":
		return bad("every", "is required when cron is not set")
	case s.Every != 0 && s.Cron != "":
		return bad("every", "must not be set with cron")
	case s.Cron == "" && s.Every < MinEvery:
		return bad("every", "must be at least %s, got %s", MinEvery, s.Every)
	}
	if s.Cron != "" {
		c, err := cron.ParseStandard(s.Cron)
		if err != nil {
			return bad("cron", "%q: %v", s.Cron, err)
		}
		s.cron = c
	}
	nt := s.newTask(time.Unix(0, 0))
	if ferr := nt.Validate(task.DefaultMaxPayloadBytes); ferr != nil {
		return bad(ferr.Field, "%s", ferr.Msg)
	}
	return nil
}

// Next returns the first slot of s after t, in UTC. It returns the zero
// time when there is none: an invalid schedule, or a cron expression that
// never matches again.
func (s *Schedule) Next(t time.Time) time.Time {
	if s.Cron != "" {
		c := s.cron
		if c == nil {
			var err error
			if c, err = cron.ParseStandard(s.Cron); err != nil {
				return time.Time{}
			}
		}
		return c.Next(t.UTC())
	}
	if s.Every <= 0 {
		return time.Time{}
	}
	n := t.UnixNano() / int64(s.Every)
	if t.UnixNano() < 0 && t.UnixNano()%int64(s.Every) != 0 {
		n-- // floor, not truncation, before the epoch
	}
	return time.Unix(0, (n+1)*int64(s.Every)).UTC()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// PeriodicKey is the idempotency key of the task of schedule name's slot.
func PeriodicKey(name string, slot time.Time) string {
	return "periodic:" + name + ":" + slot.UTC().Format(time.RFC3339)
}

// newTask is the task of slot.
func (s *Schedule) newTask(slot time.Time) task.NewTask {
	return task.NewTask{Kind: s.Kind, Payload: s.Payload, IdempotencyKey: PeriodicKey(s.Name, slot),
		MaxAttempts: s.MaxAttempts, Timeout: s.Timeout}
}

// PeriodicConfig configures the periodic service, which runs while
// Schedules is not empty.
type PeriodicConfig struct {
	Schedules []Schedule
	// Interval is the period of the leader's check for slots that have
	// come. Default DefaultPeriodicInterval.
	Interval time.Duration
	// Grace is how old a slot a new leader still creates (see the package
	// documentation). Default DefaultPeriodicGrace.
	Grace time.Duration
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c PeriodicConfig) WithDefaults() PeriodicConfig {
	c.Interval = cmp.Or(c.Interval, DefaultPeriodicInterval)
	c.Grace = cmp.Or(c.Grace, DefaultPeriodicGrace)
	return c
}

// validate checks the configuration and parses the schedules in place.
func (c *PeriodicConfig) validate() error {
	switch {
	case c.Interval < time.Millisecond:
		return configErr("Periodic.Interval", "must be at least 1ms, got %s", c.Interval)
	case c.Grace < 0:
		return configErr("Periodic.Grace", "must be at least 0s, got %s", c.Grace)
	}
	s, err := validateSchedules(c.Schedules, "Periodic.Schedules")
	c.Schedules = s
	return err
}

// validateSchedules validates a copy of schedules; errors name the entry
// as prefix[i].field.
func validateSchedules(schedules []Schedule, prefix string) ([]Schedule, error) {
	out := make([]Schedule, len(schedules))
	names := map[string]int{}
	for i, s := range schedules {
		where := fmt.Sprintf("%s[%d]", prefix, i)
		if err := s.validate(where); err != nil {
			return nil, err
		}
		if j, dup := names[s.Name]; dup {
			return nil, configErr(where+".name", "%q is also the name of entry %d (set name when two schedules share a kind)", s.Name, j)
		}
		names[s.Name] = i
		out[i] = s
	}
	return out, nil
}

// ParseSchedules parses a JSON array of schedules, e.g.
//
//	[{"kind":"sync","every":"30s"},{"kind":"report","cron":"0 3 * * *","payload":{"x":1}}]
//
// Each entry has kind, every (a Go duration) or cron, and optionally name,
// payload, max_attempts and timeout_ms. Errors name the entry and field
// as source[i].field (source may be empty).
func ParseSchedules(source string, data []byte) ([]Schedule, error) {
	type entry struct {
		Name        string          `json:"name"`
		Kind        string          `json:"kind"`
		Every       string          `json:"every"`
		Cron        string          `json:"cron"`
		Payload     json.RawMessage `json:"payload"`
		MaxAttempts int             `json:"max_attempts"`
		TimeoutMS   int64           `json:"timeout_ms"`
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		if source == "" {
			return nil, fmt.Errorf("not a JSON array of schedules: %v", err)
		}
		return nil, fmt.Errorf("%s: not a JSON array of schedules: %v", source, err)
	}
	out := make([]Schedule, len(raw))
	for i, r := range raw {
		where := fmt.Sprintf("%s[%d]", source, i)
		var e entry
		dec := json.NewDecoder(bytes.NewReader(r))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("%s: %v", where, err)
		}
		timeout, ferr := task.TimeoutRange.Millis(e.TimeoutMS)
		if ferr != nil {
			return nil, fmt.Errorf("%s.timeout_ms: %s", where, ferr.Msg)
		}
		s := Schedule{Name: e.Name, Kind: e.Kind, Cron: e.Cron, Payload: e.Payload, MaxAttempts: e.MaxAttempts, Timeout: timeout}
		if e.Every != "" {
			d, err := time.ParseDuration(e.Every)
			if err != nil {
				return nil, fmt.Errorf("%s.every: %q is not a duration (e.g. 30s, 5m, 1h)", where, e.Every)
			}
			s.Every = d
		}
		out[i] = s
	}
	s, err := validateSchedules(out, source)
	if e, ok := errors.AsType[*configerr.Error](err); ok {
		// Named as the source names it, not as a field of Config.
		return nil, fmt.Errorf("%s: %s", e.Setting, e.Problem)
	}
	return s, err
}

// Slot is the next slot of one schedule.
type Slot struct {
	Name string    `json:"name"`
	Kind string    `json:"kind"`
	At   time.Time `json:"next_slot"`
	// IdempotencyKey is the key of the slot's task.
	IdempotencyKey string `json:"idempotency_key"`
}

// NextSlots returns the next slot after now of every schedule, in the
// configured order. It is the same on every process.
func (m *Maintainer) NextSlots(now time.Time) []Slot {
	return NextSlots(m.cfg.Periodic.Schedules, now)
}

// NextSlots returns the next slot after now of each of schedules (as
// ParseSchedules returns them), in order: a function of the schedules
// alone, so any process (the CLI too) computes the leader's slots.
func NextSlots(schedules []Schedule, now time.Time) []Slot {
	out := make([]Slot, 0, len(schedules))
	for i := range schedules {
		s := &schedules[i]
		at := s.Next(now)
		out = append(out, Slot{Name: s.Name, Kind: s.Kind, At: at, IdempotencyKey: PeriodicKey(s.Name, at)})
	}
	return out
}

// periodic is the periodic service.
type periodic struct {
	cfg     PeriodicConfig
	store   *task.Store
	metrics *metrics
	now     func() time.Time

	mu sync.Mutex
	// done is, per schedule, the latest slot created (or skipped) under
	// the current leadership; nil until the first pass of a leadership.
	done []time.Time
}

func newPeriodic(cfg PeriodicConfig, store *task.Store, m *metrics) *periodic {
	return &periodic{cfg: cfg, store: store, metrics: m, now: time.Now}
}

func (p *periodic) service() *service {
	return &service{
		name:     componentPeriodic,
		interval: p.cfg.Interval,
		msg:      "created periodic tasks",
		start:    p.reset,
		pass: func(ctx context.Context) ([]any, error) {
			created, existing, err := p.runOnce(ctx)
			if err != nil || created+existing == 0 {
				return nil, err
			}
			return []any{"created", created, "existing", existing}, nil
		},
		failed: func() { p.metrics.failures.WithLabelValues(componentPeriodic).Inc() },
	}
}

// reset forgets the slots done: a new leadership starts from the latest
// slot only.
func (p *periodic) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = nil
}

// due returns the slots to create now, per schedule, and what done becomes
// once they are created.
func (p *periodic) due(now time.Time) (slots [][]time.Time, next []time.Time) {
	scheds := p.cfg.Schedules
	slots = make([][]time.Time, len(scheds))
	next = make([]time.Time, len(scheds))
	oldest := now.Add(-p.cfg.Grace)
	for i := range scheds {
		s := &scheds[i]
		if p.done == nil {
			// A new leader: the latest slot within the grace, if any.
			next[i] = now
			for at := s.Next(oldest); !at.IsZero() && !at.After(now); at = s.Next(at) {
				slots[i], next[i] = []time.Time{at}, at
			}
			continue
		}
		// Slots older than the grace (a leader stalled that long) are
		// skipped like those of a downtime.
		next[i] = p.done[i]
		for at := s.Next(later(p.done[i], oldest)); !at.IsZero() && !at.After(now); at = s.Next(at) {
			slots[i] = append(slots[i], at)
			next[i] = at
		}
	}
	return slots, next
}

// runOnce creates the tasks of the slots that have come, in one
// transaction.
func (p *periodic) runOnce(ctx context.Context) (created, existing int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	slots, next := p.due(p.now())
	var nts []task.NewTask
	for i, ss := range slots {
		for _, at := range ss {
			nts = append(nts, p.cfg.Schedules[i].newTask(at))
		}
	}
	if len(nts) > 0 {
		res, err := p.store.CreateBatch(ctx, nts)
		if err != nil {
			return 0, 0, fmt.Errorf("create %d periodic tasks: %w", len(nts), err)
		}
		for _, r := range res {
			if r.Existing {
				existing++
			} else {
				created++
			}
		}
	}
	p.done = next
	return created, existing, nil
}
