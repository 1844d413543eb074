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

func TestNRIResults(t *testing.T) {
	// Disabled: its even rounds 100 ms, its odd ones 104 (and one slow 300): the
	// noise of p50 is 4 ms.
	off := cyclesOf(100, 104, 100, 104, 100, 300)
	none := cyclesOf(101, 101, 101, 101, 101, 101)
	noop := cyclesOf(110, 112, 110, 112, 110, 150)
	res := Results{"cycle_p50": 7} // what else crisp measured stays
	if err := NRIResults(res, [][]CycleTimes{off, none, noop}); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{
		"cycle_p50":               7,
		"nri_cycles":              6,
		"nri_off_cycle_p50":       100,
		"nri_off_cycle_p99":       300,
		"nri_off_pod_start_p50":   99,
		"nri_none_cycle_p50":      101,
		"nri_noop_cycle_p50":      110,
		"nri_noop_cycle_p99":      150,
		"nri_noop_pod_start_p50":  109,
		"nri_noise_cycle_p50":     4,   // 100 against 104
		"nri_noise_cycle_p99":     200, // 100 against 300
		"nri_noise_pod_start_p50": 4,
	} {
		if got, ok := res[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}

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
		"NRI disabled":                        "100 - 300 - 99.0 -",
		"NRI enabled, no plugin":              "101 +1.00 101 -199 100 +1.00",
		"NRI enabled, one no-op plugin":       "110 +10.0 150 -150 109 +10.0",
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
