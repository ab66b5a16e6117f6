package main

import (
	"strings"
	"testing"
)

// FuzzConfig: whatever value a setting's environment variable holds,
// loading the configuration does not panic, and a refused value is named
// by its variable; a secret (a URL's password) is never echoed. Run:
// go test -run='^$' -fuzz='^FuzzConfig$' ./cmd/ingest-worker
func FuzzConfig(f *testing.F) {
	f.Add(uint8(0), "postgres://u:s3cr3t-pw@db:5432/ingest?sslmode=require")
	f.Add(uint8(1), "rediss://:s3cr3t-pw@cache:6380/1")
	f.Add(uint8(1), "redis://u:s3cr3t-pw@[::1:6379/x")
	f.Add(uint8(2), "{ingest}:tasks")
	f.Add(uint8(4), "-1")
	f.Add(uint8(5), "99999999999999999999")
	f.Add(uint8(9), "true")
	f.Add(uint8(10), "")
	f.Add(uint8(17), "0x10")
	f.Add(uint8(20), "http://h\x00ook")
	f.Fuzz(func(t *testing.T, which uint8, value string) {
		s := settings[int(which)%len(settings)]
		lookup := func(name string) (string, bool) {
			if name == s.env {
				return value, true
			}
			return "", false
		}
		cfg, _, err := loadConfig(nil, lookup, nil)
		if err == nil {
			if cfg == nil {
				t.Fatalf("%s=%q: no error and no configuration", s.env, value)
			}
			return
		}
		msg := err.Error()
		if !strings.Contains(msg, s.env) {
			t.Fatalf("%s=%q: the error names no setting: %s", s.env, value, msg)
		}
		// A password in a URL's user info (scheme://user:PASSWORD@host).
		if s.secret && strings.Contains(value, "://") && strings.Contains(value, ":s3cr3t-pw@") && strings.Contains(msg, "s3cr3t-pw") {
			t.Fatalf("%s=%q: the error echoes the password: %s", s.env, value, msg)
		}
	})
}
