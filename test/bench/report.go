package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// Metric describes one figure of the report.
type Metric struct {
	Key  string
	Name string
	Unit string
	// HigherBetter is true for throughput.
	HigherBetter bool
	// Target is the crisp/containerd ratio to meet (≤ for lower-is-better figures,
	// ≥ for higher-is-better ones); 0 for figures reported without a target.
	Target float64
	// Limit is a bound on crisp's own figure (≤), for figures not compared with
	// containerd's (a soak's growth); 0 for none.
	Limit float64
	// CrispOnly marks figures only crisp reports (its pod start breakdown).
	CrispOnly bool
}

// Metrics are the report's rows, in order.
var Metrics = []Metric{
	{Key: "run_pod_p50", Name: "RunPodSandbox p50", Unit: "ms"},
	{Key: "run_pod_p99", Name: "RunPodSandbox p99", Unit: "ms"},
	{Key: "create_p50", Name: "CreateContainer p50", Unit: "ms"},
	{Key: "start_p50", Name: "StartContainer p50", Unit: "ms"},
	{Key: "create_start_p50", Name: "Create+StartContainer p50", Unit: "ms"},
	{Key: "stop_p50", Name: "StopContainer p50", Unit: "ms"},
	{Key: "stop_pod_p50", Name: "StopPodSandbox p50", Unit: "ms"},
	{Key: "remove_pod_p50", Name: "RemovePodSandbox p50", Unit: "ms"},
	{Key: "pod_start_p50", Name: "pod start (run+create+start) p50", Unit: "ms", Target: 0.5},
	{Key: "cycle_p50", Name: "whole pod cycle p50", Unit: "ms", Target: 0.5},
	{Key: "cycle_p90", Name: "whole pod cycle p90", Unit: "ms"},
	{Key: "cycle_p99", Name: "whole pod cycle p99", Unit: "ms", Target: 0.5},
	{Key: "churn", Name: "churn, 10 clients", Unit: "cycles/s", HigherBetter: true, Target: 2},
	{Key: "pod_pss", Name: "per pod PSS (shim+pause)", Unit: "MiB", Target: 0.5},
	{Key: "pod_uss", Name: "per pod USS (shim+pause)", Unit: "MiB", Target: 0.6},
	{Key: "pod_rss", Name: "per pod RSS (shim+pause, ref.)", Unit: "MiB"},
	{Key: "shim_pss", Name: "  shim PSS", Unit: "MiB"},
	{Key: "shim_uss", Name: "  shim USS", Unit: "MiB"},
	{Key: "pause_pss", Name: "  pause PSS", Unit: "MiB"},
	{Key: "daemon_rss_idle", Name: "daemon RSS idle", Unit: "MiB"},
	{Key: "daemon_rss_20", Name: "daemon RSS with 20 pods", Unit: "MiB", Target: 0.5},
	{Key: "daemon_anon_20", Name: "  of which anonymous", Unit: "MiB"},
	{Key: "version_p50", Name: "Version p50 (gRPC floor)", Unit: "ms"},
	{Key: "list_pods_p50", Name: "ListPodSandbox p50 (100 pods)", Unit: "ms", Target: 0.5},
	{Key: "list_ctrs_p50", Name: "ListContainers p50 (200 ctrs)", Unit: "ms", Target: 0.5},
	{Key: "pull", Name: "pull+unpack 50 MB, 5 layers", Unit: "ms"},
	{Key: "exec_p50", Name: "ExecSync echo p50", Unit: "ms"},
	{Key: "exec_p99", Name: "ExecSync echo p99", Unit: "ms"},

	// -density N: N pods of one container each, started by 10 clients.
	{Key: "dens_start_all", Name: "density: start all N pods", Unit: "ms", Target: 0.5},
	{Key: "dens_start_p50", Name: "density: pod start p50", Unit: "ms", Target: 0.5},
	{Key: "dens_start_p99", Name: "density: pod start p99", Unit: "ms", Target: 0.5},
	{Key: "dens_mem_pss", Name: "density: runtime PSS (daemon+shims+pause)", Unit: "MiB", Target: 0.5},
	{Key: "dens_mem_uss", Name: "density: runtime USS (daemon+shims+pause)", Unit: "MiB", Target: 0.5},
	{Key: "dens_daemon_pss", Name: "  daemon PSS", Unit: "MiB"},
	{Key: "dens_pod_pss", Name: "density: per pod PSS (shim+pause)", Unit: "MiB", Target: 0.5},
	{Key: "dens_pod_uss", Name: "density: per pod USS (shim+pause)", Unit: "MiB", Target: 0.5},
	{Key: "dens_shims", Name: "  shim processes", Unit: "count"},
	{Key: "dens_idle_cpu", Name: "density: idle CPU (daemon+shims+pause)", Unit: "ms/60s", Target: 0.5},
	{Key: "dens_list_pods_p50", Name: "density: ListPodSandbox p50", Unit: "ms", Target: 0.5},
	{Key: "dens_list_pods_p99", Name: "density: ListPodSandbox p99", Unit: "ms", Target: 0.5},
	{Key: "dens_list_ctrs_p50", Name: "density: ListContainers p50 (N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens_list_ctrs_p99", Name: "density: ListContainers p99 (N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens_list_ctr_stats_p50", Name: "density: ListContainerStats p50 (N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens_list_ctr_stats_p99", Name: "density: ListContainerStats p99 (N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens_list_pod_stats_p50", Name: "density: ListPodSandboxStats p50", Unit: "ms", Target: 0.5},
	{Key: "dens_list_pod_stats_p99", Name: "density: ListPodSandboxStats p99", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_pods_p50", Name: "density: ListPodSandbox p50 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_pods_p99", Name: "density: ListPodSandbox p99 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_ctrs_p50", Name: "density: ListContainers p50 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_ctrs_p99", Name: "density: ListContainers p99 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_ctr_stats_p50", Name: "density: ListContainerStats p50 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_ctr_stats_p99", Name: "density: ListContainerStats p99 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_pod_stats_p50", Name: "density: ListPodSandboxStats p50 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens3_list_pod_stats_p99", Name: "density: ListPodSandboxStats p99 (3N ctrs)", Unit: "ms", Target: 0.5},
	{Key: "dens_stop_all", Name: "density: stop+remove all N pods (3N ctrs)", Unit: "ms", Target: 0.5},

	// -soak.
	{Key: "soak_shim_pss_first", Name: "soak: shim PSS after 1st exec", Unit: "MiB"},
	{Key: "soak_shim_pss_warm", Name: "soak: shim PSS after 100th exec", Unit: "MiB"},
	{Key: "soak_shim_pss_last", Name: "soak: shim PSS after last exec", Unit: "MiB"},
	{Key: "soak_shim_growth", Name: "soak: shim PSS growth, 1st to last", Unit: "%", Limit: 5},
	{Key: "soak_shim_growth_warm", Name: "soak: shim PSS growth, 100th to last", Unit: "%"},
	// PSS moves with whatever else maps the shim's binary; USS is the shim's alone.
	{Key: "soak_shim_uss_growth", Name: "soak: shim USS growth, 1st to last", Unit: "%"},
	{Key: "soak_shim_uss_growth_warm", Name: "soak: shim USS growth, 100th to last", Unit: "%"},
	{Key: "soak_daemon_rss_first", Name: "soak: daemon RSS after first cycles", Unit: "MiB"},
	{Key: "soak_daemon_rss_last", Name: "soak: daemon RSS after all cycles", Unit: "MiB"},
	{Key: "soak_daemon_growth", Name: "soak: daemon RSS growth", Unit: "%", Limit: 5},

	// crisp's pod start breakdown: the means of its phase histograms.
	{Key: "phase_pod_start", Name: "breakdown: RunPodSandbox (mean)", Unit: "ms", CrispOnly: true},
	{Key: "phase_netns", Name: "  netns", Unit: "ms", CrispOnly: true},
	{Key: "phase_cni", Name: "  cni (concurrent with shim)", Unit: "ms", CrispOnly: true},
	{Key: "phase_shim_start", Name: "  shim_start", Unit: "ms", CrispOnly: true},
	{Key: "phase_sandbox_start", Name: "  sandbox_start", Unit: "ms", CrispOnly: true},
	{Key: "phase_create_sandbox", Name: "    create_sandbox", Unit: "ms", CrispOnly: true},
	{Key: "phase_start_sandbox", Name: "    start_sandbox", Unit: "ms", CrispOnly: true},
	{Key: "phase_pod_files", Name: "  pod_files", Unit: "ms", CrispOnly: true},
	{Key: "phase_ctr_create", Name: "breakdown: CreateContainer (mean)", Unit: "ms", CrispOnly: true},
	{Key: "phase_snapshot", Name: "  snapshot", Unit: "ms", CrispOnly: true},
	{Key: "phase_user_lookup", Name: "  user_lookup", Unit: "ms", CrispOnly: true},
	{Key: "phase_spec", Name: "  spec", Unit: "ms", CrispOnly: true},
	{Key: "phase_task_create", Name: "  task_create", Unit: "ms", CrispOnly: true},
	{Key: "phase_ctr_start", Name: "breakdown: StartContainer (mean)", Unit: "ms", CrispOnly: true},

	// crisp's own shim against containerd's runc shim as a task-only runtime handler,
	// interleaved cycles in one criserver (-task-shim).
	{Key: "task_own_pod_start_p50", Name: "task shim: pod start p50, crisp's shim", Unit: "ms", CrispOnly: true},
	{Key: "task_pod_start_p50", Name: "task shim: pod start p50, runc v2 shim", Unit: "ms", CrispOnly: true},
	{Key: "task_own_pod_start_p99", Name: "task shim: pod start p99, crisp's shim", Unit: "ms", CrispOnly: true},
	{Key: "task_pod_start_p99", Name: "task shim: pod start p99, runc v2 shim", Unit: "ms", CrispOnly: true},
	{Key: "task_own_run_pod_p50", Name: "task shim: RunPodSandbox p50, crisp's shim", Unit: "ms", CrispOnly: true},
	{Key: "task_run_pod_p50", Name: "task shim: RunPodSandbox p50, runc v2 shim", Unit: "ms", CrispOnly: true},
	{Key: "task_own_cycle_p50", Name: "task shim: pod cycle p50, crisp's shim", Unit: "ms", CrispOnly: true},
	{Key: "task_cycle_p50", Name: "task shim: pod cycle p50, runc v2 shim", Unit: "ms", CrispOnly: true},
	{Key: "task_spare_pod_start_p50", Name: "task shim: pod start p50, runc v2 with warm spare", Unit: "ms", CrispOnly: true},
	{Key: "task_spare_pod_start_p99", Name: "task shim: pod start p99, runc v2 with warm spare", Unit: "ms", CrispOnly: true},
	{Key: "task_spare_run_pod_p50", Name: "task shim: RunPodSandbox p50, runc v2 with warm spare", Unit: "ms", CrispOnly: true},
	{Key: "task_spare_cycle_p50", Name: "task shim: pod cycle p50, runc v2 with warm spare", Unit: "ms", CrispOnly: true},
}

// Results are one runtime's figures by metric key.
type Results map[string]float64

// Ms stores a duration in milliseconds.
func (r Results) Ms(key string, d time.Duration) { r[key] = float64(d.Microseconds()) / 1000 }

// Report is one benchmark run.
type Report struct {
	Time     time.Time          `json:"time"`
	Host     string             `json:"host"`
	Versions map[string]string  `json:"versions"`
	Runtimes map[string]Results `json:"runtimes"`
	Notes    []string           `json:"notes,omitempty"`
	// Pull is the pull benchmark's part, when it ran.
	Pull *PullReport `json:"pull,omitempty"`
}

// Ratio is crisp's figure over containerd's; NaN when either is missing or zero.
func (r *Report) Ratio(key string) float64 {
	c, ok1 := r.Runtimes["crisp"][key]
	d, ok2 := r.Runtimes["containerd"][key]
	if !ok1 || !ok2 || d == 0 {
		return math.NaN()
	}
	return c / d
}

// Met says whether a metric meets its target or limit; ok is false without a target
// or data.
func (r *Report) Met(m Metric) (met, ok bool) {
	if m.Limit != 0 {
		v, has := r.Runtimes["crisp"][m.Key]
		return v <= m.Limit, has
	}
	ratio := r.Ratio(m.Key)
	if m.Target == 0 || math.IsNaN(ratio) {
		return false, false
	}
	if m.HigherBetter {
		return ratio >= m.Target, true
	}
	return ratio <= m.Target, true
}

// WriteTable prints the report as one table; rows no runtime has a figure for are
// left out (the parts of the benchmark that did not run).
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "metric\tunit\tcontainerd\tcrisp\tcrisp/containerd\ttarget\t")
	for _, m := range Metrics {
		_, c1 := r.Runtimes["containerd"][m.Key]
		_, c2 := r.Runtimes["crisp"][m.Key]
		if !c1 && !c2 {
			continue
		}
		target := ""
		if met, ok := r.Met(m); ok {
			op, bound := "≤", m.Target
			switch {
			case m.Limit != 0:
				bound = m.Limit
			case m.HigherBetter:
				op = "≥"
			}
			verdict := "met"
			if !met {
				verdict = "MISSED"
			}
			target = fmt.Sprintf("%s%.1f %s", op, bound, verdict)
		}
		rat := ratio(r.Ratio(m.Key))
		if m.Limit != 0 || m.CrispOnly {
			rat = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Name, m.Unit,
			num(r.Runtimes["containerd"], m.Key, m.Unit), num(r.Runtimes["crisp"], m.Key, m.Unit), rat, target)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if res, ok := r.Runtimes["crisp"]; ok && res["nri_cycles"] > 0 {
		fmt.Fprintln(w)
		if err := WriteNRITable(w, res); err != nil {
			return err
		}
	}
	if res, ok := r.Runtimes["crisp"]; ok && res["tracing_cycles"] > 0 {
		fmt.Fprintln(w)
		if err := WriteTracingTable(w, res); err != nil {
			return err
		}
	}
	if res, ok := r.Runtimes["crisp"]; ok && res["wasm_cycles"] > 0 {
		fmt.Fprintln(w)
		if err := WriteWasmTable(w, res); err != nil {
			return err
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

func num(r Results, key, unit string) string {
	v, ok := r[key]
	if !ok {
		return "-"
	}
	switch {
	case unit == "count":
		return fmt.Sprintf("%.0f", v)
	case v >= 100 || v <= -100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10 || v <= -10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func ratio(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// Save writes the report as JSON into dir, named by its time, and returns the path.
func (r *Report) Save(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	name := "bench-" + strings.ReplaceAll(r.Time.UTC().Format("20060102T150405Z"), ":", "") + ".json"
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}
