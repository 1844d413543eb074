package bench

import (
	"fmt"
	"io"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WasmHandlers are the two runtime handlers of the WebAssembly comparison (-wasm) on
// one crisp, in the order round 0 starts from: the key names their figures
// (wasm_<key>_<figure>); wasm's differences are against runc's.
var WasmHandlers = []struct{ Key, Name string }{
	{"runc", "runc pods (busybox sleep)"},
	{"wasm", "wasm pods (hello sleep=forever)"},
}

// WasmCycle is one pod cycle of the WebAssembly comparison: the CRI calls, and Ready,
// from StartContainer's return until the container's first output in its CRI log.
// shim-wasm's Start only lets the container's `_run` child go: the module is loaded
// (compiled, or read from the compilation cache) and instantiated after it returns.
// runc's `sleep` has run when StartContainer returns and prints nothing: Ready is 0.
type WasmCycle struct {
	CycleTimes
	Ready time.Duration
}

// Running is the time until the container's process runs: pod start and Ready.
func (c WasmCycle) Running() time.Duration { return c.PodStart() + c.Ready }

// wasmFigures are the figures of each handler of the WebAssembly comparison: a
// percentile of one time of each cycle.
var wasmFigures = []struct {
	Key, Name string
	Of        func(WasmCycle) time.Duration
	P         float64
}{
	{"pod_start_p50", "pod start p50", WasmCycle.PodStart, 50},
	{"pod_start_p99", "pod start p99", WasmCycle.PodStart, 99},
	{"running_p50", "running p50", WasmCycle.Running, 50},
	{"cycle_p50", "pod cycle p50", func(c WasmCycle) time.Duration { return c.Total() }, 50},
}

// asCycles puts one time of each cycle in a CycleTimes' Run, so that the bootstrap
// helpers of the other comparisons (deltaCI, evenOdd) resample it.
func asCycles(cs []WasmCycle, of func(WasmCycle) time.Duration) []CycleTimes {
	out := make([]CycleTimes, len(cs))
	for i, c := range cs {
		out[i] = CycleTimes{Run: of(c)}
	}
	return out
}

// runP is the p-th percentile of the cycles' Run.
func runP(p float64) func([]CycleTimes) time.Duration {
	return func(cs []CycleTimes) time.Duration {
		return Percentile(pickTimes(cs, func(c CycleTimes) time.Duration { return c.Run }), p)
	}
}

// WasmResults stores the WebAssembly comparison in res: runs[i] are the timed cycles
// of WasmHandlers[i], interleaved (runs[i][r] ran in round r), cold[i] the first
// (warm-up) cycle of each, which for wasm compiled the module. For each handler its
// figures and the noise (its figures' distance between its even and its odd rounds);
// for wasm the difference from runc's with its 95 % bootstrap interval over the
// rounds, and Ready's p50 and p99.
func WasmResults(res Results, runs [][]WasmCycle, cold []WasmCycle) error {
	if len(runs) != len(WasmHandlers) || len(cold) != len(WasmHandlers) {
		return fmt.Errorf("wasm comparison: %d runs and %d cold cycles for %d handlers", len(runs), len(cold), len(WasmHandlers))
	}
	for i, cs := range runs {
		if len(cs) < 2 || len(cs) != len(runs[0]) {
			return fmt.Errorf("wasm comparison: %s ran %d cycles, %s %d; want the same number, at least 2",
				WasmHandlers[i].Name, len(cs), WasmHandlers[0].Name, len(runs[0]))
		}
	}
	res["wasm_cycles"] = float64(len(runs[0]))
	// A fixed seed: the same cycles give the same report.
	rng := mrand.New(mrand.NewPCG(35, 35))
	for _, f := range wasmFigures {
		of := runP(f.P)
		for i, h := range WasmHandlers {
			cs := asCycles(runs[i], f.Of)
			p := "wasm_" + h.Key + "_" + f.Key
			res.Ms(p, of(cs))
			even, odd := evenOdd(cs)
			res.Ms("wasm_noise_"+h.Key+"_"+f.Key, (of(even) - of(odd)).Abs())
			if i > 0 {
				lo, hi := deltaCI(asCycles(runs[0], f.Of), cs, of, rng)
				res.Ms(p+"_lo", lo)
				res.Ms(p+"_hi", hi)
			}
		}
	}
	for i, h := range WasmHandlers {
		p := "wasm_" + h.Key + "_cold_"
		res.Ms(p+"pod_start", cold[i].PodStart())
		res.Ms(p+"running", cold[i].Running())
		res.Ms(p+"ready", cold[i].Ready)
		ready := pickTimes(asCycles(runs[i], func(c WasmCycle) time.Duration { return c.Ready }), func(c CycleTimes) time.Duration { return c.Run })
		res.Ms("wasm_"+h.Key+"_ready_p50", Percentile(ready, 50))
		res.Ms("wasm_"+h.Key+"_ready_p99", Percentile(ready, 99))
	}
	return nil
}

// WasmPodMem is one running pod's processes' memory (KiB, smaps_rollup): its shim,
// its pause process and its container's process (runc: the `sleep`; wasm: the
// `shim-wasm _run` child, the Go runtime with wazero and the module).
type WasmPodMem struct {
	Shim, Pause, Ctr Mem
	// CtrKinds is the container process's USS by smapsKinds.
	CtrKinds map[string]float64
}

// Total is the pod's three processes together.
func (m WasmPodMem) Total() Mem { return m.Shim.Add(m.Pause).Add(m.Ctr) }

// memFigure is one memory figure of a pod.
type memFigure struct {
	Key, Name string
	Of        func(WasmPodMem) float64
}

// wasmMemFigures are the memory figures of each handler, per pod.
var wasmMemFigures = []memFigure{
	{"shim_pss", "shim PSS", func(m WasmPodMem) float64 { return m.Shim.PSS }},
	{"shim_uss", "shim USS", func(m WasmPodMem) float64 { return m.Shim.USS }},
	{"pause_pss", "pause PSS", func(m WasmPodMem) float64 { return m.Pause.PSS }},
	{"ctr_pss", "container PSS", func(m WasmPodMem) float64 { return m.Ctr.PSS }},
	{"ctr_uss", "container USS", func(m WasmPodMem) float64 { return m.Ctr.USS }},
	{"ctr_rss", "container RSS", func(m WasmPodMem) float64 { return m.Ctr.RSS }},
	{"pod_pss", "pod PSS", func(m WasmPodMem) float64 { return m.Total().PSS }},
	{"pod_uss", "pod USS", func(m WasmPodMem) float64 { return m.Total().USS }},
}

// wasmKindFigures are the container process's USS by smapsKinds, stored like
// wasmMemFigures (wasm_<key>_ctr_uss_<kind>) and printed under them.
var wasmKindFigures = func() []memFigure {
	var out []memFigure
	for _, k := range smapsKinds {
		out = append(out, memFigure{"ctr_uss_" + k, "container USS, " + strings.ReplaceAll(k, "_", " "), func(m WasmPodMem) float64 { return m.CtrKinds[k] }})
	}
	return out
}()

// WasmMem stores the mean of each of wasmMemFigures over pods for each handler
// (pods[key]), and for wasm the 95 % bootstrap interval of each mean's difference
// from runc's (the pods are independent processes: each side resampled on its own).
func WasmMem(res Results, pods map[string][]WasmPodMem) error {
	rng := mrand.New(mrand.NewPCG(35, 53))
	ref := WasmHandlers[0].Key
	for i, h := range WasmHandlers {
		ms := pods[h.Key]
		if len(ms) == 0 {
			return fmt.Errorf("wasm memory: no pods of %s", h.Key)
		}
		res["wasm_"+h.Key+"_mem_pods"] = float64(len(ms))
		for _, f := range append(slices.Clone(wasmMemFigures), wasmKindFigures...) {
			vs := pick(ms, f.Of)
			sum := 0.0
			for _, v := range vs {
				sum += v
			}
			p := "wasm_" + h.Key + "_" + f.Key
			res[p] = sum / float64(len(vs))
			if i > 0 {
				res[p+"_lo"], res[p+"_hi"] = meanDeltaCI(pick(pods[ref], f.Of), vs, rng)
			}
		}
	}
	return nil
}

// WriteWasmTable prints the WebAssembly comparison WasmResults and WasmMem stored in
// res; nothing when res has none.
func WriteWasmTable(w io.Writer, res Results) error {
	n, ok := res["wasm_cycles"]
	if !ok {
		return nil
	}
	ref := WasmHandlers[0].Key
	fmt.Fprintf(w, "WebAssembly pods against runc pods: one crisp, %.0f pod cycles each, interleaved (ms; Δ of wasm against runc, with its 95 %% bootstrap interval; running: until the container's first output, the module running)\n", n)
	cols := make([]figureCol, len(wasmFigures))
	for i, f := range wasmFigures {
		cols[i] = figureCol{f.Key, f.Name}
	}
	rows := make([]cycleRow, len(WasmHandlers))
	for i, h := range WasmHandlers {
		rows[i] = cycleRow{Key: h.Key, Name: h.Name}
		if i > 0 {
			rows[i].Ref = ref
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	writeCycleRows(tw, res, "wasm_", rows, cols)
	for _, h := range WasmHandlers {
		writeNoiseRow(tw, res, h.Key, "wasm_noise_"+h.Key+"_", cols)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, h := range WasmHandlers {
		p := "wasm_" + h.Key + "_"
		fmt.Fprintf(w, "%s: first (cold) pod start %s ms, running %s ms (StartContainer to first output %s ms); timed: StartContainer to first output p50 %s ms, p99 %s ms\n",
			h.Key, num(res, p+"cold_pod_start", "ms"), num(res, p+"cold_running", "ms"), num(res, p+"cold_ready", "ms"),
			num(res, p+"ready_p50", "ms"), num(res, p+"ready_p99", "ms"))
	}
	if m, ok := res["wasm_module_kib"]; ok {
		fmt.Fprintf(w, "the module: %.0f KiB; crisp's compilation cache after the run: %s KiB\n", m, num(res, "wasm_cache_kib", "KiB"))
	}
	pods, ok := res["wasm_"+ref+"_mem_pods"]
	if !ok {
		return nil
	}
	fmt.Fprintf(w, "\nWebAssembly memory: %.0f running pods of one handler at a time, per pod in KiB (pod: shim+pause+container; Δ of wasm against runc with its 95 %% bootstrap interval)\n", pods)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, f := range wasmMemFigures {
		fmt.Fprintf(tw, "%s\t", f.Name)
	}
	fmt.Fprintln(tw)
	for i, h := range WasmHandlers {
		fmt.Fprintf(tw, "%s\t", h.Name)
		for _, f := range wasmMemFigures {
			fmt.Fprintf(tw, "%s\t", num(res, "wasm_"+h.Key+"_"+f.Key, "KiB"))
		}
		fmt.Fprintln(tw)
		if i == 0 {
			continue
		}
		fmt.Fprint(tw, "Δ [95% interval]\t")
		for _, f := range wasmMemFigures {
			key := "wasm_" + h.Key + "_" + f.Key
			fmt.Fprintf(tw, "%s [%s..%s]\t", signed(res[key]-res["wasm_"+ref+"_"+f.Key]), signed(res[key+"_lo"]), signed(res[key+"_hi"]))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, h := range WasmHandlers {
		var parts []string
		for _, f := range wasmKindFigures {
			parts = append(parts, strings.TrimPrefix(f.Name, "container USS, ")+" "+num(res, "wasm_"+h.Key+"_"+f.Key, "KiB"))
		}
		fmt.Fprintf(w, "%s: the container's USS by mapping, KiB: %s\n", h.Key, strings.Join(parts, ", "))
	}
	return nil
}

// smapsKinds are the kinds of mapping SmapsUSS sorts a process's private memory
// into: anonymous executable (code made at run time: wazero's compiled module),
// other anonymous (heaps, stacks, a module's linear memory), and file-backed
// (binaries, libraries).
var smapsKinds = []string{"anon_exec", "anon", "file"}

// SmapsUSS sums a /proc/PID/smaps's private pages (KiB) by smapsKinds.
func SmapsUSS(smaps []byte) (map[string]float64, error) {
	out := map[string]float64{}
	kind := ""
	for _, line := range strings.Split(string(smaps), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		// A mapping's header: "start-end perms offset dev inode [path]".
		if strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") && len(f) >= 5 {
			path := ""
			if len(f) > 5 {
				path = f[5]
			}
			switch {
			case path == "" || strings.HasPrefix(path, "["):
				kind = "anon"
				if strings.Contains(f[1], "x") {
					kind = "anon_exec"
				}
			default:
				kind = "file"
			}
			continue
		}
		if (f[0] == "Private_Clean:" || f[0] == "Private_Dirty:") && len(f) >= 2 {
			if kind == "" {
				return nil, fmt.Errorf("smaps: %q before any mapping", line)
			}
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, fmt.Errorf("smaps: %q: %w", line, err)
			}
			out[kind] += v
		}
	}
	return out, nil
}
