package bench

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// An excerpt of criserver's /metrics.
const exposition = `# HELP crisp_pod_start_phase_duration_seconds Time of each part of a successful pod start.
# TYPE crisp_pod_start_phase_duration_seconds histogram
crisp_pod_start_phase_duration_seconds_bucket{phase="cni",le="0.001"} 0
crisp_pod_start_phase_duration_seconds_bucket{phase="cni",le="+Inf"} 4
crisp_pod_start_phase_duration_seconds_sum{phase="cni"} 0.05
crisp_pod_start_phase_duration_seconds_count{phase="cni"} 4
crisp_pod_start_phase_duration_seconds_sum{phase="netns"} 0.002
crisp_pod_start_phase_duration_seconds_count{phase="netns"} 4
crisp_pod_start_phase_duration_seconds_sum{phase="pod_files"} 0
crisp_pod_start_phase_duration_seconds_count{phase="pod_files"} 0
crisp_container_create_phase_duration_seconds_sum{phase="snapshot"} 0.003
crisp_container_create_phase_duration_seconds_count{phase="snapshot"} 3
crisp_pod_start_duration_seconds_sum 0.084
crisp_pod_start_duration_seconds_count 4
crisp_grpc_server_handled_total{grpc_code="OK",grpc_method="Run Pod",grpc_service="runtime.v1.RuntimeService"} 7 1700000000000

go_goroutines 12
`

func TestParseExposition(t *testing.T) {
	s, err := ParseExposition(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		`crisp_pod_start_phase_duration_seconds_sum{phase="cni"}`:              0.05,
		`crisp_pod_start_phase_duration_seconds_bucket{phase="cni",le="+Inf"}`: 4,
		`crisp_pod_start_duration_seconds_count`:                               4,
		`go_goroutines`:                                                        12,
		// A label value with a space, and a timestamp after the value.
		`crisp_grpc_server_handled_total{grpc_code="OK",grpc_method="Run Pod",grpc_service="runtime.v1.RuntimeService"}`: 7,
	} {
		if got, ok := s[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if len(s) != 14 {
		t.Errorf("%d samples, want 14: %v", len(s), s)
	}
	for _, bad := range []string{"x{a=\"b\"}\n", "x notanumber\n", "x 1 2 3\n"} {
		if _, err := ParseExposition(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPhaseMeans(t *testing.T) {
	s, err := ParseExposition(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	got := PhaseMeans(s, PodStartPhases)
	want := map[string]float64{"cni": 0.0125, "netns": 0.0005}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v (a phase never observed has no mean)", got, want)
	}
	for p, w := range want {
		if math.Abs(got[p]-w) > 1e-12 {
			t.Errorf("%s: %v, want %v", p, got[p], w)
		}
	}
	if got := PhaseMeans(s, CtrCreatePhases); len(got) != 1 || math.Abs(got["snapshot"]-0.001) > 1e-12 {
		t.Errorf("container create phases: %v", got)
	}
}

func TestParseCPUTime(t *testing.T) {
	// utime 250 and stime 50 ticks: 3 s.
	stat := "4242 (shim (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 100 1000000 500"
	d, err := parseCPUTime([]byte(stat))
	if err != nil || d != 3*time.Second {
		t.Errorf("got %v, %v; want 3s", d, err)
	}
	if _, err := parseCPUTime([]byte("1 (a) S 1 2")); err == nil {
		t.Error("short stat accepted")
	}
	if _, err := CPUTime(1 << 30); err == nil {
		t.Error("CPU time of a pid that cannot exist")
	}
}

func TestGrowth(t *testing.T) {
	if g := Growth(100, 105); math.Abs(g-5) > 1e-9 {
		t.Errorf("Growth(100, 105) = %v", g)
	}
	if g := Growth(100, 90); math.Abs(g+10) > 1e-9 {
		t.Errorf("Growth(100, 90) = %v", g)
	}
	if g := Growth(0, 5); g != 0 {
		t.Errorf("Growth(0, 5) = %v", g)
	}
}

func TestParallel(t *testing.T) {
	var calls, running, peak atomic.Int64
	seen := make([]atomic.Bool, 50)
	err := Parallel(context.Background(), 50, 4, func(_ context.Context, i int) error {
		calls.Add(1)
		seen[i].Store(true)
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return nil
	})
	if err != nil || calls.Load() != 50 || peak.Load() > 4 {
		t.Errorf("err %v, %d calls, %d at once; want nil, 50, ≤ 4", err, calls.Load(), peak.Load())
	}
	for i := range seen {
		if !seen[i].Load() {
			t.Errorf("index %d not called", i)
		}
	}

	// The first error stops the handing out of more work and is returned.
	boom := errors.New("boom")
	calls.Store(0)
	err = Parallel(context.Background(), 1000, 2, func(_ context.Context, i int) error {
		calls.Add(1)
		if i == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || calls.Load() > 10 {
		t.Errorf("err %v after %d calls; want boom after a few", err, calls.Load())
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Parallel(ctx, 10, 2, func(context.Context, int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}
