package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// unifiedCgroup tells whether the host runs cgroup v2 only.
func unifiedCgroup() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// cgroupFiles reads a cgroup's CPU time (ns) and memory usage straight from cgroupfs.
func cgroupFiles(t *testing.T, rel string) (cpu, mem uint64) {
	t.Helper()
	num := func(path string) uint64 {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if !unifiedCgroup() {
		return num(filepath.Join("/sys/fs/cgroup/cpuacct", rel, "cpuacct.usage")), num(filepath.Join("/sys/fs/cgroup/memory", rel, "memory.usage_in_bytes"))
	}
	dir := filepath.Join("/sys/fs/cgroup", rel)
	f, err := os.Open(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "usage_usec" {
			us, _ := strconv.ParseUint(v, 10, 64)
			cpu = us * 1000
		}
	}
	return cpu, num(filepath.Join(dir, "memory.current"))
}

func near(got, want uint64, frac float64) bool {
	d := float64(got) - float64(want)
	if d < 0 {
		d = -d
	}
	return d <= frac*float64(want)
}

// sinkServer listens inside a pod's netns and discards what it receives.
func sinkServer(t *testing.T, nsPath string) int {
	t.Helper()
	var l net.Listener
	inNetns(t, nsPath, func() {
		var err error
		if l, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func defaultIfaceRx(st *cri.PodSandboxStats) uint64 {
	return st.GetLinux().GetNetwork().GetDefaultInterface().GetRxBytes().GetValue()
}

// TestE2EStats runs a pod (with its own cgroup parent, as kubelet gives one) holding a
// container that burns a core and holds 50 MB of /dev/shm, and a created-only one, and
// checks the stats RPCs against the cgroup files, the network counters against traffic
// sent into the pod, the filters, the metrics RPCs against the stats, the streams
// against the lists, and that a pod whose shim died is still reported.
func TestE2EStats(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)

	cfg, podID, parent := e.runPodInParent(ctx, t, "stats")
	busyCfg := ctrConfig("busy", img, "sh", "-c", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=50 2>/dev/null; while :; do :; done")
	busy := e.runCtr(ctx, podID, cfg, busyCfg)
	created, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: ctrConfig("idle", img, "sleep", "1000"), SandboxConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	idle := created.ContainerId
	busyCgroup := parent + "/crisp-" + busy
	podStatus, info := e.status(ctx, podID)

	// Let the dd finish and the loop run, then take two samples two seconds apart.
	time.Sleep(2 * time.Second)
	first, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: busy})
	if err != nil {
		t.Fatal(err)
	}
	firstCPU, _ := cgroupFiles(t, busyCgroup)
	time.Sleep(2 * time.Second)
	resp, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: busy})
	if err != nil {
		t.Fatal(err)
	}
	fileCPU, fileMem := cgroupFiles(t, busyCgroup)
	st := resp.GetStats()
	cpu, mem := st.GetCpu().GetUsageCoreNanoSeconds().GetValue(), st.GetMemory().GetUsageBytes().GetValue()
	cores := st.GetCpu().GetUsageNanoCores().GetValue()
	t.Logf("container: cpu %d ns (cgroup file %d), memory %d (file %d), working set %d, rss %d, nano cores %d, writable layer %d bytes / %d inodes",
		cpu, fileCPU, mem, fileMem, st.GetMemory().GetWorkingSetBytes().GetValue(), st.GetMemory().GetRssBytes().GetValue(), cores,
		st.GetWritableLayer().GetUsedBytes().GetValue(), st.GetWritableLayer().GetInodesUsed().GetValue())
	if !near(cpu, fileCPU, 0.10) {
		t.Errorf("cpu %d ns vs cgroup file %d: more than 10%% apart", cpu, fileCPU)
	}
	if mem < 50<<20 || !near(mem, fileMem, 0.10) {
		t.Errorf("memory %d vs cgroup file %d: want >= 50 MiB and within 10%%", mem, fileMem)
	}
	if ws := st.GetMemory().GetWorkingSetBytes().GetValue(); ws < 50<<20 || ws > mem {
		t.Errorf("working set %d: want the 50 MiB of shm and at most usage %d", ws, mem)
	}
	// A busy loop gets one core on an idle machine; on this shared 2-core VM it gets
	// what the scheduler leaves it, so the rate is checked against the rate of the
	// cgroup's own counter over the same two seconds (and must be more than a trickle).
	interval := time.Duration(st.GetCpu().GetTimestamp() - first.GetStats().GetCpu().GetTimestamp())
	fileRate := uint64(float64(fileCPU-firstCPU) / interval.Seconds())
	t.Logf("usage_nano_cores %d over %v; cgroup file rate %d", cores, interval, fileRate)
	if st.GetCpu().GetUsageNanoCores() == nil || cores < 100_000_000 || cores > 1_100_000_000 || !near(cores, fileRate, 0.15) {
		t.Errorf("usage_nano_cores = %d, want about the cgroup's own rate %d (one core = 1e9 when the machine is idle)", cores, fileRate)
	}
	if st.GetAttributes().GetId() != busy || st.GetAttributes().GetMetadata().GetName() != "busy" || st.GetAttributes().GetLabels()["ctr"] != "busy" {
		t.Errorf("attributes = %v", st.GetAttributes())
	}
	if wl := st.GetWritableLayer(); wl == nil || wl.GetFsId().GetMountpoint() == "" || wl.GetInodesUsed().GetValue() < 1 {
		t.Errorf("writable layer = %v", wl)
	}

	t.Run("ListContainerStats filters", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			filter *cri.ContainerStatsFilter
			want   []string
			code   codes.Code
		}{
			{"all", nil, []string{busy, idle}, codes.OK},
			{"by id", &cri.ContainerStatsFilter{Id: busy}, []string{busy}, codes.OK},
			{"by id prefix", &cri.ContainerStatsFilter{Id: idle[:12]}, []string{idle}, codes.OK},
			{"by pod", &cri.ContainerStatsFilter{PodSandboxId: podID}, []string{busy, idle}, codes.OK},
			{"by label", &cri.ContainerStatsFilter{LabelSelector: map[string]string{"ctr": "idle"}}, []string{idle}, codes.OK},
			{"by pod and label", &cri.ContainerStatsFilter{PodSandboxId: podID, LabelSelector: map[string]string{"ctr": "busy"}}, []string{busy}, codes.OK},
			{"label mismatch", &cri.ContainerStatsFilter{LabelSelector: map[string]string{"ctr": "nope"}}, nil, codes.OK},
			{"unknown id", &cri.ContainerStatsFilter{Id: strings.Repeat("0", 64)}, nil, codes.OK},
			{"bad id", &cri.ContainerStatsFilter{Id: "../etc"}, nil, codes.InvalidArgument},
			{"bad label key", &cri.ContainerStatsFilter{LabelSelector: map[string]string{"": "x"}}, nil, codes.InvalidArgument},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, err := e.rt.ListContainerStats(ctx, &cri.ListContainerStatsRequest{Filter: tc.filter})
				if status.Code(err) != tc.code {
					t.Fatalf("err = %v, want %v", err, tc.code)
				}
				var got []string
				for _, s := range resp.GetStats() {
					got = append(got, s.GetAttributes().GetId())
					if s.GetAttributes().GetId() == idle && (s.GetCpu() != nil || s.GetMemory() != nil || s.GetWritableLayer() != nil) {
						t.Errorf("created-only container has usage: %v", s)
					}
					if s.GetAttributes().GetId() == busy && (s.GetCpu() == nil || s.GetMemory() == nil) {
						t.Errorf("running container without usage: %v", s)
					}
				}
				sort.Strings(got)
				want := append([]string(nil), tc.want...)
				sort.Strings(want)
				if strings.Join(got, ",") != strings.Join(want, ",") {
					t.Errorf("ids = %v, want %v", got, want)
				}
			})
		}
		if _, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: strings.Repeat("f", 64)}); status.Code(err) != codes.NotFound {
			t.Errorf("ContainerStats of unknown id = %v, want NotFound", err)
		}
		if _, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: strings.Repeat("f", 64)}); status.Code(err) != codes.NotFound {
			t.Errorf("PodSandboxStats of unknown id = %v, want NotFound", err)
		}
	})

	t.Run("PodSandboxStats", func(t *testing.T) {
		resp, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
		if err != nil {
			t.Fatal(err)
		}
		ps := resp.GetStats()
		fileCPU, fileMem := cgroupFiles(t, parent)
		lin := ps.GetLinux()
		t.Logf("pod: cpu %d (file %d), memory %d (file %d), processes %d, network %v",
			lin.GetCpu().GetUsageCoreNanoSeconds().GetValue(), fileCPU, lin.GetMemory().GetUsageBytes().GetValue(), fileMem,
			lin.GetProcess().GetProcessCount().GetValue(), lin.GetNetwork().GetDefaultInterface())
		if !near(lin.GetCpu().GetUsageCoreNanoSeconds().GetValue(), fileCPU, 0.10) || !near(lin.GetMemory().GetUsageBytes().GetValue(), fileMem, 0.10) {
			t.Errorf("pod cpu/memory not within 10%% of the pod cgroup's files")
		}
		if n := lin.GetProcess().GetProcessCount().GetValue(); n < 3 {
			t.Errorf("process count %d: want pause, the busy loop and the waiting init", n)
		}
		if len(lin.GetContainers()) != 2 {
			t.Errorf("pod lists %d containers, want 2", len(lin.GetContainers()))
		}
		if lin.GetNetwork().GetDefaultInterface().GetName() != "eth0" || ps.GetAttributes().GetLabels()["pod"] != "stats" {
			t.Errorf("network %v, attributes %v", lin.GetNetwork(), ps.GetAttributes())
		}

		// Traffic into the pod: 2 MB from the host to a listener in its netns.
		before := defaultIfaceRx(ps)
		port := sinkServer(t, info.NetNS)
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(podStatus.GetNetwork().GetIp(), strconv.Itoa(port)), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(make([]byte, 2<<20)); err != nil {
			t.Fatal(err)
		}
		c.Close()
		time.Sleep(200 * time.Millisecond)
		resp, err = e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
		if err != nil {
			t.Fatal(err)
		}
		after := defaultIfaceRx(resp.GetStats())
		t.Logf("eth0 rx bytes %d -> %d", before, after)
		if after < before+2<<20 {
			t.Errorf("eth0 rx bytes grew by %d after 2 MiB sent into the pod", after-before)
		}

		list, err := e.rt.ListPodSandboxStats(ctx, &cri.ListPodSandboxStatsRequest{Filter: &cri.PodSandboxStatsFilter{LabelSelector: map[string]string{"pod": "stats"}}})
		if err != nil || len(list.GetStats()) != 1 || list.GetStats()[0].GetAttributes().GetId() != podID {
			t.Errorf("ListPodSandboxStats by label = %v, %v", list, err)
		}
		if _, err := e.rt.ListPodSandboxStats(ctx, &cri.ListPodSandboxStatsRequest{Filter: &cri.PodSandboxStatsFilter{Id: "XYZ"}}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("bad pod filter = %v, want InvalidArgument", err)
		}

		// The metrics: a descriptor for every series, values consistent with the stats.
		descs, err := e.rt.ListMetricDescriptors(ctx, &cri.ListMetricDescriptorsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]int{}
		for _, d := range descs.GetDescriptors() {
			labels[d.GetName()] = len(d.GetLabelKeys())
		}
		for _, name := range []string{"container_cpu_usage_seconds_total", "container_memory_usage_bytes", "container_memory_working_set_bytes",
			"container_memory_rss", "container_network_receive_bytes_total", "container_network_transmit_bytes_total", "container_fs_usage_bytes", "container_processes"} {
			if _, ok := labels[name]; !ok {
				t.Errorf("ListMetricDescriptors lacks %s", name)
			}
		}
		statsNow, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
		if err != nil {
			t.Fatal(err)
		}
		metrics, err := e.rt.ListPodSandboxMetrics(ctx, &cri.ListPodSandboxMetricsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var pm *cri.PodSandboxMetrics
		for _, m := range metrics.GetPodMetrics() {
			if m.GetPodSandboxId() == podID {
				pm = m
			}
		}
		if pm == nil {
			t.Fatalf("ListPodSandboxMetrics has no pod %s", podID)
		}
		value := func(ms []*cri.Metric, name, last string) (uint64, bool) {
			for _, m := range ms {
				if n, ok := labels[m.GetName()]; !ok || n != len(m.GetLabelValues()) {
					t.Errorf("series %s: %d label values, descriptor has %d", m.GetName(), len(m.GetLabelValues()), n)
				}
				lv := m.GetLabelValues()
				if m.GetName() == name && (last == "" || lv[len(lv)-1] == last) {
					return m.GetValue().GetValue(), true
				}
			}
			return 0, false
		}
		rx, ok := value(pm.GetMetrics(), "container_network_receive_bytes_total", "eth0")
		if want := defaultIfaceRx(statsNow.GetStats()); !ok || rx < want || rx > want+64<<10 {
			t.Errorf("container_network_receive_bytes_total{eth0} = %d (%v), PodSandboxStats said %d", rx, ok, want)
		}
		var busyMetrics []*cri.Metric
		for _, cm := range pm.GetContainerMetrics() {
			if cm.GetContainerId() == busy {
				busyMetrics = cm.GetMetrics()
			}
			if cm.GetContainerId() == idle {
				t.Errorf("created-only container has metrics")
			}
		}
		var busyStats *cri.ContainerStats
		for _, cs := range statsNow.GetStats().GetLinux().GetContainers() {
			if cs.GetAttributes().GetId() == busy {
				busyStats = cs
			}
		}
		memM, _ := value(busyMetrics, "container_memory_usage_bytes", "")
		cpuM, _ := value(busyMetrics, "container_cpu_usage_seconds_total", "")
		fsM, _ := value(busyMetrics, "container_fs_usage_bytes", "")
		t.Logf("metrics: busy memory %d, cpu %d s, fs %d; rx %d", memM, cpuM, fsM, rx)
		if !near(memM, busyStats.GetMemory().GetUsageBytes().GetValue(), 0.10) {
			t.Errorf("container_memory_usage_bytes %d vs stats %d", memM, busyStats.GetMemory().GetUsageBytes().GetValue())
		}
		if statsCPU := busyStats.GetCpu().GetUsageCoreNanoSeconds().GetValue() / 1e9; cpuM < statsCPU || cpuM > statsCPU+2 {
			t.Errorf("container_cpu_usage_seconds_total %d vs stats %d s", cpuM, statsCPU)
		}
		if fsM != busyStats.GetWritableLayer().GetUsedBytes().GetValue() {
			t.Errorf("container_fs_usage_bytes %d vs writable layer %d (cached, so equal)", fsM, busyStats.GetWritableLayer().GetUsedBytes().GetValue())
		}
	})

	t.Run("streams", func(t *testing.T) {
		cs, err := e.rt.StreamContainerStats(ctx, &cri.StreamContainerStatsRequest{Filter: &cri.ContainerStatsFilter{PodSandboxId: podID}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for {
			m, err := cs.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range m.GetContainerStats() {
				ids = append(ids, s.GetAttributes().GetId())
			}
		}
		sort.Strings(ids)
		want := []string{busy, idle}
		sort.Strings(want)
		if strings.Join(ids, ",") != strings.Join(want, ",") {
			t.Errorf("StreamContainerStats ids = %v, want %v", ids, want)
		}
		ps, err := e.rt.StreamPodSandboxStats(ctx, &cri.StreamPodSandboxStatsRequest{Filter: &cri.PodSandboxStatsFilter{Id: podID}})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := ps.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range m.GetPodSandboxStats() {
				if s.GetAttributes().GetId() != podID || s.GetLinux().GetCpu() == nil {
					t.Errorf("streamed pod stats = %v", s)
				}
				n++
			}
		}
		if n != 1 {
			t.Errorf("StreamPodSandboxStats sent %d pods, want 1", n)
		}
		pms, err := e.rt.StreamPodSandboxMetrics(ctx, &cri.StreamPodSandboxMetricsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for {
			m, err := pms.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range m.GetPodSandboxMetrics() {
				found = found || p.GetPodSandboxId() == podID && len(p.GetContainerMetrics()) == 1
			}
		}
		if !found {
			t.Error("StreamPodSandboxMetrics did not send the pod with its running container")
		}
	})

	t.Run("shim gone", func(t *testing.T) {
		cfg2 := e.podConfig("stats-doomed")
		pod2 := e.runPod(ctx, cfg2)
		ctr2 := e.runCtr(ctx, pod2, cfg2, ctrConfig("victim", img, "sleep", "1000"))
		_, info2 := e.status(ctx, pod2)
		if err := syscall.Kill(info2.ShimPid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for e.podState(ctx, pod2) != cri.PodSandboxState_SANDBOX_NOTREADY {
			if time.Now().After(deadline) {
				t.Fatal("pod not NOTREADY after its shim was killed")
			}
			time.Sleep(50 * time.Millisecond)
		}
		list, err := e.rt.ListContainerStats(ctx, &cri.ListContainerStatsRequest{Filter: &cri.ContainerStatsFilter{PodSandboxId: pod2}})
		if err != nil || len(list.GetStats()) != 1 || list.GetStats()[0].GetAttributes().GetId() != ctr2 || list.GetStats()[0].GetCpu() != nil {
			t.Errorf("ListContainerStats of a pod without shim = %v, %v; want its container, attributes only", list, err)
		}
		ps, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: pod2})
		if err != nil || ps.GetStats().GetAttributes().GetId() != pod2 || ps.GetStats().GetLinux().GetCpu() != nil {
			t.Errorf("PodSandboxStats of a pod without shim = %v, %v; want attributes only", ps, err)
		}
		all, err := e.rt.ListPodSandboxStats(ctx, &cri.ListPodSandboxStatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range all.GetStats() {
			if s.GetAttributes().GetId() == pod2 {
				t.Error("ListPodSandboxStats lists a pod that is not ready")
			}
		}
		if _, err := e.rt.ListPodSandboxMetrics(ctx, &cri.ListPodSandboxMetricsRequest{}); err != nil {
			t.Errorf("ListPodSandboxMetrics with a dead shim: %v", err)
		}
		if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: pod2}); err != nil {
			t.Errorf("remove pod whose shim died: %v", err)
		}
	})
}

func (e *env) podState(ctx context.Context, id string) cri.PodSandboxState {
	e.t.Helper()
	resp, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.GetStatus().GetState()
}

// runPodInParent runs pod name with a cgroup parent of its own below the env's, as
// kubelet gives each pod one, and removes the pod and then that parent when the test
// ends (before the env's cleanup: the parent is the test's, removable only once the
// pod is gone). It returns the pod's config, id and cgroup parent.
func (e *env) runPodInParent(ctx context.Context, t *testing.T, name string) (*cri.PodSandboxConfig, string, string) {
	t.Helper()
	cfg := e.podConfig(name)
	parent := e.cgroup + "/pod-" + name
	cfg.Linux.CgroupParent = parent
	podID := e.runPod(ctx, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID})
		for _, ctrl := range append(cgroupControllers(), "unified", "") {
			dir := filepath.Join("/sys/fs/cgroup", ctrl, parent)
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove pod cgroup parent: %v", err)
			}
		}
	})
	return cfg, podID, parent
}
