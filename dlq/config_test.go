package dlq_test

import (
	"testing"

	"github.com/ingest-worker/ingest/dlq"
)

func TestConfigValidationNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  dlq.Config
		want string // "" for valid
	}{
		{"Valid", dlq.Config{Stream: "s", Group: "g", DLQ: "d"}, ""},
		{"NoDLQ", dlq.Config{Stream: "s", Group: "g"}, ""},
		{"NoStream", dlq.Config{Group: "g"}, "dlq: Stream: is required"},
		{"NoGroup", dlq.Config{Stream: "s"}, "dlq: Group: is required"},
		{"DLQIsStream", dlq.Config{Stream: "s", Group: "g", DLQ: "s"}, `dlq: DLQ: must differ from Stream ("s")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}
