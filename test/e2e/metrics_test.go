package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// enableMetrics has the env's criserver serve metrics on a free loopback port and
// returns the base URL.
func (e *env) enableMetrics() string {
	e.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	e.appendConfig(fmt.Sprintf("[metrics]\naddress = %q\n", addr))
	return "http://" + addr
}

// scrape fetches /metrics and returns every sample by its series as exposed
// (name{label="v",...}; labels come sorted by name).
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("bad exposition line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad value in %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkSeries compares samples with what is wanted; a negative want means "> 0".
func checkSeries(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for series, w := range want {
		v, ok := got[series]
		switch {
		case !ok:
			t.Errorf("%s: missing", series)
		case w < 0 && v <= 0:
			t.Errorf("%s = %v, want > 0", series, v)
		case w >= 0 && v != w:
			t.Errorf("%s = %v, want %v", series, v, w)
		}
	}
}

// waitSeries polls until series has value want: some gauges follow a client's hang-up
// only once the server has noticed it.
func waitSeries(t *testing.T, base, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, ok := scrape(t, base)[series]
		if ok && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v (present %v), want %v", series, got, ok, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rpcOK(service, method string) string {
	return fmt.Sprintf(`crisp_grpc_server_handled_total{grpc_code="OK",grpc_method=%q,grpc_service="runtime.v1.%s",grpc_type="unary"}`, method, service)
}

// TestE2EMetrics drives a pod and container cycle, a restart and a removal, and
// checks after each that /metrics tells what happened; the listener serves nothing
// but /metrics.
func TestE2EMetrics(t *testing.T) {
	e := newEnv(t)
	base := e.enableMetrics()
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	podCfg := e.podConfig("metrics")
	pod := e.runPod(ctx, podCfg)
	done := e.runCtr(ctx, pod, podCfg, ctrConfig("done", img, "true"))
	failed := e.runCtr(ctx, pod, podCfg, ctrConfig("failed", img, "sh", "-c", "exit 3"))
	if st := e.waitExit(ctx, done, 10*time.Second); st.Reason != "Completed" {
		t.Fatalf("container done: reason %q", st.Reason)
	}
	if st := e.waitExit(ctx, failed, 10*time.Second); st.Reason != "Error" {
		t.Fatalf("container failed: reason %q", st.Reason)
	}
	// An event subscriber is seen while it is connected; its stream call is counted.
	sctx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	evs, err := e.rt.GetContainerEvents(sctx, &cri.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evs.Header(); err != nil {
		t.Fatal(err)
	}
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_container_event_subscribers`: 1,
		`crisp_grpc_server_started_total{grpc_method="GetContainerEvents",grpc_service="runtime.v1.RuntimeService",grpc_type="server_stream"}`: 1,
	})
	stopEvents()
	waitSeries(t, base, `crisp_container_event_subscribers`, 0)

	// A call that fails is counted with its code.
	if _, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: "nonexistent"}); err == nil {
		t.Fatal("status of an unknown pod succeeded")
	}

	checkSeries(t, scrape(t, base), map[string]float64{
		rpcOK("RuntimeService", "RunPodSandbox"):   1,
		rpcOK("RuntimeService", "CreateContainer"): 2,
		rpcOK("RuntimeService", "StartContainer"):  2,
		rpcOK("ImageService", "PullImage"):         1,
		`crisp_grpc_server_handled_total{grpc_code="NotFound",grpc_method="PodSandboxStatus",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"}`: 1,
		`crisp_grpc_server_handling_seconds_count{grpc_method="RunPodSandbox",grpc_service="runtime.v1.RuntimeService",grpc_type="unary"}`:                1,
		`crisp_pod_start_duration_seconds_count`:                                       1,
		`crisp_pod_start_duration_seconds_sum`:                                         -1,
		`crisp_pod_start_phase_duration_seconds_count{phase="netns"}`:                  1,
		`crisp_pod_start_phase_duration_seconds_count{phase="cni"}`:                    1,
		`crisp_pod_start_phase_duration_seconds_count{phase="shim_start"}`:             1,
		`crisp_pod_start_phase_duration_seconds_count{phase="sandbox_start"}`:          1,
		`crisp_container_create_duration_seconds_count`:                                2,
		`crisp_container_start_duration_seconds_count`:                                 2,
		`crisp_cni_operation_duration_seconds_count{operation="add",result="success"}`: 1,
		`crisp_container_exits_total{reason="Completed"}`:                              1,
		`crisp_container_exits_total{reason="Error"}`:                                  1,
		`crisp_image_pulls_total{result="success"}`:                                    1,
		`crisp_image_pull_duration_seconds_count{result="success"}`:                    1,
		`crisp_image_pulled_bytes_total`:                                               -1,
		`crisp_images`:                                                                 1,
		`crisp_image_store_bytes`:                                                      -1,
		`crisp_pods`:                                                                   1,
		`crisp_shims`:                                                                  1,
		`crisp_containers{state="exited"}`:                                             2,
		`crisp_containers{state="running"}`:                                            0,
		`crisp_container_event_subscribers`:                                            0,
		`crisp_container_events_dropped_total`:                                         0,
		`process_resident_memory_bytes`:                                                -1,
		`go_goroutines`:                                                                -1,
	})

	for _, path := range []string{"/", "/metrics/", "/debug/pprof/", "/healthz"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}

	// A restart finds the pod again and counts it.
	e.stop()
	e.start()
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_recovered_pods_total{outcome="reconnected"}`: 1,
		`crisp_pods`:                       1,
		`crisp_shims`:                      1,
		`crisp_containers{state="exited"}`: 2,
		`crisp_images`:                     1,
	})

	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_cni_operation_duration_seconds_count{operation="del",result="success"}`: 1,
		`crisp_pods`:                       0,
		`crisp_shims`:                      0,
		`crisp_containers{state="exited"}`: 0,
	})
}
