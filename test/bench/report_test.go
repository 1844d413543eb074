package bench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSmapsRollup(t *testing.T) {
	in := `55d0a0000000-7ffc1e1f2000 ---p 00000000 00:00 0                          [rollup]
Rss:               18512 kB
Pss:                3301 kB
Pss_Dirty:          2000 kB
Shared_Clean:      15000 kB
Shared_Dirty:          0 kB
Private_Clean:       212 kB
Private_Dirty:      2300 kB
`
	m, err := parseSmapsRollup([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if m != (Mem{RSS: 18512, PSS: 3301, USS: 2512}) {
		t.Errorf("got %+v", m)
	}
	if _, err := parseSmapsRollup([]byte("Rss: 1 kB\n")); err == nil {
		t.Error("incomplete rollup accepted")
	}
}

func TestParsePPid(t *testing.T) {
	for _, c := range []struct {
		stat string
		want int
		err  bool
	}{
		{"123 (sleep) S 45 123 45 0 -1", 45, false},
		{"123 (a b) c)) R 7 1 1", 7, false},
		{"garbage", 0, true},
	} {
		got, err := parsePPid([]byte(c.stat))
		if (err != nil) != c.err || got != c.want {
			t.Errorf("parsePPid(%q) = %d, %v", c.stat, got, err)
		}
	}
	if p, err := PPid(os.Getpid()); err != nil || p != os.Getppid() {
		t.Errorf("PPid(self) = %d, %v; want %d", p, err, os.Getppid())
	}
}

func TestSandboxPid(t *testing.T) {
	if pid, err := sandboxPid(`{"pid": 42, "shimPid": 7}`); err != nil || pid != 42 {
		t.Errorf("got %d, %v", pid, err)
	}
	if _, err := sandboxPid(`{"pid": 0}`); err == nil {
		t.Error("pid 0 accepted")
	}
	if _, err := sandboxPid(`not json`); err == nil {
		t.Error("bad JSON accepted")
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 90: 90 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond, 0: time.Millisecond} {
		if got := Percentile(ds, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if ds[0] != 100*time.Millisecond {
		t.Error("Percentile sorted its input")
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty input")
	}
}

func TestReport(t *testing.T) {
	r := &Report{Time: time.Unix(0, 0), Runtimes: map[string]Results{
		"containerd": {"pod_start_p50": 200, "churn": 4, "pod_pss": 3.3},
		"crisp":      {"pod_start_p50": 90, "churn": 7, "pod_pss": 2},
	}}
	find := func(key string) Metric {
		for _, m := range Metrics {
			if m.Key == key {
				return m
			}
		}
		t.Fatalf("no metric %s", key)
		return Metric{}
	}
	for _, c := range []struct {
		key     string
		met, ok bool
	}{
		{"pod_start_p50", true, true}, // 0.45 ≤ 0.5
		{"churn", false, true},        // 1.75 < 2
		{"pod_pss", false, true},      // 0.61 > 0.5
		{"cycle_p50", false, false},   // no data
		{"run_pod_p50", false, false}, // no target
	} {
		met, ok := r.Met(find(c.key))
		if met != c.met || ok != c.ok {
			t.Errorf("%s: met %v ok %v, want %v %v", c.key, met, ok, c.met, c.ok)
		}
	}
	if !math.IsNaN(r.Ratio("exec_p50")) {
		t.Error("ratio without data")
	}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "MISSED") || !strings.Contains(sb.String(), "met") {
		t.Errorf("table lacks verdicts:\n%s", sb.String())
	}
	path, err := r.Save(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &back); err != nil || back.Runtimes["crisp"]["churn"] != 7 || filepath.Ext(path) != ".json" {
		t.Errorf("saved report %s: %v %+v", path, err, back)
	}
}

func TestReportLimitsAndCrispOnlyRows(t *testing.T) {
	r := &Report{Runtimes: map[string]Results{
		"containerd": {"soak_shim_growth": 1, "soak_daemon_growth": 50, "dens_start_all": 1000},
		"crisp":      {"soak_shim_growth": 4.9, "soak_daemon_growth": 6, "phase_cni": 12.5, "dens_start_all": 400},
	}}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(sb.String(), "\n") {
		for _, m := range Metrics {
			if strings.HasPrefix(strings.TrimSpace(line), strings.TrimSpace(m.Name)+" ") {
				rows[m.Key] = strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), strings.TrimSpace(m.Name)))
			}
		}
	}
	// A limit bounds crisp's own figure, whatever containerd's: no ratio.
	if got := strings.Join(rows["soak_shim_growth"], " "); got != "% 1.00 4.90 - ≤5.0 met" {
		t.Errorf("shim growth row: %q", got)
	}
	if got := strings.Join(rows["soak_daemon_growth"], " "); got != "% 50.0 6.00 - ≤5.0 MISSED" {
		t.Errorf("daemon growth row: %q", got)
	}
	if got := strings.Join(rows["phase_cni"], " "); got != "ms - 12.5 - " && got != "ms - 12.5 -" {
		t.Errorf("breakdown row: %q", got)
	}
	if got := strings.Join(rows["dens_start_all"], " "); got != "ms 1000 400 0.40 ≤0.5 met" {
		t.Errorf("density row: %q", got)
	}
	if _, ok := rows["pod_start_p50"]; ok || len(rows) != 4 {
		t.Errorf("rows without data printed: %v\n%s", rows, sb.String())
	}
}
