package memtrim

import (
	"runtime"
	"runtime/metrics"
	"testing"
)

var sink [][]byte

func free() uint64 {
	s := []metrics.Sample{{Name: freeHeap}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func TestTrimAbove(t *testing.T) {
	// A 64 MiB burst that is garbage once the GC has run.
	for range 64 {
		sink = append(sink, make([]byte, 1<<20))
	}
	sink = nil
	runtime.GC()
	if free() < 32<<20 {
		t.Skipf("the runtime already released the burst (free heap %d)", free())
	}
	if !TrimAbove(16 << 20) {
		t.Fatal("did not trim 32+ MiB of free heap")
	}
	if f := free(); f > 16<<20 {
		t.Errorf("free heap after trim: %d", f)
	}
	if TrimAbove(1 << 40) {
		t.Error("trimmed below the threshold")
	}
}
