package kafka_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/kafka"
)

func TestConfigValidationNamesTheField(t *testing.T) {
	t.Parallel()
	brokers := []string{"127.0.0.1:9092"}
	for _, tc := range []struct {
		name string
		cfg  kafka.Config
		want string // "" for valid
	}{
		{"Defaults", kafka.Config{Brokers: brokers}, ""},
		{"NoBrokers", kafka.Config{}, "kafka: Brokers: must name at least one broker"},
		{"EmptyBroker", kafka.Config{Brokers: []string{"a:1", ""}}, "kafka: Brokers[1]: is empty"},
		{"DLQIsTopic", kafka.Config{Brokers: brokers, Topic: "t", DLQTopic: "t"}, `kafka: DLQTopic: must differ from Topic ("t")`},
		{"ProduceTimeout", kafka.Config{Brokers: brokers, ProduceTimeout: time.Microsecond}, "kafka: ProduceTimeout: must be at least 1ms, got 1µs"},
		{"RedeliverDelay", kafka.Config{Brokers: brokers, RedeliverDelay: -time.Second}, "kafka: RedeliverDelay: must be more than 0s, got -1s"},
		{"CommitInterval", kafka.Config{Brokers: brokers, CommitInterval: -time.Second}, "kafka: CommitInterval: must be more than 0s, got -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.want != "" && (!errors.Is(err, kafka.ErrConfig) || err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want a kafka.ErrConfig starting %q", err, tc.want)
			}
		})
	}
}
