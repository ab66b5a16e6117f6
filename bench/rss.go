package bench

import (
	"bufio"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"
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

// MemoryAtPeak is what this process's memory held in the sample of a run
// with the largest resident set (runtime/metrics and VmRSS, read every
// 200 ms): where the peak RSS went.
type MemoryAtPeak struct {
	// RSSMiB is the resident set of that sample (VmRSS; the report's
	// PeakRSSMiB, VmHWM, may lie between two samples).
	RSSMiB float64 `json:"rss_mib"`
	// StacksMiB is the goroutine stacks, Goroutines how many there were.
	StacksMiB  float64 `json:"stacks_mib"`
	Goroutines uint64  `json:"goroutines"`
	// HeapLiveMiB is the heap the last collection found live.
	HeapLiveMiB float64 `json:"heap_live_mib"`
	// RuntimeMiB is all the Go runtime held from the system (heap, stacks
	// and its own structures, less what it released); the rest of RSSMiB
	// is mostly the binary's own pages.
	RuntimeMiB float64 `json:"runtime_mib"`
}

// sampleMemory reads the process's memory every interval until the
// returned function is first called; it returns the sample with the
// largest resident set.
func sampleMemory(interval time.Duration) func() MemoryAtPeak {
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/stacks:bytes"},
		{Name: "/sched/goroutines:goroutines"},
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}
	u := func(i int) uint64 {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return samples[i].Value.Uint64()
	}
	var peak MemoryAtPeak
	take := func() {
		rss := CurrentRSS()
		if float64(rss)/(1<<20) <= peak.RSSMiB {
			return
		}
		metrics.Read(samples)
		peak = MemoryAtPeak{RSSMiB: float64(rss) / (1 << 20), StacksMiB: float64(u(0)) / (1 << 20),
			Goroutines: u(1), HeapLiveMiB: float64(u(2)) / (1 << 20), RuntimeMiB: float64(u(3)-min(u(4), u(3))) / (1 << 20)}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			take()
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
	var once sync.Once
	return func() MemoryAtPeak {
		once.Do(func() {
			close(stop)
			<-done
			take()
		})
		return peak
	}
}
