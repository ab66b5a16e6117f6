package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// PeakRSS returns this process's peak resident set size in bytes (VmHWM of
// /proc/self/status; 0 where there is none).
func PeakRSS() int64 { return procStatus("VmHWM:") }

// CurrentRSS returns this process's resident set size in bytes (VmRSS).
func CurrentRSS() int64 { return procStatus("VmRSS:") }

func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
