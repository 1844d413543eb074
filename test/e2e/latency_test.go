package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestE2EPodLatencyAndMemory measures RunPodSandbox over 50 sequential pods and the
// memory of shims, pause processes and criserver with 20 pods running. The numbers
// are logged (go test -v) for closing notes; the bounds are generous sanity limits.
func TestE2EPodLatencyAndMemory(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)

	const runs = 50
	var lat []time.Duration
	for i := range runs {
		cfg := e.podConfig(fmt.Sprintf("lat%d", i))
		start := time.Now()
		id := e.runPod(ctx, cfg)
		lat = append(lat, time.Since(start))
		e.stopRemove(ctx, t, id)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[runs/2], lat[runs*99/100]
	t.Logf("RunPodSandbox over %d sequential pods: p50 %v, p99 %v, min %v, max %v", runs, p50, p99, lat[0], lat[runs-1])
	e.logPhases(t)
	if p50 > 2*time.Second {
		t.Errorf("RunPodSandbox p50 %v is far beyond any sane bound", p50)
	}

	const pods = 20
	var ids []string
	var infos []podInfo
	for i := range pods {
		id := e.runPod(ctx, e.podConfig(fmt.Sprintf("mem%d", i)))
		_, info := e.status(ctx, id)
		ids = append(ids, id)
		infos = append(infos, info)
	}
	time.Sleep(500 * time.Millisecond)
	var shim, pause memUse
	for _, info := range infos {
		shim.add(readMem(t, info.ShimPid))
		pause.add(readMem(t, info.Pid))
	}
	server := readMem(t, e.cmd.Process.Pid)
	t.Logf("with %d pods, per pod: shim RSS %.2f MiB PSS %.2f MiB USS %.2f MiB; pause RSS %.2f MiB PSS %.2f MiB USS %.2f MiB",
		pods, shim.rss/pods, shim.pss/pods, shim.uss/pods, pause.rss/pods, pause.pss/pods, pause.uss/pods)
	t.Logf("criserver with %d pods: RSS %.2f MiB PSS %.2f MiB", pods, server.rss, server.pss)
	if shim.pss/pods > 30 {
		t.Errorf("shim PSS %.2f MiB per pod is beyond any sane bound", shim.pss/pods)
	}
	for _, id := range ids {
		e.stopRemove(ctx, t, id)
	}
	e.assertNodeClean(t)
}

// logPhases logs the median of each RunPodSandbox phase criserver logged at debug level.
func (e *env) logPhases(t *testing.T) {
	phases := map[string][]float64{}
	for _, line := range strings.Split(e.log(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec["msg"] != "pod sandbox created" && rec["msg"] != "shim started" {
			continue
		}
		for _, k := range []string{"netns", "cni", "shim", "bootstrap", "create_start"} {
			if v, ok := rec[k].(float64); ok {
				phases[k] = append(phases[k], v/1e6)
			}
		}
	}
	var parts []string
	for _, k := range []string{"netns", "cni", "shim", "bootstrap", "create_start"} {
		v := phases[k]
		if len(v) == 0 {
			continue
		}
		sort.Float64s(v)
		parts = append(parts, fmt.Sprintf("%s %.1fms", k, v[len(v)/2]))
	}
	t.Logf("RunPodSandbox phases, p50 (shim and cni run concurrently): %s", strings.Join(parts, ", "))
}

type memUse struct{ rss, pss, uss float64 }

func (m *memUse) add(o memUse) { m.rss += o.rss; m.pss += o.pss; m.uss += o.uss }

// readMem reads RSS, PSS and USS (private pages) of pid in MiB from smaps_rollup.
func readMem(t *testing.T, pid int) memUse {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatalf("read memory of %d: %v", pid, err)
	}
	defer f.Close()
	var m memUse
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		mib := kb / 1024
		switch fields[0] {
		case "Rss:":
			m.rss = mib
		case "Pss:":
			m.pss = mib
		case "Private_Clean:", "Private_Dirty:":
			m.uss += mib
		}
	}
	return m
}

// TestE2EContainerLatencyAndMemory measures CreateContainer+StartContainer over 50
// containers and the pod shim's memory with 1 and with 10 running containers.
func TestE2EContainerLatencyAndMemory(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("ctrlat")
	podID := e.runPod(ctx, pod)
	_, info := e.status(ctx, podID)

	const runs = 50
	var lat []time.Duration
	for i := range runs {
		start := time.Now()
		id := e.runCtr(ctx, podID, pod, ctrConfig(fmt.Sprintf("lat%d", i), img, "true"))
		lat = append(lat, time.Since(start))
		e.waitExit(ctx, id, 10*time.Second)
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("CreateContainer+StartContainer over %d: p50 %v, p99 %v", runs, lat[runs/2], lat[runs*99/100])

	for i := range 10 {
		e.runCtr(ctx, podID, pod, ctrConfig(fmt.Sprintf("mem%d", i), img, "sleep", "1000"))
		if i == 0 {
			time.Sleep(300 * time.Millisecond)
			m := readMem(t, info.ShimPid)
			t.Logf("shim with 1 container: RSS %.2f MiB PSS %.2f MiB USS %.2f MiB", m.rss, m.pss, m.uss)
		}
	}
	time.Sleep(300 * time.Millisecond)
	m := readMem(t, info.ShimPid)
	t.Logf("shim with 10 containers: RSS %.2f MiB PSS %.2f MiB USS %.2f MiB", m.rss, m.pss, m.uss)
	if m.pss > 64 {
		t.Errorf("shim PSS %.2f MiB with 10 containers is beyond any sane bound", m.pss)
	}
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}
