package shimtest

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cgroups "github.com/containerd/cgroups/v3"
	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	taskapi "github.com/crisp-runtime/crisp/api/containerd/task/v3"
)

// cgSample is what the tests compare: cumulative CPU ns, memory usage bytes, pids.
type cgSample struct {
	cpu, mem, pids uint64
}

// decodeMetrics unpacks a Stats/SandboxMetrics Any the way containerd's typeurl would:
// by the bare proto full name, v1 on legacy/hybrid hosts and v2 on unified ones.
func decodeMetrics(t *testing.T, a *anypb.Any) cgSample {
	t.Helper()
	unified := cgroups.Mode() == cgroups.Unified
	want := "io.containerd.cgroups.v1.Metrics"
	if unified {
		want = "io.containerd.cgroups.v2.Metrics"
	}
	if a.GetTypeUrl() != want {
		t.Fatalf("stats type URL = %q, want %q", a.GetTypeUrl(), want)
	}
	if unified {
		var m cg2.Metrics
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			t.Fatal(err)
		}
		return cgSample{cpu: m.GetCPU().GetUsageUsec() * 1000, mem: m.GetMemory().GetUsage(), pids: m.GetPids().GetCurrent()}
	}
	var m cg1.Metrics
	if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
		t.Fatal(err)
	}
	return cgSample{cpu: m.GetCPU().GetUsage().GetTotal(), mem: m.GetMemory().GetUsage().GetUsage(), pids: m.GetPids().GetCurrent()}
}

// readCgroupFiles reads the same figures straight from cgroupfs for the cgroup rel.
func readCgroupFiles(t *testing.T, rel string) cgSample {
	t.Helper()
	num := func(path string) uint64 {
		v, err := strconv.ParseUint(readTrim(t, path), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if cgroups.Mode() == cgroups.Unified {
		dir := filepath.Join("/sys/fs/cgroup", rel)
		var usec uint64
		f, err := os.Open(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "usage_usec" {
				usec, _ = strconv.ParseUint(v, 10, 64)
			}
		}
		return cgSample{cpu: usec * 1000, mem: num(filepath.Join(dir, "memory.current")), pids: num(filepath.Join(dir, "pids.current"))}
	}
	return cgSample{
		cpu:  num(filepath.Join("/sys/fs/cgroup/cpuacct", rel, "cpuacct.usage")),
		mem:  num(filepath.Join("/sys/fs/cgroup/memory", rel, "memory.usage_in_bytes")),
		pids: num(filepath.Join("/sys/fs/cgroup/pids", rel, "pids.current")),
	}
}

func within(got, want uint64, frac float64) bool {
	d := float64(got) - float64(want)
	if d < 0 {
		d = -d
	}
	return d <= frac*float64(want)
}

// TestTaskStats checks task Stats (v3 and v2) of a busy container against its cgroup
// files, Stats of a created-not-started container, and of unknown/deleted ones; and
// SandboxMetrics of the pod (its cgroup parent holds the pause and the container).
func TestTaskStats(t *testing.T) {
	p := startPod(t)
	ctx := ctxT(t)
	busy := p.create(t, "busy", ctrOpts{args: []string{"sh", "-c", "x=$(head -c 8000000 /dev/zero | tr '\\0' a); while :; do :; done"}})
	idle := p.create(t, "idle", ctrOpts{args: []string{"true"}})
	p.start(t, busy)

	// Created, not started: its cgroup exists and holds libcontainer's waiting init.
	resp, err := p.tasks.Stats(ctx, &taskapi.StatsRequest{ID: idle.id})
	if err != nil {
		t.Fatalf("stats of created container: %v", err)
	}
	if s := decodeMetrics(t, resp.GetStats()); s.pids < 1 {
		t.Errorf("created container pids = %d, want >= 1 (the waiting init)", s.pids)
	}

	time.Sleep(1500 * time.Millisecond)
	resp, err = p.tasks.Stats(ctx, &taskapi.StatsRequest{ID: busy.id})
	if err != nil {
		t.Fatal(err)
	}
	got := decodeMetrics(t, resp.GetStats())
	files := readCgroupFiles(t, busy.cgroup)
	t.Logf("stats %+v, cgroup files %+v", got, files)
	if got.cpu < 200_000_000 {
		t.Errorf("cpu of a busy loop after 1.5 s = %d ns, want > 0.2 s", got.cpu)
	}
	// The loop keeps burning between the two reads: allow what ~50 ms of one core adds.
	if !within(got.cpu, files.cpu, 0.10) {
		t.Errorf("cpu %d vs cpuacct %d: more than 10%% apart", got.cpu, files.cpu)
	}
	if got.mem < 8_000_000 || !within(got.mem, files.mem, 0.10) {
		t.Errorf("memory %d vs cgroup file %d: want >= 8 MB and within 10%%", got.mem, files.mem)
	}
	if got.pids != files.pids || got.pids < 1 {
		t.Errorf("pids %d vs %d", got.pids, files.pids)
	}

	// The same over containerd.task.v2.Task.
	v2 := &taskapi.StatsResponse{}
	if err := p.client.Call(ctx, "containerd.task.v2.Task", "Stats", &taskapi.StatsRequest{ID: busy.id}, v2); err != nil {
		t.Fatalf("v2 stats: %v", err)
	}
	if s := decodeMetrics(t, v2.GetStats()); s.cpu < got.cpu {
		t.Errorf("v2 cpu %d went backwards from %d", s.cpu, got.cpu)
	}

	// The pod: its cgroup parent holds the pause and both containers.
	m, err := p.sb.SandboxMetrics(ctx, &sandboxapi.SandboxMetricsRequest{SandboxID: p.id})
	if err != nil {
		t.Fatalf("sandbox metrics: %v", err)
	}
	if m.GetMetrics().GetID() != p.id || m.GetMetrics().GetTimestamp() == nil {
		t.Errorf("metric id/timestamp = %q/%v", m.GetMetrics().GetID(), m.GetMetrics().GetTimestamp())
	}
	pod := decodeMetrics(t, m.GetMetrics().GetData())
	parent := filepath.Dir(p.podCgroup)
	podFiles := readCgroupFiles(t, parent)
	t.Logf("pod metrics %+v, cgroup files %+v", pod, podFiles)
	if pod.cpu < got.cpu || !within(pod.cpu, podFiles.cpu, 0.10) {
		t.Errorf("pod cpu %d: want >= the busy container's %d and within 10%% of %d", pod.cpu, got.cpu, podFiles.cpu)
	}
	if pod.pids < 3 || pod.mem < got.mem/2 {
		t.Errorf("pod pids %d (want pause + 2 containers), memory %d", pod.pids, pod.mem)
	}
	if _, err := p.sb.SandboxMetrics(ctx, &sandboxapi.SandboxMetricsRequest{SandboxID: "other"}); status.Code(err) != codes.NotFound {
		t.Errorf("sandbox metrics of another id = %v, want NotFound", err)
	}

	if _, err := p.tasks.Stats(ctx, &taskapi.StatsRequest{ID: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of unknown container = %v, want NotFound", err)
	}
	p.delete(t, busy.id)
	if _, err := p.tasks.Stats(ctx, &taskapi.StatsRequest{ID: busy.id}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of deleted container = %v, want NotFound", err)
	}
	p.delete(t, idle.id)
}
