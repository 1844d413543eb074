//go:build bench

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/tracing/otlptest"
)

// tracingMemPods is how many pods each variant runs for the shims' memory: enough for
// a mean whose interval tells a few tens of KiB, few enough to take seconds.
const tracingMemPods = 10

// tracingMemExecs is how many traced ExecSyncs each memory pod's container gets, so
// that each shim has served traced calls after its start (its recorder's buffer and
// relay connection exist) as a shim does after a few of kubelet's probes.
const tracingMemExecs = 3

// cycleCalls is how many CRI calls a pod cycle makes (Workload.Cycle).
const cycleCalls = 6

// runTracingCost starts the crisps of TracingVariants at once — base (the binaries of
// -base-bin, before tracing existed) when given, today's with tracing off, and
// today's with tracing on exporting to an OTLP receiver in this process — and runs
// -cycles pod cycles on each, interleaved round by round with the order rotating, as
// runNRICost does and for the same reasons. Every call of a cycle carries a new
// sampled traceparent on every variant, as kubelet with tracing sends it whatever
// the runtime does with it: the variants get the same requests, and only the one
// with tracing on makes spans of them. The receiver must then hold each traced
// cycle's trace (else the run fails: a figure of nothing traced means nothing).
// Then, one variant at a time, tracingMemPods pods with traced calls for the shims'
// memory. It stores TracingResults and the memory figures in res, the versions of
// the binaries in versions, and leaves nothing behind.
func runTracingCost(ctx context.Context, t *testing.T, root string, tmpl Spec, busybox string, res Results, versions map[string]string) error {
	rcv, err := otlptest.Start()
	if err != nil {
		return fmt.Errorf("OTLP receiver: %w", err)
	}
	// Deferred first, so closed last: the daemons flush their last spans to it as
	// they stop.
	defer rcv.Close()

	keys := []string{"base", "off", "on"}
	if *baseBin == "" {
		t.Log("tracing cost: no -base-bin, so no base variant (crisp before tracing): only tracing off against on")
		keys = keys[1:]
	} else {
		for _, b := range []string{"criserver", "shim-runc"} {
			if _, err := os.Stat(filepath.Join(*baseBin, b)); err != nil {
				return fmt.Errorf("-base-bin: %w", err)
			}
		}
	}
	var ws []*Workload
	for i, key := range keys {
		spec := tmpl
		spec.Name = "crisp-tr-" + key
		spec.Dir = filepath.Join(root, "tr-"+key)
		spec.Bridge = fmt.Sprintf("benchtr%d%s", *instance, key)
		// The NRI comparison's subnets: its crisps are gone by now.
		spec.Subnet = nriSubnet(*instance, i)
		spec.CgroupParent = "/bench-tr-" + key
		if *instance != 0 {
			spec.CgroupParent += fmt.Sprint(*instance)
		}
		switch key {
		case "base":
			spec.Bin = *baseBin
		case "on":
			spec.TracingEndpoint = rcv.GRPCAddr
		}
		if err := os.MkdirAll(spec.Dir, 0o711); err != nil {
			return err
		}
		d, stop, err := startRuntime(ctx, t, StartCrisp, spec)
		defer stop()
		if err != nil {
			return fmt.Errorf("%s: %w", spec.Name, err)
		}
		if v, err := d.RT.Version(ctx, &cri.VersionRequest{}); err == nil {
			t.Logf("tracing cost: %s is %s %s (%s)", key, v.RuntimeName, v.RuntimeVersion, spec.Bin)
			if key == "base" {
				versions["crisp-base"] = v.RuntimeName + " " + v.RuntimeVersion
			}
		}
		ws = append(ws, &Workload{D: d, Image: busybox})
	}

	// cycle runs one traced pod cycle on variant i and returns its trace's id.
	cycle := func(i int) (CycleTimes, string, error) {
		tctx, id := TraceContext(ctx)
		c, err := ws[i].Cycle(tctx)
		if err != nil {
			err = fmt.Errorf("tracing %s: %w", keys[i], err)
		}
		return c, id, err
	}
	for i, w := range ws {
		if _, err := w.Pull(ctx, busybox); err != nil {
			return fmt.Errorf("tracing %s: %w", keys[i], err)
		}
		for range 3 { // warm-up: caches, the first CNI run, the exporter's connection
			if _, _, err := cycle(i); err != nil {
				return err
			}
		}
	}
	warm, err := daemonMem(ws)
	if err != nil {
		return err
	}

	t.Logf("tracing cost: %d traced pod cycles on each of %d crisps (%v), interleaved", *cycles, len(ws), keys)
	on := len(ws) - 1
	// criserver's own CPU over the rounds: tracing's work in it (spans, the batch
	// exporter, the relay) without the wall clock's noise from whatever else runs.
	cpu0 := make([]time.Duration, len(ws))
	for i, w := range ws {
		if cpu0[i], err = CPUTime(w.D.Pid()); err != nil {
			return err
		}
	}
	runs := make([][]CycleTimes, len(ws))
	var traced []string
	for r := range *cycles {
		for k := range ws {
			i := (r + k) % len(ws)
			c, id, err := cycle(i)
			if err != nil {
				return err
			}
			runs[i] = append(runs[i], c)
			if i == on {
				traced = append(traced, id)
			}
		}
	}
	if err := TracingResults(res, keys, runs); err != nil {
		return err
	}
	for i, w := range ws {
		c, err := CPUTime(w.D.Pid())
		if err != nil {
			return err
		}
		res.Ms("tracing_"+keys[i]+"_daemon_cpu_cycle", (c-cpu0[i])/time.Duration(*cycles))
	}

	// criserver exports every 5 s: wait until the traces stop growing.
	counts, err := waitSpans(ctx, rcv, traced)
	if err != nil {
		return err
	}
	if err := TracedSpans(res, counts, cycleCalls); err != nil {
		return fmt.Errorf("tracing on: %w\n%s", err, ws[on].D.LogTail())
	}
	sample := rcv.Trace(traced[len(traced)-1])
	t.Logf("tracing cost: %.1f spans a traced cycle (%.1f from the shim), fewest %.0f; the last cycle's trace:\n%s",
		res["tracing_spans_per_cycle"], res["tracing_shim_spans_per_cycle"], res["tracing_spans_fewest"], otlptest.Tree(sample))
	after, err := daemonMem(ws)
	if err != nil {
		return err
	}

	// The shims' memory, one variant at a time: every variant's pods alone on the
	// machine, the shim binary's pages shared by as many processes in each.
	shims := map[string][]Mem{}
	for i, w := range ws {
		t.Logf("tracing cost: %s: %d pods with traced calls for the shims' memory", keys[i], tracingMemPods)
		ms, gos, err := tracedShimMem(ctx, w)
		if err != nil {
			return fmt.Errorf("tracing %s: %w", keys[i], err)
		}
		shims[keys[i]] = ms
		TracingMem(res, keys[i], ms, warm[i].mem, after[i].mem, warm[i].anon, after[i].anon)
		TracingGoMem(res, keys[i], gos)
		if err := w.RemoveAll(ctx, clients); err != nil {
			return fmt.Errorf("tracing %s: remove the memory pods: %w", keys[i], err)
		}
	}
	return TracingMemDeltas(res, keys, shims)
}

// daemonReading is a criserver's memory at one point: smaps_rollup and RssAnon
// (KiB).
type daemonReading struct {
	mem  Mem
	anon float64
}

// daemonMem reads each workload's criserver after settle.
func daemonMem(ws []*Workload) ([]daemonReading, error) {
	time.Sleep(settle)
	out := make([]daemonReading, len(ws))
	for i, w := range ws {
		m, err := ReadMem(w.D.Pid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.D.Name, err)
		}
		a, err := RssAnon(w.D.Pid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.D.Name, err)
		}
		out[i] = daemonReading{m, a}
	}
	return out, nil
}

// waitSpans waits until the receiver's count of the traces ids stops growing for
// longer than criserver's export interval (or tracingSpanWait passes), and returns
// the counts.
func waitSpans(ctx context.Context, rcv *otlptest.Receiver, ids []string) (map[string]TraceCount, error) {
	total := func(cs map[string]TraceCount) int {
		n := 0
		for _, c := range cs {
			n += c.Spans
		}
		return n
	}
	deadline := time.Now().Add(tracingSpanWait)
	counts := CountTraces(rcv.Spans(), ids, "crisp-shim")
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return counts, ctx.Err()
		case <-time.After(6 * time.Second):
		}
		next := CountTraces(rcv.Spans(), ids, "crisp-shim")
		if n := total(next); n > 0 && n == total(counts) {
			return next, nil
		}
		counts = next
	}
	return counts, nil
}

// tracedShimMem runs tracingMemPods pods with a `sleep` each, every call of a pod
// (its start, tracingMemExecs ExecSyncs) in a trace of its own, and returns each
// pod's shim's memory after settle (longer than a shim's batch delay, so its spans
// are sent and its buffer is back to what it keeps), with the Go runtime's classes
// the shim reports in its verbose status (the untraced status call that finds the
// shim's pid, as the base run's memory figures are found).
func tracedShimMem(ctx context.Context, w *Workload) (mems []Mem, gos []map[string]float64, err error) {
	for i := range tracingMemPods {
		tctx, _ := TraceContext(ctx)
		_, cid, err := w.PodWithSleep(tctx, fmt.Sprintf("trmem%d", i))
		if err != nil {
			return nil, nil, err
		}
		for range tracingMemExecs {
			r, err := w.D.RT.ExecSync(tctx, &cri.ExecSyncRequest{ContainerId: cid, Cmd: []string{"true"}, Timeout: 10})
			if err != nil {
				return nil, nil, fmt.Errorf("exec: %w", err)
			}
			if r.ExitCode != 0 {
				return nil, nil, fmt.Errorf("exec true: exit %d, stderr %q", r.ExitCode, r.Stderr)
			}
		}
	}
	time.Sleep(settle)
	pods, err := w.D.RT.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, nil, err
	}
	if len(pods.Items) != tracingMemPods {
		return nil, nil, fmt.Errorf("found %d pods, want %d", len(pods.Items), tracingMemPods)
	}
	for _, p := range pods.Items {
		st, err := w.D.RT.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.Id, Verbose: true})
		if err != nil {
			return nil, nil, err
		}
		info := st.GetInfo()["info"]
		pid, err := sandboxPid(info)
		if err != nil {
			return nil, nil, err
		}
		shim, err := PPid(pid)
		if err != nil {
			return nil, nil, err
		}
		m, err := ReadMem(shim)
		if err != nil {
			return nil, nil, fmt.Errorf("memory of shim %d: %w", shim, err)
		}
		g, err := ShimGoMem(info)
		if err != nil {
			return nil, nil, fmt.Errorf("shim %d: %w", shim, err)
		}
		mems, gos = append(mems, m), append(gos, g)
	}
	return mems, gos, nil
}
