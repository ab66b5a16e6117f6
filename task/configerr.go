package task

import "github.com/ingest-worker/ingest/internal/configerr"

// configErr is the error of a bad field of Config, in the form package
// configerr owns: "task: MaxAttempts: must be ...".
func configErr(setting, format string, args ...any) error {
	return configerr.New("task", nil, setting, format, args...)
}

// configWithin is err, the error of a nested configuration (the backoff
// policy), as the error of Config's field prefix.
func configWithin(prefix string, err error) error {
	return configerr.Within("task", nil, prefix, err)
}
