// Package memtrim returns a Go process's free heap to the operating system soon after
// a burst instead of waiting for the runtime's background scavenger, which releases
// it over minutes. A daemon that pulled images or ran many pods at once would
// otherwise keep that peak resident long after it is over.
package memtrim

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// freeHeap is heap memory that is free, not yet returned to the OS and not reserved
// for the next allocations.
const freeHeap = "/memory/classes/heap/free:bytes"

// Run checks every interval and returns the free heap to the OS when it exceeds
// threshold bytes, until ctx ends. A check costs a metrics read; a trim costs one
// forced GC, so it only happens after the heap shrank by more than threshold.
func Run(ctx context.Context, interval time.Duration, threshold uint64) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			TrimAbove(threshold)
		}
	}
}

// TrimAbove returns the free heap to the OS if it exceeds threshold bytes, and
// reports whether it did.
func TrimAbove(threshold uint64) bool {
	s := []metrics.Sample{{Name: freeHeap}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[0].Value.Uint64() <= threshold {
		return false
	}
	debug.FreeOSMemory()
	return true
}
