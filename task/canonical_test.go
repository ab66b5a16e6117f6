package task_test

import (
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/task"
)

func TestCanonical(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr string // part of the error message; "" for success
	}{
		{"SortsKeys", `{"b":1,"a":2}`, `{"a":2,"b":1}`, ""},
		{"DropsWhiteSpace", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\":{} } \n", `{"a":[1,2],"b":{}}`, ""},
		{"SortsNestedKeys", `{"z":{"y":1,"x":[{"d":1,"c":2}]}}`, `{"z":{"x":[{"c":2,"d":1}],"y":1}}`, ""},
		{"KeepsArrayOrder", `[3,1,2]`, `[3,1,2]`, ""},
		{"KeepsNumbersAsWritten", `{"a":1.0,"b":1e2,"c":-0,"d":12345678901234567890123}`, `{"a":1.0,"b":1e2,"c":-0,"d":12345678901234567890123}`, ""},
		{"Scalar", ` 42 `, `42`, ""},
		{"String", `"x"`, `"x"`, ""},
		{"Null", `null`, `null`, ""},
		{"UnescapesUnicode", `{"s":"caf\u00e9"}`, `{"s":"café"}`, ""},
		{"KeepsHTMLCharacters", `{"s":"<a&b>"}`, `{"s":"<a&b>"}`, ""},
		{"KeepsEscapes", `{"s":"a\"b\\c\n"}`, `{"s":"a\"b\\c\n"}`, ""},
		{"LastDuplicateKeyWins", `{"a":1,"a":2}`, `{"a":2}`, ""},
		{"Empty", ``, "", "empty"},
		{"OnlyWhiteSpace", " \n\t", "", "empty"},
		{"Invalid", `{"a":`, "", "not valid JSON"},
		{"Garbage", `hello`, "", "not valid JSON"},
		{"TrailingComma", `{"a":1,}`, "", "not valid JSON"},
		{"TwoValues", `{} {}`, "", "not a single JSON value"},
		{"TrailingGarbage", `{"a":1} x`, "", "not a single JSON value"},
		{"NUL", `{"a":"x\u0000y"}`, "", `\u0000`},
		{"NULInKey", `{"\u0000":1}`, "", `\u0000`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := task.Canonical([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Canonical(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Canonical(%q) = %v", tt.in, err)
			}
			if string(got) != tt.want {
				t.Fatalf("Canonical(%q) = %s, want %s", tt.in, got, tt.want)
			}
			// Canonical is idempotent.
			again, err := task.Canonical(got)
			if err != nil || string(again) != string(got) {
				t.Fatalf("Canonical(Canonical(%q)) = %s, %v; want %s", tt.in, again, err, got)
			}
		})
	}
}
