package task_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ingest-worker/ingest/task"
)

func TestLastErrorTruncation(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	// 100 001 bytes; byte MaxErrorBytes falls inside a two-byte rune.
	long := "x" + strings.Repeat("é", 50_000)
	tests := []struct {
		name      string
		in        string
		want      string
		permanent bool
	}{
		{"Short", "connection refused", "connection refused", false},
		{"ExactlyMax", strings.Repeat("a", task.MaxErrorBytes), strings.Repeat("a", task.MaxErrorBytes), false},
		{"OneOver", strings.Repeat("a", task.MaxErrorBytes+1), strings.Repeat("a", task.MaxErrorBytes), false},
		{"HundredKBCutAtRune", long, long[:task.MaxErrorBytes-1], false},
		{"HundredKBPermanent", long, long[:task.MaxErrorBytes-1], true},
		{"InvalidUTF8AndNUL", "bad \xff\xfe byte and \x00 nul", "bad \uFFFD\uFFFD byte and \uFFFD nul", false},
		// Each invalid byte becomes a three-byte U+FFFD: 1365 of them fit.
		{"HundredKBInvalid", strings.Repeat("\xff", 100_000), strings.Repeat("\uFFFD", task.MaxErrorBytes/3), false},
		{"Empty", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			r := b.fail(t, "w1", task.Failure{ID: id, Error: tt.in, Permanent: tt.permanent})
			tk := b.get(t, id)
			for what, got := range map[string]string{"result": r.LastError, "last_error": tk.LastError, "error_message": tk.ErrorMessage} {
				if got != tt.want {
					t.Errorf("%s = %.60q... (%d bytes), want %.60q... (%d bytes)", what, got, len(got), tt.want, len(tt.want))
				}
			}
			msg := b.lastTransition(t, id).Message
			if len(msg) > task.MaxErrorBytes || !utf8.ValidString(msg) || strings.ContainsRune(msg, 0) {
				t.Errorf("transition message is %d bytes, valid UTF-8 %v: want at most %d bytes of valid UTF-8 without NUL",
					len(msg), utf8.ValidString(msg), task.MaxErrorBytes)
			}
			wantMsg := tt.want
			if tt.permanent {
				wantMsg = "permanent: " + tt.want
			}
			if !strings.HasPrefix(wantMsg, msg) || len(msg) < min(len(wantMsg), task.MaxErrorBytes-3) {
				t.Errorf("transition message = %.60q... (%d bytes), want a rune-aligned prefix of %.60q...", msg, len(msg), wantMsg)
			}
		})
	}
}
