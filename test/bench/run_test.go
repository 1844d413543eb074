//go:build bench

package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runDensity starts n pods from 10 clients and measures the runtime with them: the
// start, the memory of everything it runs, its idle CPU, the lists (with one and with
// three containers a pod), and stopping and removing them all. It starts from no pods
// and leaves none.
func runDensity(ctx context.Context, t *testing.T, w *Workload, res Results, n int) error {
	d := w.D
	step := func(name string) { t.Logf("%s: density: %s", d.Name, name) }
	step(fmt.Sprintf("start %d pods, %d clients", n, clients))
	pods, starts, all, err := w.StartPods(ctx, "dens", n, clients)
	if err != nil {
		return fmt.Errorf("start %d pods: %w", n, err)
	}
	res.Ms("dens_start_all", all)
	res.Ms("dens_start_p50", Percentile(starts, 50))
	res.Ms("dens_start_p99", Percentile(starts, 99))

	time.Sleep(settle)
	procs, err := w.RuntimeProcs(ctx)
	if err != nil {
		return err
	}
	if len(procs.Pauses) != n {
		return fmt.Errorf("found %d sandbox processes, want %d", len(procs.Pauses), n)
	}
	daemon, err := ReadMem(procs.Daemon)
	if err != nil {
		return err
	}
	pods1, err := SumMem(append(append([]int(nil), procs.Shims...), procs.Pauses...))
	if err != nil {
		return err
	}
	total := daemon.Add(pods1)
	res["dens_mem_pss"], res["dens_mem_uss"] = total.PSS/1024, total.USS/1024
	res["dens_daemon_pss"] = daemon.PSS / 1024
	res["dens_pod_pss"], res["dens_pod_uss"] = pods1.PSS/1024/float64(n), pods1.USS/1024/float64(n)
	res["dens_shims"] = float64(len(procs.Shims))

	step(fmt.Sprintf("idle CPU over %v", *idleFor))
	cpu, err := IdleCPU(ctx, procs.All(), *idleFor)
	if err != nil {
		return fmt.Errorf("idle CPU: %w", err)
	}
	res["dens_idle_cpu"] = float64(cpu.Milliseconds()) * float64(time.Minute) / float64(*idleFor)

	lists := func(prefix string, ctrs int) error {
		step(fmt.Sprintf("%d calls of each list, %d pods, %d containers", *listCalls, n, ctrs))
		lt, err := w.ListTimes(ctx, *listCalls, n, ctrs)
		if err != nil {
			return err
		}
		for rpc, key := range map[string]string{ListPods: "list_pods", ListCtrs: "list_ctrs", ListCtrStats: "list_ctr_stats", ListPodStats: "list_pod_stats"} {
			if ds, ok := lt[rpc]; ok {
				res.Ms(prefix+key+"_p50", Percentile(ds, 50))
				res.Ms(prefix+key+"_p99", Percentile(ds, 99))
			} else {
				t.Logf("%s: %s is not implemented", d.Name, rpc)
			}
		}
		return nil
	}
	if err := lists("dens_", n); err != nil {
		return err
	}
	step("2 more containers a pod")
	if err := w.AddContainers(ctx, pods, clients); err != nil {
		return err
	}
	if err := lists("dens3_", 3*n); err != nil {
		return err
	}

	step(fmt.Sprintf("stop and remove %d pods, %d clients", n, clients))
	stop, err := w.StopPods(ctx, pods, clients)
	if err != nil {
		return err
	}
	res.Ms("dens_stop_all", stop)
	return nil
}

// soakWarm is the exec after which the soak reads the shim's memory a second time,
// past its warm-up.
const soakWarm = 100

// runSoak looks for memory that work leaves behind: in the shim after many execs, in
// the daemon after many pod cycles. It leaves no pods.
func runSoak(ctx context.Context, t *testing.T, w *Workload, res Results) error {
	d := w.D
	t.Logf("%s: soak: %d execs", d.Name, *soakExecs)
	pod, ctr, err := w.PodWithSleep(ctx, "soak")
	if err != nil {
		return err
	}
	first, warmed, last, err := w.ExecSoak(ctx, pod, ctr, *soakExecs, soakWarm)
	if err != nil {
		return err
	}
	res["soak_shim_pss_first"], res["soak_shim_pss_last"] = first.PSS/1024, last.PSS/1024
	res["soak_shim_growth"] = Growth(first.PSS, last.PSS)
	res["soak_shim_uss_growth"] = Growth(first.USS, last.USS)
	if warmed.PSS > 0 {
		res["soak_shim_pss_warm"] = warmed.PSS / 1024
		res["soak_shim_growth_warm"] = Growth(warmed.PSS, last.PSS)
		res["soak_shim_uss_growth_warm"] = Growth(warmed.USS, last.USS)
	}
	if _, err := d.RT.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		return err
	}
	if _, err := d.RT.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		return err
	}

	t.Logf("%s: soak: %d pod cycles, %d clients", d.Name, *soakCycles, clients)
	first, last, err = w.CycleSoak(ctx, *soakFirst, *soakCycles, clients)
	if err != nil {
		return err
	}
	res["soak_daemon_rss_first"], res["soak_daemon_rss_last"] = first.RSS/1024, last.RSS/1024
	res["soak_daemon_growth"] = Growth(first.RSS, last.RSS)
	return nil
}

// breakdown scrapes crisp's metrics and records the mean of each phase of a pod start
// and a container create, in ms.
func breakdown(ctx context.Context, d *Daemon, res Results) error {
	samples, err := Scrape(ctx, d.MetricsURL)
	if err != nil {
		return err
	}
	for key, h := range map[string]string{
		"phase_pod_start":  "crisp_pod_start_duration_seconds",
		"phase_ctr_create": "crisp_container_create_duration_seconds",
		"phase_ctr_start":  "crisp_container_start_duration_seconds",
	} {
		if n := samples[h+"_count"]; n > 0 {
			res[key] = samples[h+"_sum"] / n * 1000
		}
	}
	for _, h := range []string{PodStartPhases, CtrCreatePhases} {
		for phase, mean := range PhaseMeans(samples, h) {
			res["phase_"+phase] = mean * 1000
		}
	}
	return nil
}
