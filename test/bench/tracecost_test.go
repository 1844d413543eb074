package bench

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/crisp-runtime/crisp/internal/tracing/otlptest"
)

func TestTracingResults(t *testing.T) {
	// base: even rounds 100 ms, odd 104 (and one slow 300): its p50 noise is 4 ms.
	base := cyclesOf(100, 104, 100, 104, 100, 300)
	// off: 1 ms more than base in every round, so every resampling gives Δ 1 ms.
	off := shifted(base, 1e6)
	// on: 2 ms more than off in every round.
	on := shifted(off, 2e6)
	res := Results{"cycle_p50": 7} // what else crisp measured stays
	if err := TracingResults(res, []string{"base", "off", "on"}, [][]CycleTimes{base, off, on}); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{
		"cycle_p50":                       7,
		"tracing_cycles":                  6,
		"tracing_base_cycle_p50":          100,
		"tracing_base_cycle_p99":          300,
		"tracing_base_pod_start_p50":      99,
		"tracing_off_cycle_p50":           101,
		"tracing_off_cycle_p50_lo":        1,
		"tracing_off_cycle_p50_hi":        1,
		"tracing_off_pod_start_p50_lo":    1,
		"tracing_on_cycle_p50":            103,
		"tracing_on_cycle_p50_lo":         2, // against off, not base
		"tracing_on_cycle_p99_hi":         2,
		"tracing_on_pod_start_p50_hi":     2,
		"tracing_noise_base_cycle_p50":    4, // 100 against 104
		"tracing_noise_base_cycle_p99":    200,
		"tracing_noise_off_cycle_p50":     4,
		"tracing_noise_off_pod_start_p50": 4,
	} {
		if got, ok := res[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	for _, key := range []string{"tracing_base_cycle_p50_lo", "tracing_noise_on_cycle_p50"} {
		if _, ok := res[key]; ok {
			t.Errorf("%s stored: base has no reference, on is nobody's", key)
		}
	}

	// Without base, off is the reference and has no interval of its own.
	two := Results{}
	if err := TracingResults(two, []string{"off", "on"}, [][]CycleTimes{off, on}); err != nil {
		t.Fatal(err)
	}
	if _, ok := two["tracing_off_cycle_p50_lo"]; ok || two["tracing_on_cycle_p50_lo"] != 2 || two["tracing_noise_off_cycle_p50"] != 4 {
		t.Errorf("off against on only: %v", two)
	}

	for _, c := range []struct {
		name string
		keys []string
		runs [][]CycleTimes
	}{
		{"no on", []string{"base", "off"}, [][]CycleTimes{base, off}},
		{"out of order", []string{"on", "off"}, [][]CycleTimes{on, off}},
		{"unknown", []string{"off", "on", "more"}, [][]CycleTimes{off, on, on}},
		{"runs for keys", []string{"off", "on"}, [][]CycleTimes{off, on, on}},
		{"uneven", []string{"off", "on"}, [][]CycleTimes{off, on[:3]}},
		{"one cycle", []string{"off", "on"}, [][]CycleTimes{off[:1], on[:1]}},
	} {
		r := Results{}
		if err := TracingResults(r, c.keys, c.runs); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
		if len(r) != 0 {
			t.Errorf("%s: stored %v", c.name, r)
		}
	}
}

func TestTracingMem(t *testing.T) {
	res := Results{}
	var off, on []Mem
	for i := range 10 {
		// off's USS 2000-2009 KiB, on's 100 KiB more each: every resampling of
		// either lies within ±9 KiB of 100.
		off = append(off, Mem{RSS: 12000, PSS: 3000 + float64(i), USS: 2000 + float64(i)})
		on = append(on, Mem{RSS: 12100, PSS: 3100 + float64(i), USS: 2100 + float64(i)})
	}
	TracingMem(res, "off", off, Mem{RSS: 20 * 1024}, Mem{RSS: 22 * 1024}, 5*1024, 6*1024)
	TracingMem(res, "on", on, Mem{RSS: 21 * 1024}, Mem{RSS: 25 * 1024}, 5*1024, 8*1024)
	if err := TracingMemDeltas(res, []string{"off", "on"}, map[string][]Mem{"off": off, "on": on}); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{
		"tracing_off_shims":             10,
		"tracing_off_shim_uss":          2004.5,
		"tracing_on_shim_pss":           3104.5,
		"tracing_on_daemon_rss_warm":    21,
		"tracing_on_daemon_rss_cycles":  25,
		"tracing_on_daemon_anon_cycles": 8,
	} {
		if res[key] != want {
			t.Errorf("%s = %v, want %v", key, res[key], want)
		}
	}
	for _, f := range []string{"shim_pss", "shim_uss"} {
		lo, hi := res["tracing_on_"+f+"_lo"], res["tracing_on_"+f+"_hi"]
		if lo < 91 || hi > 109 || lo > 100 || hi < 100 || lo == hi {
			t.Errorf("%s: interval %v..%v, want around +100 within ±9", f, lo, hi)
		}
	}
	if _, ok := res["tracing_off_shim_uss_lo"]; ok {
		t.Error("off got an interval without a reference")
	}
	if err := TracingMemDeltas(Results{}, []string{"off", "on"}, map[string][]Mem{"on": on}); err == nil {
		t.Error("a variant without shims was accepted")
	}
}

func TestShimGoMem(t *testing.T) {
	info := `{"pid": 42, "shim": {"goroutines": "9", "go_heap_objects_bytes": "1048576", "go_heap_unused_bytes": "2048",
		"go_heap_free_bytes": "0", "go_heap_released_bytes": "4096", "go_stacks_bytes": "65536", "go_metadata_bytes": "10240",
		"go_other_bytes": "1024", "go_profiling_buckets_bytes": "5", "go_total_bytes": "8388608"}}`
	g, err := ShimGoMem(info)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"goroutines": 9, "go_heap_objects": 1024, "go_heap_unused": 2, "go_heap_free": 0, "go_heap_released": 4,
		"go_stacks": 64, "go_metadata": 10, "go_other": 1, "go_total": 8192}
	if len(g) != len(want) {
		t.Errorf("got %v, want %v", g, want)
	}
	for k, v := range want {
		if g[k] != v {
			t.Errorf("%s = %v, want %v", k, g[k], v)
		}
	}
	res := Results{}
	g2 := map[string]float64{}
	for k, v := range g {
		g2[k] = v + 2
	}
	TracingGoMem(res, "on", []map[string]float64{g, g2})
	if res["tracing_on_shim_go_heap_objects"] != 1025 || res["tracing_on_shim_goroutines"] != 10 {
		t.Errorf("means: %v", res)
	}
	for _, bad := range []string{`{"pid": 42}`, `{"shim": {"goroutines": "9"}}`, `{"shim": {"go_total_bytes": "x"}}`, `not json`} {
		if _, err := ShimGoMem(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestTraceContext(t *testing.T) {
	ctx, id := TraceContext(context.Background())
	md, _ := metadata.FromOutgoingContext(ctx)
	tp := md.Get("traceparent")
	if len(tp) != 1 || !regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`).MatchString(tp[0]) || tp[0][3:35] != id {
		t.Fatalf("traceparent %q, trace id %q", tp, id)
	}
	if _, id2 := TraceContext(context.Background()); id2 == id {
		t.Error("two traces share an id")
	}
}

func TestTracedSpans(t *testing.T) {
	span := func(trace, service, name string) otlptest.Span {
		return otlptest.Span{TraceID: trace, Service: service, Name: name}
	}
	var spans []otlptest.Span
	for _, id := range []string{"a", "b"} {
		for _, call := range []string{"RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer", "StopPodSandbox", "RemovePodSandbox"} {
			spans = append(spans, span(id, "crisp", criCallPrefix+call))
		}
		spans = append(spans, span(id, "crisp", "controller.shim.start"), span(id, "crisp-shim", "containerd.task.v3.Task/Create"))
	}
	spans = append(spans, span("b", "crisp-shim", "shim.helper"), span("elsewhere", "crisp", criCallPrefix+"Version"))
	counts := CountTraces(spans, []string{"a", "b"}, "crisp-shim")
	if counts["a"] != (TraceCount{Spans: 8, Shim: 1, Calls: 6}) || counts["b"] != (TraceCount{Spans: 9, Shim: 2, Calls: 6}) || len(counts) != 2 {
		t.Fatalf("counts %+v", counts)
	}
	res := Results{}
	if err := TracedSpans(res, counts, 6); err != nil {
		t.Fatal(err)
	}
	if res["tracing_spans_per_cycle"] != 8.5 || res["tracing_shim_spans_per_cycle"] != 1.5 || res["tracing_spans_fewest"] != 8 {
		t.Errorf("stored %v", res)
	}

	// A trace that lost its shim's spans, one that lost a call, one never seen.
	for _, c := range []map[string]TraceCount{
		{"a": {Spans: 7, Calls: 6}},
		{"a": {Spans: 7, Shim: 1, Calls: 5}},
		CountTraces(spans, []string{"a", "missing"}, "crisp-shim"),
		{},
	} {
		if err := TracedSpans(Results{}, c, 6); err == nil {
			t.Errorf("%v accepted", c)
		}
	}
}

func TestWriteTracingTable(t *testing.T) {
	base := cyclesOf(100, 104, 100, 104, 100, 300)
	off := shifted(base, 1e6)
	on := shifted(off, 2e6)
	res := Results{}
	if err := TracingResults(res, []string{"base", "off", "on"}, [][]CycleTimes{base, off, on}); err != nil {
		t.Fatal(err)
	}
	res["tracing_spans_per_cycle"], res["tracing_shim_spans_per_cycle"], res["tracing_spans_fewest"] = 25, 7, 24
	res["tracing_base_daemon_cpu_cycle"], res["tracing_off_daemon_cpu_cycle"], res["tracing_on_daemon_cpu_cycle"] = 10, 10.5, 12.25
	var ms []Mem
	for range 2 {
		ms = append(ms, Mem{PSS: 3000, USS: 2000})
	}
	for _, k := range []string{"base", "off", "on"} {
		TracingMem(res, k, ms, Mem{RSS: 20 * 1024}, Mem{RSS: 21 * 1024}, 6*1024, 7*1024)
	}
	if err := TracingMemDeltas(res, []string{"base", "off", "on"}, map[string][]Mem{"base": ms, "off": ms, "on": ms}); err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"base", "off", "on"} {
		g := map[string]float64{}
		for j, c := range shimGoClasses {
			g[c] = float64(100*i + j)
		}
		TracingGoMem(res, k, []map[string]float64{g})
	}
	var sb strings.Builder
	if err := WriteTracingTable(&sb, res); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		for _, v := range append(TracingVariants, TracingVariant{Name: "noise: base, even vs odd rounds"}, TracingVariant{Name: "noise: off, even vs odd rounds"}) {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), v.Name+" "); ok {
				rows[v.Name] += strings.Join(strings.Fields(rest), " ") + "|"
			}
		}
	}
	for name, want := range map[string]string{
		"before tracing (base)":           "100 - - 300 - - 99.0 - -|3000 - - 2000 - - 20.0 21.0 6.00 7.00|0.00 1.00 2.00 3.00 4.00 5.00 6.00 7.00 8|",
		"tracing off":                     "101 +1.00 +1.00..+1.00 301 +1.00 +1.00..+1.00 100 +1.00 +1.00..+1.00|3000 +0.00 +0.00..+0.00 2000 +0.00 +0.00..+0.00 20.0 21.0 6.00 7.00|100 101 102 103 104 105 106 107 108|",
		"tracing on, every call sampled":  "103 +2.00 +2.00..+2.00 303 +2.00 +2.00..+2.00 102 +2.00 +2.00..+2.00|3000 +0.00 +0.00..+0.00 2000 +0.00 +0.00..+0.00 20.0 21.0 6.00 7.00|200 201 202 203 204 205 206 207 208|",
		"noise: base, even vs odd rounds": "±4.00 ±200 ±4.00|",
		"noise: off, even vs odd rounds":  "±4.00 ±200 ±4.00|",
	} {
		if rows[name] != want {
			t.Errorf("row %q = %q, want %q\n%s", name, rows[name], want, out)
		}
	}
	for _, s := range []string{"crisp 3 ways, 6 pod cycles each", "off against base, of on against off", "25.0 spans a traced cycle (7.0 of them the shim's), 24 in the fewest", "2 pods each", "heap_objects  heap_unused", "a timed cycle, ms: base 10.00, off 10.50, on 12.25"} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}

	// The main report prints it after its own table, and only when there is one.
	var main strings.Builder
	if err := (&Report{Runtimes: map[string]Results{"crisp": res}}).WriteTable(&main); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(main.String(), out) {
		t.Errorf("report lacks the tracing table:\n%s", main.String())
	}
	main.Reset()
	if err := (&Report{Runtimes: map[string]Results{"crisp": {"cycle_p50": 7}}}).WriteTable(&main); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(main.String(), "Tracing") {
		t.Errorf("report without a tracing run prints a tracing table:\n%s", main.String())
	}
}
