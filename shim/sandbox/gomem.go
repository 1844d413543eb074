package sandbox

import (
	"runtime/metrics"
	"strconv"
)

// goMemoryClasses are the Go runtime's memory classes a shim's footprint is made of,
// under the names verbose SandboxStatus reports them with. Every per-pod byte the shim
// costs is one of these (or the binary's own pages), so they are what to watch when
// the per-pod memory moves.
var goMemoryClasses = []struct{ metric, key string }{
	{"/memory/classes/heap/objects:bytes", "go_heap_objects_bytes"},
	{"/memory/classes/heap/unused:bytes", "go_heap_unused_bytes"},
	{"/memory/classes/heap/free:bytes", "go_heap_free_bytes"},
	{"/memory/classes/heap/released:bytes", "go_heap_released_bytes"},
	{"/memory/classes/heap/stacks:bytes", "go_stacks_bytes"},
	{"/memory/classes/os-stacks:bytes", "go_os_stacks_bytes"},
	{"/memory/classes/metadata/other:bytes", "go_metadata_other_bytes"},
	{"/memory/classes/other:bytes", "go_other_bytes"},
	{"/memory/classes/profiling/buckets:bytes", "go_profiling_buckets_bytes"},
	{"/memory/classes/total:bytes", "go_total_bytes"},
}

// goMemory reads the classes; the runtime reads them without stopping the world.
func goMemory() map[string]string {
	samples := make([]metrics.Sample, len(goMemoryClasses))
	for i, c := range goMemoryClasses {
		samples[i].Name = c.metric
	}
	metrics.Read(samples)
	out := make(map[string]string, len(samples))
	for i, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			out[goMemoryClasses[i].key] = strconv.FormatUint(s.Value.Uint64(), 10)
		}
	}
	return out
}
