package bench

import (
	"strings"
	"testing"
	"time"
)

func TestWasmResults(t *testing.T) {
	// runc: cycles of 100/104 ms (even/odd rounds), pod start 99/103.
	var runc, wasm []WasmCycle
	for _, c := range cyclesOf(100, 104, 100, 104, 100, 104) {
		runc = append(runc, WasmCycle{CycleTimes: c})
		// wasm: 5 ms more RunPodSandbox than runc's in every round, and 200 ms until
		// its module prints.
		w := c
		w.Run += 5 * time.Millisecond
		wasm = append(wasm, WasmCycle{CycleTimes: w, Ready: 200 * time.Millisecond})
	}
	cold := []WasmCycle{{CycleTimes: CycleTimes{Run: 300 * time.Millisecond}}, {CycleTimes: CycleTimes{Run: 400 * time.Millisecond}, Ready: 2 * time.Second}}
	res := Results{}
	if err := WasmResults(res, [][]WasmCycle{runc, wasm}, cold); err != nil {
		t.Fatal(err)
	}
	mems := map[string][]WasmPodMem{
		"runc": {{Shim: Mem{PSS: 3000, USS: 2000}, Pause: Mem{PSS: 100}, Ctr: Mem{PSS: 200, USS: 100}}},
		"wasm": {{Shim: Mem{PSS: 3500, USS: 2500}, Pause: Mem{PSS: 100}, Ctr: Mem{PSS: 9000, USS: 8000}}},
	}
	if err := WasmMem(res, mems); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{
		"wasm_cycles":                6,
		"wasm_runc_pod_start_p50":    99,
		"wasm_runc_running_p50":      99,
		"wasm_wasm_pod_start_p50":    104,
		"wasm_wasm_pod_start_p50_lo": 5,
		"wasm_wasm_pod_start_p50_hi": 5,
		"wasm_wasm_running_p50":      304,
		"wasm_wasm_running_p50_lo":   205,
		"wasm_wasm_cycle_p50":        105,
		"wasm_noise_runc_cycle_p50":  4,
		"wasm_wasm_ready_p50":        200,
		"wasm_wasm_cold_running":     2400,
		"wasm_runc_cold_pod_start":   300,
		"wasm_runc_pod_pss":          3300,
		"wasm_wasm_pod_pss":          12600,
		"wasm_wasm_pod_uss_lo":       8400,
		"wasm_wasm_pod_uss_hi":       8400,
		"wasm_wasm_ctr_uss":          8000,
	} {
		if got, ok := res[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	var sb strings.Builder
	if err := WriteWasmTable(&sb, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"WebAssembly pods against runc pods", "noise: wasm, even vs odd rounds", "wasm: first (cold) pod start 400 ms, running 2400 ms", "WebAssembly memory: 1 running pods", "+9300 [+9300..+9300]"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, sb.String())
		}
	}
	if err := WriteWasmTable(&sb, Results{}); err != nil {
		t.Fatal(err)
	}
}

func TestSmapsUSS(t *testing.T) {
	smaps := `00400000-00600000 r-xp 00000000 08:01 123 /bin/shim-wasm
Rss:                1024 kB
Private_Clean:       100 kB
Private_Dirty:        20 kB
7f0000000000-7f0000100000 rwxp 00000000 00:00 0 
Private_Clean:         0 kB
Private_Dirty:       500 kB
7f1000000000-7f1000100000 rw-p 00000000 00:00 0 
Private_Dirty:       300 kB
7ffc00000000-7ffc00010000 rw-p 00000000 00:00 0                          [stack]
Private_Dirty:         8 kB
VmFlags: rd wr mr mw me ac sd
`
	got, err := SmapsUSS([]byte(smaps))
	if err != nil {
		t.Fatal(err)
	}
	if got["file"] != 120 || got["anon_exec"] != 500 || got["anon"] != 308 {
		t.Errorf("SmapsUSS = %v, want file 120, anon_exec 500, anon 308", got)
	}
}
