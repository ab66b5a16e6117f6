package main

import (
	"maps"
	"strings"
	"testing"
)

// TestParseGroupWeights: --group-weight GROUP=W, the weight after the
// last '=' (a group key may hold one); a value without '=' or with a
// weight that is not a whole number is a usage error naming the flag.
// The range is the store's to check (its error names group_weights).
func TestParseGroupWeights(t *testing.T) {
	t.Parallel()
	got, err := parseGroupWeights([]string{"tenant-a=3", "a=b=2", "tenant-a=4"})
	if want := map[string]int{"tenant-a": 4, "a=b": 2}; err != nil || !maps.Equal(got, want) {
		t.Errorf("parseGroupWeights = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"tenant-a", "tenant-a=", "tenant-a=three", "tenant-a=1.5"} {
		if _, err := parseGroupWeights([]string{bad}); err == nil || !strings.Contains(err.Error(), "--group-weight") {
			t.Errorf("parseGroupWeights(%q) = %v, want a usage error naming --group-weight", bad, err)
		}
	}
	if s := weightsText(map[string]int{"b": 2, "a": 3}); s != "a=3, b=2" {
		t.Errorf("weightsText = %q, want %q", s, "a=3, b=2")
	}
}
