package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestNodeCgroupResources: a burstable pod in kubelet's cgroup, its container's
// limits in the v2 files (and, with the systemd driver, in the scope's unit
// properties), updated live, and every cgroup and scope gone after RemovePodSandbox.
func TestNodeCgroupResources(t *testing.T) {
	e := newNodeEnv(t)
	ctx := ctxT(t)
	img := e.busybox(ctx)
	systemd := nodeDriver() == "systemd"
	kp := e.kubeletPod("res", &cgroups.Resources{PidsLimit: ptrTo[int64](200)})
	podID := e.runPod(ctx, kp.cfg)
	_, info := e.status(ctx, podID)
	pauseCg := procCgroup(t, info.Pid)
	if filepath.Dir(pauseCg) != kp.cgroup {
		t.Errorf("pause runs in %s, want a child of kubelet's pod cgroup %s", pauseCg, kp.cgroup)
	}
	if systemd && filepath.Base(pauseCg) != "crisp-"+podID+".scope" {
		t.Errorf("pause cgroup %s, want the scope crisp-%s.scope", pauseCg, podID)
	}

	cfg := ctrConfig("limited", img, "sleep", "3600")
	cfg.Linux.Resources = &cri.LinuxContainerResources{
		MemoryLimitInBytes: 64 << 20, CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512,
		Unified: map[string]string{"memory.high": "62914560"},
	}
	hugetlb := hasController(t, kp.cgroup, "hugetlb")
	t.Logf("hugetlb controller in the pod cgroup: %v", hugetlb)
	if hugetlb {
		cfg.Linux.Resources.HugepageLimits = []*cri.HugepageLimit{{PageSize: "2MB", Limit: 4 << 20}}
	}
	id := e.runCtr(ctx, podID, kp.cfg, cfg)
	cg := procCgroup(t, e.ctrPid(ctx, id))
	if filepath.Dir(cg) != kp.cgroup {
		t.Errorf("container runs in %s, want a child of %s", cg, kp.cgroup)
	}
	weight := strconv.FormatUint(cgroups.ConvertCPUSharesToCgroupV2Value(512), 10)
	want := map[string]string{
		"memory.max":  "67108864",
		"memory.high": "62914560",
		"cpu.max":     "50000 100000",
		"cpu.weight":  weight,
	}
	if hugetlb {
		want["hugetlb.2MB.max"] = "4194304"
	}
	if exists(filepath.Join(cg, "memory.swap.max")) {
		// swap = memory limit: no swap (containerd's and kubelet's NoSwap default).
		want["memory.swap.max"] = "0"
	}
	checkFiles(t, cg, want)
	// The pod's pids limit is kubelet's, on the pod cgroup; the container is below it.
	checkFiles(t, kp.cgroup, map[string]string{"pids.max": "200"})
	unit := "crisp-" + id + ".scope"
	if systemd {
		checkUnit(t, unit, map[string]string{
			"MemoryMax": "67108864", "CPUQuotaPerSecUSec": "500ms", "CPUWeight": weight,
			"Slice": filepath.Base(kp.cgroup), "ActiveState": "active",
		})
	}

	// Live updates: memory and quota; shares and period stay.
	if _, err := e.rt.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{ContainerId: id, Linux: &cri.LinuxContainerResources{
		MemoryLimitInBytes: 128 << 20, CpuQuota: 20000, Unified: map[string]string{"memory.high": "104857600"},
	}}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	want["memory.max"], want["cpu.max"], want["memory.high"] = "134217728", "20000 100000", "104857600"
	checkFiles(t, cg, want)
	if systemd {
		checkUnit(t, unit, map[string]string{"MemoryMax": "134217728", "CPUQuotaPerSecUSec": "200ms", "CPUWeight": weight})
	}
	st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if r := st.GetStatus().GetResources().GetLinux(); r.GetMemoryLimitInBytes() != 128<<20 || r.GetCpuQuota() != 20000 || r.GetCpuShares() != 512 || r.GetCpuPeriod() != 100000 {
		t.Errorf("status after the update: %v", r)
	}

	// Pod-level resize, as kubelet does it: the pod cgroup first, then the CRI call.
	if err := kp.mgr.Set(&cgroups.Resources{Memory: 512 << 20, PidsLimit: ptrTo[int64](300)}); err != nil {
		t.Fatalf("resize the pod cgroup: %v", err)
	}
	if _, err := e.rt.UpdatePodSandboxResources(ctx, &cri.UpdatePodSandboxResourcesRequest{PodSandboxId: podID,
		Resources: &cri.LinuxContainerResources{MemoryLimitInBytes: 512 << 20}}); err != nil {
		t.Fatalf("UpdatePodSandboxResources: %v", err)
	}
	checkFiles(t, kp.cgroup, map[string]string{"memory.max": "536870912", "pids.max": "300"})
	if systemd {
		checkUnit(t, filepath.Base(kp.cgroup), map[string]string{"MemoryMax": "536870912", "TasksMax": "300"})
	}
	checkFiles(t, cg, map[string]string{"memory.max": "134217728"})

	e.stopRemove(ctx, t, podID)
	for _, dir := range []string{cg, pauseCg} {
		if exists(dir) {
			t.Errorf("cgroup %s left after RemovePodSandbox", dir)
		}
	}
	if left := childCgroups(t, kp.cgroup); len(left) > 0 {
		t.Errorf("kubelet's pod cgroup still holds %v", left)
	}
	if systemd {
		for _, u := range crispUnits(t) {
			if strings.Contains(u, podID) || strings.Contains(u, id) {
				t.Errorf("unit %s left after RemovePodSandbox", u)
			}
		}
	}
}

// TestNodeStatsAndOOM: stats read from cgroup v2 agree with its files, and an OOM
// kill, by the container's own limit or by the pod's, is reported as OOMKilled.
func TestNodeStatsAndOOM(t *testing.T) {
	e := newNodeEnv(t)
	ctx := ctxT(t)
	img := e.busybox(ctx)
	kp := e.kubeletPod("stats", nil)
	podID := e.runPod(ctx, kp.cfg)
	// Some CPU and a 16 MiB file in /dev/shm (tmpfs: anonymous memory charged to the
	// container, so in its working set; a page-cache file would start out inactive).
	id := e.runCtr(ctx, podID, kp.cfg, ctrConfig("busy", img, "sh", "-c",
		"i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; head -c 16777216 /dev/zero > /dev/shm/f; sleep 3600"))
	cg := procCgroup(t, e.ctrPid(ctx, id))
	var cs *cri.ContainerStats
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: id})
		if err != nil {
			t.Fatalf("ContainerStats: %v", err)
		}
		cs = resp.GetStats()
		if cs.GetMemory().GetWorkingSetBytes().GetValue() > 16<<20 && cs.GetCpu().GetUsageCoreNanoSeconds().GetValue() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container stats never showed the 16 MiB file and CPU use: %v", cs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The working set is memory.current - inactive_file (kubelet's formula).
	current := cgroupInt(t, cg, "memory.current")
	inactive := statField(t, cg, "memory.stat", "inactive_file")
	ws := int64(cs.GetMemory().GetWorkingSetBytes().GetValue())
	if diff := ws - (current - inactive); diff > 4<<20 || diff < -4<<20 {
		t.Errorf("working set %d, cgroup says %d - %d = %d", ws, current, inactive, current-inactive)
	}
	usec := statField(t, cg, "cpu.stat", "usage_usec")
	if ns := int64(cs.GetCpu().GetUsageCoreNanoSeconds().GetValue()); ns <= 0 || ns > usec*1000 {
		t.Errorf("cpu usage %d ns, cgroup's cpu.stat usage_usec %d (read later)", ns, usec)
	}
	ps, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
	if err != nil {
		t.Fatalf("PodSandboxStats: %v", err)
	}
	if l := ps.GetStats().GetLinux(); l.GetCpu().GetUsageCoreNanoSeconds().GetValue() == 0 || l.GetMemory().GetWorkingSetBytes().GetValue() < 16<<20 || len(l.GetContainers()) != 1 {
		t.Errorf("pod stats: %v", l)
	}
	ms, err := e.rt.ListPodSandboxMetrics(ctx, &cri.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatalf("ListPodSandboxMetrics: %v", err)
	}
	found := map[string]uint64{}
	for _, pm := range ms.GetPodMetrics() {
		if pm.GetPodSandboxId() != podID {
			continue
		}
		for _, cm := range pm.GetContainerMetrics() {
			for _, m := range cm.GetMetrics() {
				found[m.GetName()] = m.GetValue().GetValue()
			}
		}
	}
	if _, ok := found["container_cpu_usage_seconds_total"]; !ok {
		t.Errorf("ListPodSandboxMetrics: no container_cpu_usage_seconds_total for the container: %v", found)
	}
	if found["container_memory_working_set_bytes"] < 16<<20 {
		t.Errorf("ListPodSandboxMetrics: container_memory_working_set_bytes %d, want the 16 MiB file at least", found["container_memory_working_set_bytes"])
	}

	// OOM by the container's limit.
	hog := "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done"
	oomCfg := ctrConfig("oom", img, "sh", "-c", hog)
	oomCfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 24 << 20}
	oomID := e.runCtr(ctx, podID, kp.cfg, oomCfg)
	if st := e.waitExit(ctx, oomID, 90*time.Second); st.GetReason() != "OOMKilled" || st.GetExitCode() != 137 {
		t.Errorf("container over its own limit: exit %d reason %q, want 137 OOMKilled", st.GetExitCode(), st.GetReason())
	}
	e.stopRemove(ctx, t, podID)

	// OOM by the pod's limit (kubelet's pod cgroup); the container has none.
	kp2 := e.kubeletPod("podoom", &cgroups.Resources{Memory: 48 << 20})
	pod2 := e.runPod(ctx, kp2.cfg)
	hogID := e.runCtr(ctx, pod2, kp2.cfg, ctrConfig("hog", img, "sh", "-c", hog))
	if st := e.waitExit(ctx, hogID, 90*time.Second); st.GetReason() != "OOMKilled" {
		t.Errorf("container over its pod's limit: exit %d reason %q, want OOMKilled", st.GetExitCode(), st.GetReason())
	}
	e.stopRemove(ctx, t, pod2)
}

// checkFiles compares cgroup files with what they should hold, polling a little:
// systemd applies unit properties asynchronously to a D-Bus call's return.
func checkFiles(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	var got map[string]string
	for range 20 {
		got = map[string]string{}
		ok := true
		for name, w := range want {
			data, err := os.ReadFile(filepath.Join(dir, name))
			got[name] = strings.TrimSpace(string(data))
			if err != nil {
				got[name] = err.Error()
			}
			ok = ok && got[name] == w
		}
		if ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s/%s = %q, want %q", dir, name, got[name], w)
		}
	}
}

// checkUnit compares systemd unit properties.
func checkUnit(t *testing.T, unit string, want map[string]string) {
	t.Helper()
	names := make([]string, 0, len(want))
	for k := range want {
		names = append(names, k)
	}
	got := unitProps(t, unit, names...)
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s %s=%q, want %q", unit, k, got[k], w)
		}
	}
}

// hasController reports whether a v2 cgroup has a controller enabled.
func hasController(t *testing.T, dir, name string) bool {
	t.Helper()
	for _, c := range strings.Fields(cgroupFile(t, dir, "cgroup.controllers")) {
		if c == name {
			return true
		}
	}
	return false
}

// childCgroups lists the cgroup directories below dir.
func childCgroups(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	var out []string
	for _, en := range entries {
		if en.IsDir() {
			out = append(out, en.Name())
		}
	}
	return out
}

// cgroupInt reads a cgroup file holding one number.
func cgroupInt(t *testing.T, dir, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(cgroupFile(t, dir, name), 10, 64)
	if err != nil {
		t.Fatalf("%s/%s: %v", dir, name, err)
	}
	return v
}

// statField reads one "key value" line of a flat-keyed cgroup file.
func statField(t *testing.T, dir, file, key string) int64 {
	t.Helper()
	for _, line := range strings.Split(cgroupFile(t, dir, file), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s/%s %s: %v", dir, file, key, err)
			}
			return n
		}
	}
	t.Fatalf("%s/%s has no %s", dir, file, key)
	return 0
}

func ptrTo[T any](v T) *T { return &v }

// TestNodeCgroupParentPath: a cgroup_parent given as a path whose last element is a
// slice, as critest sends it ("/test.slice"), runs the pod in that slice under the
// systemd driver (containerd's and CRI-O's reading), and in that directory under
// cgroupfs.
func TestNodeCgroupParentPath(t *testing.T) {
	e := newNodeEnv(t)
	ctx := ctxT(t)
	img := e.busybox(ctx)
	for _, parent := range []string{"/crisp-e2e.slice", "crisp-e2e.slice/crisp-e2e-inner.slice"} {
		t.Run(parent, func(t *testing.T) {
			if nodeDriver() != "systemd" && !strings.HasPrefix(parent, "/") {
				t.Skip("cgroupfs takes absolute paths only")
			}
			pod := e.podConfig("parent")
			pod.Linux.CgroupParent = parent
			resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod})
			if err != nil {
				t.Fatalf("RunPodSandbox with cgroup_parent %q: %v", parent, err)
			}
			podID := resp.PodSandboxId
			defer e.stopRemove(ctx, t, podID)
			id := e.runCtr(ctx, podID, pod, ctrConfig("c", img, "sleep", "3600"))
			want := "/sys/fs/cgroup" + parent // cgroupfs: the path itself
			if nodeDriver() == "systemd" {
				// The slice the path ends in, where systemd puts it by its name.
				slice := filepath.Base(parent)
				want = "/sys/fs/cgroup/crisp.slice/crisp-e2e.slice"
				if slice != "crisp-e2e.slice" {
					want += "/" + slice
				}
			}
			_, info := e.status(ctx, podID)
			for what, pid := range map[string]int{"pause": info.Pid, "container": e.ctrPid(ctx, id)} {
				if cg := procCgroup(t, pid); filepath.Dir(cg) != want {
					t.Errorf("%s runs in %s, want a child of %s", what, cg, want)
				}
			}
		})
	}
}
