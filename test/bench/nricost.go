package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/crisp-runtime/crisp/internal/nri/nritest"
)

// NRIVariants are the three crisps of the NRI comparison (-nri), in the order of
// the cycles a round starts from: the key names their figures (nri_<key>_<figure>).
var NRIVariants = []struct{ Key, Name string }{
	{"off", "NRI disabled"},
	{"none", "NRI enabled, no plugin"},
	{"noop", "NRI enabled, one no-op plugin"},
}

// cycleFigures are the figures of each variant of an interleaved comparison (NRI's,
// tracing's), by key and name.
var cycleFigures = []struct {
	Key, Name string
	Of        func([]CycleTimes) time.Duration
}{
	{"cycle_p50", "pod cycle p50", func(cs []CycleTimes) time.Duration { return Percentile(pickTimes(cs, CycleTimes.Total), 50) }},
	{"cycle_p99", "pod cycle p99", func(cs []CycleTimes) time.Duration { return Percentile(pickTimes(cs, CycleTimes.Total), 99) }},
	{"pod_start_p50", "pod start p50", func(cs []CycleTimes) time.Duration { return Percentile(pickTimes(cs, CycleTimes.PodStart), 50) }},
}

// NRIResults stores the NRI comparison in res: the cycles each variant ran (runs[i]
// is NRIVariants[i]'s, all interleaved: runs[i][r] ran in round r), each variant's
// figures, and two measures of noise. One is how far apart the disabled crisp's
// figures are between its even and its odd rounds: two halves of the same runtime on
// the same machine, so a variant's difference from the disabled one within it is no
// difference (conservative, since each half has half the cycles, but one draw, so
// itself noisy). The other is, for each difference, its 95 % bootstrap interval:
// the 2.5th and 97.5th percentiles of the difference over resamplings of the rounds
// (a round's cycles stay together, since they ran side by side).
func NRIResults(res Results, runs [][]CycleTimes) error {
	if len(runs) != len(NRIVariants) {
		return fmt.Errorf("NRI comparison: %d runs for %d variants", len(runs), len(NRIVariants))
	}
	for i, cs := range runs {
		if len(cs) < 2 || len(cs) != len(runs[0]) {
			return fmt.Errorf("NRI comparison: %s ran %d cycles, %s %d; want the same number, at least 2",
				NRIVariants[i].Name, len(cs), NRIVariants[0].Name, len(runs[0]))
		}
	}
	var even, odd []CycleTimes
	for i, c := range runs[0] {
		if i%2 == 0 {
			even = append(even, c)
		} else {
			odd = append(odd, c)
		}
	}
	res["nri_cycles"] = float64(len(runs[0]))
	// A fixed seed: the same cycles give the same report.
	rng := rand.New(rand.NewPCG(24, 24))
	for _, f := range cycleFigures {
		for i, v := range NRIVariants {
			res.Ms("nri_"+v.Key+"_"+f.Key, f.Of(runs[i]))
			if i > 0 {
				lo, hi := deltaCI(runs[0], runs[i], f.Of, rng)
				res.Ms("nri_"+v.Key+"_"+f.Key+"_lo", lo)
				res.Ms("nri_"+v.Key+"_"+f.Key+"_hi", hi)
			}
		}
		res.Ms("nri_noise_"+f.Key, (f.Of(even) - f.Of(odd)).Abs())
	}
	return nil
}

// bootstraps is how many resamplings deltaCI makes.
const bootstraps = 1000

// deltaCI is the 95 % interval of of(v) − of(off) over resamplings (with
// replacement) of the rounds, off[r] and v[r] having run in the same round r.
func deltaCI(off, v []CycleTimes, of func([]CycleTimes) time.Duration, rng *rand.Rand) (lo, hi time.Duration) {
	ds := make([]time.Duration, bootstraps)
	a, b := make([]CycleTimes, len(off)), make([]CycleTimes, len(off))
	for k := range ds {
		for j := range a {
			r := rng.IntN(len(off))
			a[j], b[j] = off[r], v[r]
		}
		ds[k] = of(b) - of(a)
	}
	return Percentile(ds, 2.5), Percentile(ds, 97.5)
}

// WriteNRITable prints the NRI comparison NRIResults stored in res, each variant's
// figures and their difference from the disabled crisp's, and the noise; nothing when
// res has none.
func WriteNRITable(w io.Writer, res Results) error {
	n, ok := res["nri_cycles"]
	if !ok {
		return nil
	}
	fmt.Fprintf(w, "NRI cost: crisp three ways, %.0f pod cycles each, interleaved (ms; Δ against NRI disabled, with its 95 %% bootstrap interval)\n", n)
	rows := make([]cycleRow, len(NRIVariants))
	for i, v := range NRIVariants {
		rows[i] = cycleRow{Key: v.Key, Name: v.Name}
		if i > 0 {
			rows[i].Ref = NRIVariants[0].Key
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	writeCycleRows(tw, res, "nri_", rows, cycleCols())
	writeNoiseRow(tw, res, "disabled", "nri_noise_", cycleCols())
	if err := tw.Flush(); err != nil {
		return err
	}
	if ev, ok := res["nri_noop_events"]; ok {
		fmt.Fprintf(w, "the no-op plugin answered %.1f events a timed cycle\n", ev)
	}
	return nil
}

// cycleRow is one variant's row of a comparison table: its figures are keyed
// <prefix><Key>_<figure>, its differences against those of variant Ref ("" for none).
type cycleRow struct{ Key, Name, Ref string }

// figureCol is a column of a comparison table: the figure's key and its name.
type figureCol struct{ Key, Name string }

// cycleCols are the columns of cycleFigures.
func cycleCols() []figureCol {
	out := make([]figureCol, len(cycleFigures))
	for i, f := range cycleFigures {
		out[i] = figureCol{f.Key, f.Name}
	}
	return out
}

// writeCycleRows writes the header and a row per variant of a comparison of pod
// cycles: each figure of cols (in ms), its difference from the reference's and its
// interval.
func writeCycleRows(tw io.Writer, res Results, prefix string, rows []cycleRow, cols []figureCol) {
	fmt.Fprint(tw, "\t")
	for _, f := range cols {
		fmt.Fprintf(tw, "%s\tΔ\t95%% interval\t", f.Name)
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t", r.Name)
		for _, f := range cols {
			key := prefix + r.Key + "_" + f.Key
			delta, interval := "-", "-"
			if r.Ref != "" {
				delta = signed(res[key] - res[prefix+r.Ref+"_"+f.Key])
				interval = signed(res[key+"_lo"]) + ".." + signed(res[key+"_hi"])
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t", num(res, key, "ms"), delta, interval)
		}
		fmt.Fprintln(tw)
	}
}

// writeNoiseRow writes a row of the noise (even against odd rounds) of the figures
// of cols, keyed <key><figure>, under writeCycleRows' Δ columns.
func writeNoiseRow(tw io.Writer, res Results, label, key string, cols []figureCol) {
	fmt.Fprintf(tw, "noise: %s, even vs odd rounds\t", label)
	for _, f := range cols {
		fmt.Fprintf(tw, "\t±%s\t\t", num(res, key+f.Key, "ms"))
	}
	fmt.Fprintln(tw)
}

// signed is a difference with its sign, as num writes numbers.
func signed(v float64) string {
	s := num(Results{"v": v}, "v", "ms")
	if v >= 0 {
		s = "+" + s
	}
	return s
}

// NoopPlugin is an NRI plugin (for pkg/stub) that subscribes to every event a
// plugin can, answers each without an adjustment or an update, and records it (so
// that the bench can tell it was called). The Recorder's record is all it does: what
// it costs is what NRI's round trips to a plugin cost.
type NoopPlugin struct {
	nritest.Recorder
	synced chan struct{}
	once   sync.Once
}

// Synchronize tells ConnectNoopPlugin that crisp registered the plugin.
func (p *NoopPlugin) Synchronize(context.Context, []*api.PodSandbox, []*api.Container) ([]*api.ContainerUpdate, error) {
	p.once.Do(func() { close(p.synced) })
	return nil, nil
}

// UpdatePodSandbox records the event.
func (p *NoopPlugin) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, _, _ *api.LinuxResources) error {
	p.Record("UpdatePodSandbox " + pod.GetName())
	return nil
}

// CreateContainer records the event and adjusts nothing.
func (p *NoopPlugin) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.Record("CreateContainer " + c.GetName())
	return nil, nil, nil
}

// ValidateContainerAdjustment records the event and accepts the adjustment.
func (p *NoopPlugin) ValidateContainerAdjustment(_ context.Context, req *api.ValidateContainerAdjustmentRequest) error {
	p.Record("ValidateContainerAdjustment " + req.GetContainer().GetName())
	return nil
}

// ConnectNoopPlugin connects a NoopPlugin to the NRI socket and returns it once crisp
// synchronized it, with the function that disconnects it.
func ConnectNoopPlugin(ctx context.Context, socket string) (*NoopPlugin, func(), error) {
	p := &NoopPlugin{synced: make(chan struct{})}
	st, err := stub.New(p, stub.WithSocketPath(socket), stub.WithPluginName("bench-noop"), stub.WithPluginIdx("50"))
	if err != nil {
		return nil, nil, fmt.Errorf("NRI plugin: %w", err)
	}
	// The stub serves the plugin's handlers under this context, beyond this call.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := func() { st.Stop(); cancel() }
	if err := st.Start(sctx); err != nil {
		cancel()
		return nil, nil, fmt.Errorf("start NRI plugin on %s: %w", socket, err)
	}
	select {
	case <-p.synced:
	case <-time.After(10 * time.Second):
		stop()
		return nil, nil, fmt.Errorf("NRI plugin on %s: not synchronized in 10 s", socket)
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
	return p, stop, nil
}
