package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/crisp-runtime/crisp/internal/tracing/otlptest"
)

// TracingVariant is one crisp of the tracing comparison (-tracing).
type TracingVariant struct {
	Key, Name string
	// Ref is the key of the variant this one's differences are against: off against
	// base (what tracing's code costs while it is off), on against off (what turning
	// it on costs). Empty, or a variant that did not run, for none.
	Ref string
}

// TracingVariants are the crisps of the tracing comparison, in the order a round
// starts from; base runs only when the bench is given its binaries (-base-bin).
var TracingVariants = []TracingVariant{
	{Key: "base", Name: "before tracing (base)"},
	{Key: "off", Name: "tracing off", Ref: "base"},
	{Key: "on", Name: "tracing on, every call sampled", Ref: "off"},
}

// tracingVariants are the TracingVariants named by keys, each with its Ref cleared
// when that variant is not among them; keys must be TracingVariants' own in their
// order and include off and on.
func tracingVariants(keys []string) ([]TracingVariant, error) {
	var out []TracingVariant
	j := 0
	for _, v := range TracingVariants {
		if j < len(keys) && keys[j] == v.Key {
			if !slices.Contains(keys, v.Ref) {
				v.Ref = ""
			}
			out = append(out, v)
			j++
		}
	}
	if j != len(keys) || !slices.Contains(keys, "off") || !slices.Contains(keys, "on") {
		return nil, fmt.Errorf("tracing comparison: variants %q: want base (optional), off and on, in that order", keys)
	}
	return out, nil
}

// TracingResults stores the tracing comparison in res, as NRIResults does NRI's:
// runs[i] are the cycles of the variant keys[i] (one of TracingVariants), all
// interleaved (runs[i][r] ran in round r). For each variant its figures; for each
// variant with a Ref, the difference from the Ref's figures with its 95 % bootstrap
// interval over resamplings of the rounds; for each variant that is another's Ref,
// the noise: how far apart its figures are between its even and its odd rounds.
func TracingResults(res Results, keys []string, runs [][]CycleTimes) error {
	vs, err := tracingVariants(keys)
	if err != nil {
		return err
	}
	if len(runs) != len(vs) {
		return fmt.Errorf("tracing comparison: %d runs for %d variants", len(runs), len(vs))
	}
	for i, cs := range runs {
		if len(cs) < 2 || len(cs) != len(runs[0]) {
			return fmt.Errorf("tracing comparison: %s ran %d cycles, %s %d; want the same number, at least 2",
				vs[i].Name, len(cs), vs[0].Name, len(runs[0]))
		}
	}
	at := map[string]int{}
	for i, v := range vs {
		at[v.Key] = i
	}
	res["tracing_cycles"] = float64(len(runs[0]))
	// A fixed seed: the same cycles give the same report.
	rng := mrand.New(mrand.NewPCG(34, 34))
	for _, f := range cycleFigures {
		for i, v := range vs {
			res.Ms("tracing_"+v.Key+"_"+f.Key, f.Of(runs[i]))
			if v.Ref == "" {
				continue
			}
			lo, hi := deltaCI(runs[at[v.Ref]], runs[i], f.Of, rng)
			res.Ms("tracing_"+v.Key+"_"+f.Key+"_lo", lo)
			res.Ms("tracing_"+v.Key+"_"+f.Key+"_hi", hi)
			ref := runs[at[v.Ref]]
			even, odd := evenOdd(ref)
			res.Ms("tracing_noise_"+v.Ref+"_"+f.Key, (f.Of(even) - f.Of(odd)).Abs())
		}
	}
	return nil
}

// evenOdd splits cs into its even and its odd rounds: two halves of one runtime on
// one machine, whose difference is what the comparison cannot tell from nothing.
func evenOdd(cs []CycleTimes) (even, odd []CycleTimes) {
	for i, c := range cs {
		if i%2 == 0 {
			even = append(even, c)
		} else {
			odd = append(odd, c)
		}
	}
	return even, odd
}

// TracingMem stores what variant key's shims and criserver took: each shim's memory
// (KiB, from smaps_rollup) after its pod's calls, all traced for the variant with
// tracing on, and criserver's before and after the timed cycles. The shims' means go
// in KiB, criserver's in MiB.
func TracingMem(res Results, key string, shims []Mem, daemonWarm, daemonCycles Mem, anonWarm, anonCycles float64) {
	var sum Mem
	for _, m := range shims {
		sum = sum.Add(m)
	}
	mean := sum.Div(float64(max(len(shims), 1)))
	p := "tracing_" + key + "_"
	res[p+"shims"] = float64(len(shims))
	res[p+"shim_pss"], res[p+"shim_uss"], res[p+"shim_rss"] = mean.PSS, mean.USS, mean.RSS
	res[p+"daemon_rss_warm"], res[p+"daemon_rss_cycles"] = daemonWarm.RSS/1024, daemonCycles.RSS/1024
	res[p+"daemon_anon_warm"], res[p+"daemon_anon_cycles"] = anonWarm/1024, anonCycles/1024
}

// shimGoClasses are the Go runtime's memory classes crisp's shim reports in a verbose
// PodSandboxStatus (its gomem.go), in the order the table prints them, and the
// goroutines it runs: where a shim's private memory goes.
var shimGoClasses = []string{"go_heap_objects", "go_heap_unused", "go_heap_free", "go_heap_released", "go_stacks", "go_metadata", "go_other", "go_total", "goroutines"}

// ShimGoMem reads shimGoClasses from the "shim" part of crisp's verbose
// PodSandboxStatus info JSON: the byte classes in KiB, goroutines as a count.
func ShimGoMem(info string) (map[string]float64, error) {
	var v struct {
		Shim map[string]string `json:"shim"`
	}
	if err := json.Unmarshal([]byte(info), &v); err != nil {
		return nil, fmt.Errorf("verbose info: %w", err)
	}
	out := map[string]float64{}
	for _, c := range shimGoClasses {
		raw, ok := v.Shim[c+"_bytes"]
		div := 1024.0
		if c == "goroutines" {
			raw, ok, div = v.Shim[c], v.Shim[c] != "", 1
		}
		if !ok {
			return nil, fmt.Errorf("verbose info: the shim reports no %s", c)
		}
		n, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return nil, fmt.Errorf("verbose info: shim's %s: %w", c, err)
		}
		out[c] = n / div
	}
	return out, nil
}

// TracingGoMem stores the mean of each of shimGoClasses over variant key's shims.
func TracingGoMem(res Results, key string, shims []map[string]float64) {
	for _, c := range shimGoClasses {
		sum := 0.0
		for _, m := range shims {
			sum += m[c]
		}
		res["tracing_"+key+"_shim_"+c] = sum / float64(max(len(shims), 1))
	}
}

// TracingMemDeltas stores, for each variant with a Ref, the 95 % bootstrap interval
// of the difference of its shims' mean PSS and USS from its Ref's (the shims are
// independent processes, so each side is resampled on its own); shims[key] are the
// per-shim figures TracingMem got.
func TracingMemDeltas(res Results, keys []string, shims map[string][]Mem) error {
	vs, err := tracingVariants(keys)
	if err != nil {
		return err
	}
	rng := mrand.New(mrand.NewPCG(34, 43))
	for _, v := range vs {
		if v.Ref == "" {
			continue
		}
		a, b := shims[v.Ref], shims[v.Key]
		if len(a) == 0 || len(b) == 0 {
			return fmt.Errorf("tracing memory: %d shims of %s, %d of %s", len(a), v.Ref, len(b), v.Key)
		}
		for _, f := range []struct {
			key string
			of  func(Mem) float64
		}{{"shim_pss", func(m Mem) float64 { return m.PSS }}, {"shim_uss", func(m Mem) float64 { return m.USS }}} {
			lo, hi := meanDeltaCI(pick(a, f.of), pick(b, f.of), rng)
			res["tracing_"+v.Key+"_"+f.key+"_lo"], res["tracing_"+v.Key+"_"+f.key+"_hi"] = lo, hi
		}
	}
	return nil
}

// pick is one figure of each of ms.
func pick[T any](ms []T, of func(T) float64) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = of(m)
	}
	return out
}

// meanDeltaCI is the 95 % interval of mean(b) − mean(a) over resamplings (with
// replacement) of a and of b, each on its own.
func meanDeltaCI(a, b []float64, rng *mrand.Rand) (lo, hi float64) {
	mean := func(xs []float64) float64 {
		s := 0.0
		for range xs {
			s += xs[rng.IntN(len(xs))]
		}
		return s / float64(len(xs))
	}
	ds := make([]float64, bootstraps)
	for k := range ds {
		ds[k] = mean(b) - mean(a)
	}
	slices.Sort(ds)
	return ds[int(0.025*bootstraps)], ds[int(0.975*bootstraps)-1]
}

// TraceContext is ctx with a new sampled W3C traceparent in its outgoing gRPC
// metadata, as kubelet with tracing sends one in each CRI call: a new trace, whose id
// (hex) it returns. Every call made with the context joins that trace.
func TraceContext(ctx context.Context) (context.Context, string) {
	var id [16]byte
	var parent [8]byte
	// crypto/rand's Read never fails (Go ≥ 1.24).
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(parent[:])
	// W3C version 00, flags 01: sampled.
	tp := "00-" + hex.EncodeToString(id[:]) + "-" + hex.EncodeToString(parent[:]) + "-01"
	return metadata.AppendToOutgoingContext(ctx, "traceparent", tp), hex.EncodeToString(id[:])
}

// TraceCount is what one traced pod cycle left at the receiver.
type TraceCount struct {
	// Spans is every span of the trace; Shim those the shim recorded (relayed by
	// criserver); Calls criserver's CRI server spans (one a call).
	Spans, Shim, Calls int
}

// criCallPrefix starts the name of criserver's CRI server spans (otelgrpc's
// <service>/<method>).
const criCallPrefix = "runtime.v1.RuntimeService/"

// CountTraces counts the spans of each trace of ids in spans; shimService is the
// service.name of the shims' spans.
func CountTraces(spans []otlptest.Span, ids []string, shimService string) map[string]TraceCount {
	out := make(map[string]TraceCount, len(ids))
	for _, id := range ids {
		out[id] = TraceCount{}
	}
	for _, s := range spans {
		c, ok := out[s.TraceID]
		if !ok {
			continue
		}
		c.Spans++
		if s.Service == shimService {
			c.Shim++
		} else if strings.HasPrefix(s.Name, criCallPrefix) {
			c.Calls++
		}
		out[s.TraceID] = c
	}
	return out
}

// TracedSpans checks that every traced cycle's trace reached the receiver whole
// enough to have been traced end to end (a CRI server span for each of its calls,
// at least one span from the shim), and stores the spans a cycle, on average and
// the fewest. A run whose cycles were not traced measures nothing, so it fails.
func TracedSpans(res Results, counts map[string]TraceCount, calls int) error {
	if len(counts) == 0 {
		return fmt.Errorf("no traced cycles")
	}
	var all, shim int
	fewest := -1
	for id, c := range counts {
		if c.Calls < calls || c.Shim == 0 {
			return fmt.Errorf("trace %s of a traced cycle reached the receiver with %d spans: %d of the %d CRI calls, %d from the shim",
				id, c.Spans, c.Calls, calls, c.Shim)
		}
		all += c.Spans
		shim += c.Shim
		if fewest < 0 || c.Spans < fewest {
			fewest = c.Spans
		}
	}
	n := float64(len(counts))
	res["tracing_spans_per_cycle"] = float64(all) / n
	res["tracing_shim_spans_per_cycle"] = float64(shim) / n
	res["tracing_spans_fewest"] = float64(fewest)
	return nil
}

// WriteTracingTable prints the tracing comparison TracingResults, TracingMem and
// TracedSpans stored in res; nothing when res has none.
func WriteTracingTable(w io.Writer, res Results) error {
	n, ok := res["tracing_cycles"]
	if !ok {
		return nil
	}
	var keys []string
	for _, v := range TracingVariants {
		if _, ok := res["tracing_"+v.Key+"_cycle_p50"]; ok {
			keys = append(keys, v.Key)
		}
	}
	vs, err := tracingVariants(keys)
	if err != nil {
		return err
	}
	against := []string{}
	for _, v := range vs {
		if v.Ref != "" {
			against = append(against, v.Key+" against "+v.Ref)
		}
	}
	fmt.Fprintf(w, "Tracing cost: crisp %d ways, %.0f pod cycles each, interleaved (ms; Δ of %s, with its 95 %% bootstrap interval)\n",
		len(vs), n, strings.Join(against, ", of "))
	rows := make([]cycleRow, len(vs))
	for i, v := range vs {
		rows[i] = cycleRow(v)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	writeCycleRows(tw, res, "tracing_", rows, cycleCols())
	for _, v := range vs {
		if _, ok := res["tracing_noise_"+v.Key+"_cycle_p50"]; !ok {
			continue
		}
		writeNoiseRow(tw, res, v.Key, "tracing_noise_"+v.Key+"_", cycleCols())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var cpu []string
	for _, v := range vs {
		if c, ok := res["tracing_"+v.Key+"_daemon_cpu_cycle"]; ok {
			cpu = append(cpu, fmt.Sprintf("%s %.2f", v.Key, c))
		}
	}
	if len(cpu) > 0 {
		fmt.Fprintf(w, "criserver's CPU (utime+stime) a timed cycle, ms: %s\n", strings.Join(cpu, ", "))
	}
	if s, ok := res["tracing_spans_per_cycle"]; ok {
		fmt.Fprintf(w, "the receiver got %.1f spans a traced cycle (%.1f of them the shim's), %.0f in the fewest\n",
			s, res["tracing_shim_spans_per_cycle"], res["tracing_spans_fewest"])
	}
	if _, ok := res["tracing_off_shims"]; !ok {
		return nil
	}
	fmt.Fprintf(w, "\nTracing memory: %.0f pods each (a `sleep`, 3 ExecSyncs; all calls traced), per shim in KiB; criserver in MiB\n", res["tracing_off_shims"])
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tshim PSS\tΔ\t95% interval\tshim USS\tΔ\t95% interval\tcriserver RSS warm\tafter cycles\tanon warm\tafter cycles\t")
	for _, v := range vs {
		p := "tracing_" + v.Key + "_"
		fmt.Fprintf(tw, "%s\t", v.Name)
		for _, f := range []string{"shim_pss", "shim_uss"} {
			delta, interval := "-", "-"
			if v.Ref != "" {
				delta = signed(res[p+f] - res["tracing_"+v.Ref+"_"+f])
				interval = signed(res[p+f+"_lo"]) + ".." + signed(res[p+f+"_hi"])
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t", num(res, p+f, "KiB"), delta, interval)
		}
		for _, f := range []string{"daemon_rss_warm", "daemon_rss_cycles", "daemon_anon_warm", "daemon_anon_cycles"} {
			fmt.Fprintf(tw, "%s\t", num(res, p+f, "MiB"))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, ok := res["tracing_off_shim_go_total"]; !ok {
		return nil
	}
	fmt.Fprintln(w, "the shims' Go memory (their verbose status), mean KiB")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, c := range shimGoClasses {
		fmt.Fprintf(tw, "%s\t", strings.TrimPrefix(c, "go_"))
	}
	fmt.Fprintln(tw)
	for _, v := range vs {
		fmt.Fprintf(tw, "%s\t", v.Name)
		for _, c := range shimGoClasses {
			unit := "KiB"
			if c == "goroutines" {
				unit = "count"
			}
			fmt.Fprintf(tw, "%s\t", num(res, "tracing_"+v.Key+"_shim_"+c, unit))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// tracingSpanWait bounds how long the bench waits for the last spans: criserver's
// batch exporter sends every 5 s, a shim's recorder every 200 ms.
const tracingSpanWait = 60 * time.Second
