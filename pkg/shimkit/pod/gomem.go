package pod

import (
	"runtime"
	"strconv"
)

// goMemory reports the Go runtime's memory classes a shim's footprint is made of, under
// the names verbose SandboxStatus gives them: every per-pod byte the shim costs is one
// of these or a page of the binary, so they are what to watch when per-pod memory
// moves. It reads runtime.MemStats rather than runtime/metrics: that package's
// initialisation would run in every shim, container init and exec (15 KB, ~0.4 ms),
// and a verbose status can afford ReadMemStats' brief stop of the world.
func goMemory() map[string]string {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	classes := map[string]uint64{
		"go_heap_objects_bytes":      m.HeapAlloc,
		"go_heap_unused_bytes":       m.HeapInuse - m.HeapAlloc,
		"go_heap_free_bytes":         m.HeapIdle - m.HeapReleased,
		"go_heap_released_bytes":     m.HeapReleased,
		"go_stacks_bytes":            m.StackInuse,
		"go_metadata_bytes":          m.MSpanSys + m.MCacheSys + m.GCSys,
		"go_other_bytes":             m.OtherSys,
		"go_profiling_buckets_bytes": m.BuckHashSys,
		"go_total_bytes":             m.Sys,
	}
	out := make(map[string]string, len(classes))
	for k, v := range classes {
		out[k] = strconv.FormatUint(v, 10)
	}
	return out
}
