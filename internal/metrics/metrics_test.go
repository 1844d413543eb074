package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// withState returns metrics with every scrape-time source registered.
func withState() *Metrics {
	m := New()
	m.WatchPods(func() int { return 2 })
	m.WatchShims(func() int { return 1 })
	m.WatchContainers(func() map[string]int { return map[string]int{"created": 1, "running": 3, "exited": 0} })
	m.WatchImages(func() (int, int64) { return 4, 1 << 20 })
	m.WatchContainerEvents(func() int { return 1 }, func() uint64 { return 7 })
	return m
}

// record touches every recorded metric once.
func record(m *Metrics) {
	m.ObservePodStart(120 * time.Millisecond)
	for _, p := range []string{PhaseNetNS, PhaseCNI, PhaseShimStart, PhaseSandboxStart} {
		m.ObservePodStartPhase(p, 10*time.Millisecond)
	}
	m.ObserveContainerCreate(5 * time.Millisecond)
	m.ObserveContainerStart(8 * time.Millisecond)
	m.ObserveCNI(CNIAdd, 8*time.Millisecond, nil)
	m.ObserveCNI(CNIDel, 30*time.Millisecond, errors.New("plugin failed"))
	m.ObservePull(2*time.Second, 1000, nil)
	m.ObservePull(time.Second, 0, errors.New("not found"))
	m.ShimDied()
	m.PodRecovered(RecoveredReconnected)
	m.ContainerExited("Completed")
	m.ContainerExited("OOMKilled")
	m.ContainerExited("Completed")
	m.ConfigLoaded()
	m.ConfigReloaded(nil)
	m.ConfigReloaded(errors.New("log_level must be debug, info, warn or error"))
	m.ConfigReloaded(errors.New("parse config"))
	ctx := context.Background()
	info := &grpc.UnaryServerInfo{FullMethod: "/runtime.v1.RuntimeService/RunPodSandbox"}
	_, _ = m.UnaryServerInterceptor()(ctx, nil, info, func(context.Context, any) (any, error) { return "ok", nil })
	_, _ = m.UnaryServerInterceptor()(ctx, nil, info, func(context.Context, any) (any, error) {
		return nil, status.Error(codes.NotFound, "no such pod")
	})
}

func TestLint(t *testing.T) {
	m := withState()
	record(m)
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestValues(t *testing.T) {
	m := withState()
	record(m)
	for _, tc := range []struct {
		name string
		want string
	}{
		{"crisp_container_exits_total", `
# HELP crisp_container_exits_total Container exits seen by criserver, by reason (Completed, Error, OOMKilled, Unknown).
# TYPE crisp_container_exits_total counter
crisp_container_exits_total{reason="Completed"} 2
crisp_container_exits_total{reason="OOMKilled"} 1
`},
		{"crisp_image_pulls_total", `
# HELP crisp_image_pulls_total Image pulls, by result.
# TYPE crisp_image_pulls_total counter
crisp_image_pulls_total{result="error"} 1
crisp_image_pulls_total{result="success"} 1
`},
		{"crisp_image_pulled_bytes_total", `
# HELP crisp_image_pulled_bytes_total Bytes downloaded from registries by successful image pulls.
# TYPE crisp_image_pulled_bytes_total counter
crisp_image_pulled_bytes_total 1000
`},
		{"crisp_containers", `
# HELP crisp_containers Containers criserver knows, by CRI state (created, running, exited).
# TYPE crisp_containers gauge
crisp_containers{state="created"} 1
crisp_containers{state="exited"} 0
crisp_containers{state="running"} 3
`},
		{"crisp_images", `
# HELP crisp_images Images in the store.
# TYPE crisp_images gauge
crisp_images 4
`},
		{"crisp_container_events_dropped_total", `
# HELP crisp_container_events_dropped_total Container events dropped for GetContainerEvents subscribers whose buffer was full.
# TYPE crisp_container_events_dropped_total counter
crisp_container_events_dropped_total 7
`},
		{"crisp_config_reloads_total", `
# HELP crisp_config_reloads_total Reloads of the config file on SIGHUP, by result: success (applied) or failure (refused; the settings in force did not change).
# TYPE crisp_config_reloads_total counter
crisp_config_reloads_total{result="failure"} 2
crisp_config_reloads_total{result="success"} 1
`},
		{"crisp_grpc_server_handled_total", `
# HELP crisp_grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.
# TYPE crisp_grpc_server_handled_total counter
crisp_grpc_server_handled_total{grpc_code="NotFound",grpc_method="RunPodSandbox",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"} 1
crisp_grpc_server_handled_total{grpc_code="OK",grpc_method="RunPodSandbox",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"} 1
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(tc.want), tc.name); err != nil {
				t.Error(err)
			}
		})
	}
	// Histograms: count only, the buckets are an implementation detail.
	for name, want := range map[string]int{
		"crisp_pod_start_duration_seconds":       1,
		"crisp_pod_start_phase_duration_seconds": 4,
		"crisp_cni_operation_duration_seconds":   2,
		"crisp_image_pull_duration_seconds":      2,
		"crisp_grpc_server_handling_seconds":     1,
		"go_goroutines":                          1,
		"process_resident_memory_bytes":          1,
	} {
		if n, err := testutil.GatherAndCount(m.Registry(), name); err != nil || n != want {
			t.Errorf("%s: %d series (err %v), want %d", name, n, err, want)
		}
	}
}

// TestNil: a nil *Metrics is what components get with metrics off; it must do nothing
// and never panic.
func TestNil(t *testing.T) {
	var m *Metrics
	record(m)
	m.WatchPods(func() int { panic("called") })
	m.WatchShims(func() int { panic("called") })
	m.WatchContainers(func() map[string]int { panic("called") })
	m.WatchImages(func() (int, int64) { panic("called") })
	m.WatchContainerEvents(func() int { panic("called") }, func() uint64 { panic("called") })
}

func TestHandler(t *testing.T) {
	m := withState()
	record(m)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		path     string
		code     int
		contains string
	}{
		{"/metrics", http.StatusOK, "crisp_pods 2"},
		{"/", http.StatusNotFound, ""},
		{"/metrics/", http.StatusNotFound, ""},
		{"/debug/pprof/", http.StatusNotFound, ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.code)
			}
			if !strings.Contains(string(body), tc.contains) {
				t.Errorf("body lacks %q:\n%s", tc.contains, body)
			}
		})
	}
}

// BenchmarkScrape measures what one scrape costs criserver (CPU and garbage).
func BenchmarkScrape(b *testing.B) {
	m := withState()
	record(m)
	h := m.Handler()
	req := httptest.NewRequest(http.MethodGet, Path, nil)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatal(w.Code)
		}
	}
}

// TestConfigReloadTimestamp: the gauge is the time of the last load that applied,
// and a failed reload leaves it alone.
func TestConfigReloadTimestamp(t *testing.T) {
	m := New()
	if got := testutil.ToFloat64(m.lastReload); got != 0 {
		t.Fatalf("before any load: %v", got)
	}
	before := float64(time.Now().Unix())
	m.ConfigLoaded()
	loaded := testutil.ToFloat64(m.lastReload)
	if loaded < before {
		t.Fatalf("after ConfigLoaded: %v, want at least %v", loaded, before)
	}
	m.ConfigReloaded(errors.New("bad file"))
	if got := testutil.ToFloat64(m.lastReload); got != loaded {
		t.Errorf("a failed reload moved the gauge from %v to %v", loaded, got)
	}
	if got := testutil.ToFloat64(m.reloads.WithLabelValues(ResultSuccess)); got != 0 {
		t.Errorf("successes after a failure only: %v", got)
	}
	time.Sleep(10 * time.Millisecond)
	m.ConfigReloaded(nil)
	if got := testutil.ToFloat64(m.lastReload); got <= loaded {
		t.Errorf("a successful reload left the gauge at %v (loaded at %v)", got, loaded)
	}
}
