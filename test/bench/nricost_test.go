package bench

import (
	"strings"
	"testing"
	"time"
)

// cyclesOf are pod cycles whose totals are the given milliseconds, all of it
// RunPodSandbox except 1 ms of StopPodSandbox (so pod start is total-1).
func cyclesOf(ms ...int) []CycleTimes {
	var cs []CycleTimes
	for _, m := range ms {
		cs = append(cs, CycleTimes{Run: time.Duration(m-1) * time.Millisecond, StopPod: time.Millisecond})
	}
	return cs
}

// shifted is cs with every cycle's RunPodSandbox d longer.
func shifted(cs []CycleTimes, d time.Duration) []CycleTimes {
	out := append([]CycleTimes(nil), cs...)
	for i := range out {
		out[i].Run += d
	}
	return out
}

func TestNRIResults(t *testing.T) {
	// Disabled: its even rounds 100 ms, its odd ones 104 (and one slow 300): the
	// noise of p50 is 4 ms.
	off := cyclesOf(100, 104, 100, 104, 100, 300)
	// 1 ms more than disabled in every round: every resampling of the rounds gives a
	// difference of 1 ms.
	none := shifted(off, time.Millisecond)
	noop := cyclesOf(110, 112, 110, 112, 110, 150)
	res := Results{"cycle_p50": 7} // what else crisp measured stays
	if err := NRIResults(res, [][]CycleTimes{off, none, noop}); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{
		"cycle_p50":                 7,
		"nri_cycles":                6,
		"nri_off_cycle_p50":         100,
		"nri_off_cycle_p99":         300,
		"nri_off_pod_start_p50":     99,
		"nri_none_cycle_p50":        101,
		"nri_none_cycle_p50_lo":     1,
		"nri_none_cycle_p50_hi":     1,
		"nri_none_cycle_p99_lo":     1,
		"nri_none_cycle_p99_hi":     1,
		"nri_none_pod_start_p50_lo": 1,
		"nri_none_pod_start_p50_hi": 1,
		"nri_noop_cycle_p50":        110,
		"nri_noop_cycle_p99":        150,
		"nri_noop_pod_start_p50":    109,
		"nri_noise_cycle_p50":       4,   // 100 against 104
		"nri_noise_cycle_p99":       200, // 100 against 300
		"nri_noise_pod_start_p50":   4,
	} {
		if got, ok := res[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	for _, f := range []string{"cycle_p50", "cycle_p99", "pod_start_p50"} {
		delta := res["nri_noop_"+f] - res["nri_off_"+f]
		if lo, hi := res["nri_noop_"+f+"_lo"], res["nri_noop_"+f+"_hi"]; lo > delta || hi < delta || lo == hi {
			t.Errorf("no-op plugin's %s: Δ %v outside its interval %v..%v, or the interval is empty", f, delta, lo, hi)
		}
	}
	again := Results{}
	if err := NRIResults(again, [][]CycleTimes{off, none, noop}); err != nil || again["nri_noop_cycle_p50_lo"] != res["nri_noop_cycle_p50_lo"] {
		t.Errorf("the same cycles gave another interval: %v %v", again["nri_noop_cycle_p50_lo"], res["nri_noop_cycle_p50_lo"])
	}

	res["nri_noop_cycle_p50_lo"], res["nri_noop_cycle_p50_hi"] = -2, 20
	res["nri_noop_cycle_p99_lo"], res["nri_noop_cycle_p99_hi"] = -150, 50
	res["nri_noop_pod_start_p50_lo"], res["nri_noop_pod_start_p50_hi"] = 3, 12
	res["nri_noop_events"] = 10
	var sb strings.Builder
	if err := WriteNRITable(&sb, res); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		for _, name := range []string{"NRI disabled", "NRI enabled, no plugin", "NRI enabled, one no-op plugin", "noise: disabled, even vs odd rounds"} {
			if strings.HasPrefix(strings.TrimSpace(line), name+" ") {
				rows[name] = strings.Join(strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), name)), " ")
			}
		}
	}
	for name, want := range map[string]string{
		"NRI disabled":                        "100 - - 300 - - 99.0 - -",
		"NRI enabled, no plugin":              "101 +1.00 +1.00..+1.00 301 +1.00 +1.00..+1.00 100 +1.00 +1.00..+1.00",
		"NRI enabled, one no-op plugin":       "110 +10.0 -2.00..+20.0 150 -150 -150..+50.0 109 +10.0 +3.00..+12.0",
		"noise: disabled, even vs odd rounds": "±4.00 ±200 ±4.00",
	} {
		if rows[name] != want {
			t.Errorf("row %q = %q, want %q\n%s", name, rows[name], want, out)
		}
	}
	if !strings.Contains(out, "6 pod cycles each") || !strings.Contains(out, "10.0 events a timed cycle") {
		t.Errorf("table lacks the cycle or event count:\n%s", out)
	}

	// The main report prints it after its own table, and only when there is one.
	var main strings.Builder
	if err := (&Report{Runtimes: map[string]Results{"crisp": res}}).WriteTable(&main); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(main.String(), out) {
		t.Errorf("report lacks the NRI table:\n%s", main.String())
	}
	main.Reset()
	if err := (&Report{Runtimes: map[string]Results{"crisp": {"cycle_p50": 7}}}).WriteTable(&main); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(main.String(), "NRI") {
		t.Errorf("report without an NRI run prints an NRI table:\n%s", main.String())
	}
}

func TestNRIResultsRefusesUnevenRuns(t *testing.T) {
	for _, c := range []struct {
		name string
		runs [][]CycleTimes
	}{
		{"two variants", [][]CycleTimes{cyclesOf(1, 2), cyclesOf(1, 2)}},
		{"uneven", [][]CycleTimes{cyclesOf(1, 2, 3), cyclesOf(1, 2), cyclesOf(1, 2, 3)}},
		{"one cycle", [][]CycleTimes{cyclesOf(1), cyclesOf(1), cyclesOf(1)}},
	} {
		res := Results{}
		if err := NRIResults(res, c.runs); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
		if len(res) != 0 {
			t.Errorf("%s: stored %v", c.name, res)
		}
	}
}
