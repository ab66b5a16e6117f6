package redact

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDSN(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"Empty", "", ""},
		{"PostgresURL", "postgres://app:s3cret@db:5432/ingest?sslmode=disable", "postgres://app:" + Mask + "@db:5432/ingest?sslmode=disable"},
		{"PostgresNoPassword", "postgres://app@db/ingest", "postgres://app@db/ingest"},
		{"PasswordInQuery", "postgres://db/ingest?user=app&password=s3cret", "postgres://db/ingest?password=" + Mask + "&user=app"},
		{"RedisPasswordOnly", "redis://:s3cret@cache:6379/0", "redis://:" + Mask + "@cache:6379/0"},
		// Found by FuzzConfig: the password again further on, where no
		// mask looks.
		{"PasswordRepeated", "postgres:// :s3cr3t-pw@0000ostgres:// :s3cr3t-pw000", "postgres:// :" + Mask + "@0000ostgres:// :" + Mask + "000"},
		{"RedissUserPassword", "rediss://default:s3cret@cache:6380/1", "rediss://default:" + Mask + "@cache:6380/1"},
		{"EscapedPassword", "postgres://app:p%40ss%2Fw@db/x", "postgres://app:" + Mask + "@db/x"},
		{"KeyValue", "host=db user=app password=s3cret dbname=x", "host=db user=app password=" + Mask + " dbname=x"},
		// "#" starts a fragment: the "://:pw@" after it is no user info to url.Parse.
		// (No valid scheme either: masked from the first ":" to the "@".)
		{"FragmentBeforeScheme", "A#://:s3cret@", "A#:" + Mask + "@"},
		{"SecretInFragment", "redis://cache:6379/0#://u:s3cret@", "redis://cache:" + Mask + "@"}, // over-masks, never shows it
		{"KeyValueQuoted", "host=db password='s3 cret' dbname=x", "host=db password=" + Mask + " dbname=x"},
		{"KeyValueSpaces", "host=db PASSWORD = s3cret", "host=db PASSWORD = " + Mask},
		{"Unparsable", "postgres://app:s3cret@db:99999999999/%zz", "postgres://app:" + Mask + "@db:99999999999/%zz"},
		// Found by FuzzConfig: a space (or a "/") before the ":" hid the password from the mask.
		{"SpaceInUser", "postgres:// :s3cret@0000", "postgres:// :" + Mask + "@0000"},
		{"SlashInUser", "postgres://a/b:s3cret@h%zz", "postgres://a/b:" + Mask + "@h%zz"},
		{"SpaceInPassword", "postgres://u:s3cret and more@h%zz", "postgres://u:" + Mask + "@h%zz"},
		// Found by FuzzConfig: user info before any "://", and a DSN
		// missing its scheme.
		{"UserinfoBeforeSchemeSeparator", ":s3cret@://", ":" + Mask + "@://"},
		{"NoScheme", "app:s3cret@db:5432/ingest", "app:" + Mask + "@db:5432/ingest"},
		// Found by FuzzConfig: a space before the user info of a value
		// without a scheme.
		{"NoSchemeLeadingSpace", " :s3cret@://", " :" + Mask + "@://"},
		{"NoSchemeSpaceInUser", "my app:s3cret@db", "my app:" + Mask + "@db"},
		{"KeyValueColonAt", "host=db password=a:s3cret@c", "host=db password=" + Mask},
		// Found by FuzzConfig: an "@" before the user info hid it from
		// every mask.
		{"AtBeforeUserinfo", "@:s3cret@://", "@:" + Mask + "@://"},
		{"AtInUserNoScheme", "x@u:s3cret@h", "x@u:" + Mask + "@h"},
		{"WebhookToken", "https://hooks.example/in?token=abcdef&x=1", "https://hooks.example/in?token=" + Mask + "&x=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := DSN(tt.in)
			if got != tt.want {
				t.Fatalf("DSN(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if strings.Contains(got, "s3cret") || strings.Contains(got, "abcdef") {
				t.Fatalf("secret left in %q", got)
			}
		})
	}
}

func TestSecretsAndScrubber(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, dsn string
		secrets   []string
	}{
		{"URL", "postgres://app:s3cret@db/x", []string{"s3cret"}},
		{"EscapedURL", "postgres://app:p%40ss%2Fword@db/x", []string{"p@ss/word"}},
		{"Query", "postgres://db/x?password=s3cret", []string{"s3cret"}},
		{"KeyValue", `host=db password='it\'s me' user=x`, []string{"it's me"}},
		{"None", "postgres://app@db/x", nil},
		{"Unparsable", "postgres://app:s3cret@db/%zz", []string{"s3cret"}},
		{"UnparsableUnescapedAt", "postgres://app:p@ssSECRET@db/%zz", []string{"p@ssSECRET"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Secrets(tt.dsn)
			if fmt.Sprint(got) != fmt.Sprint(tt.secrets) {
				t.Fatalf("Secrets(%q) = %q, want %q", tt.dsn, got, tt.secrets)
			}
		})
	}

	s := NewScrubber("p@ss/word", "tok-123456", "", "ab")
	err := fmt.Errorf("connect: %w", errors.New("auth failed for p@ss/word and p%40ss%2Fword, token tok-123456, ab stays"))
	got := s.String(err.Error())
	for _, leak := range []string{"p@ss/word", "p%40ss%2Fword", "tok-123456"} {
		if strings.Contains(got, leak) {
			t.Fatalf("scrubbed text %q still contains %q", got, leak)
		}
	}
	if !strings.Contains(got, "ab stays") {
		t.Fatalf("short secrets must not be scrubbed from ordinary text: %q", got)
	}
	// A driver that splits a password with an unescaped "@" at its first
	// "@" shows the tail as a host name.
	got = NewScrubber(Secrets("postgres://u:p@ssSECRET@db/x")...).String("lookup ssSECRET@db: no such host; password p@ssSECRET")
	if strings.Contains(got, "SECRET") {
		t.Fatalf("a piece of the password is left: %q", got)
	}
	for _, v := range []string{"/:s3cr3t-pw@://", "/:s3cr3t-pw@://s3cr3t-pw", "u:s3cr3t-pw@h/s3cr3t-pw"} {
		if got := DSN(v); strings.Contains(got, "s3cr3t") {
			t.Fatalf("DSN(%q) shows the password it masked (a second copy): %q", v, got)
		}
	}
	if got := DSN("postgres://u:s3cr3t-pw@db:5432/ingest"); got != "postgres://u:xxxxx@db:5432/ingest" {
		t.Fatalf("DSN masks more than the password of a plain URL: %q", got)
	}
	if got := DSN("postgres://u:p@ssSECRET@db/%zz"); strings.Contains(got, "SECRET") {
		t.Fatalf("DSN of an unparsable URL shows a piece of its password: %q", got)
	}
	var nilScrubber *Scrubber
	if nilScrubber.String("x") != "x" {
		t.Fatal("nil scrubber must return text unchanged")
	}
}
