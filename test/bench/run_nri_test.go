//go:build bench

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// nriSubnet is the pod subnet of the NRI comparison's crisp i: a quarter of the
// instance's crisp subnet, which is free by then (the crisp run is torn down first).
func nriSubnet(instance, i int) string {
	var a, b int
	if _, err := fmt.Sscanf(subnet(instance, 1), "10.%d.%d.", &a, &b); err != nil {
		panic(err) // subnet's own format
	}
	return fmt.Sprintf("10.%d.%d.0/18", a, 64*i)
}

// runNRICost starts three crisps that differ only in NRI (NRIVariants: disabled,
// enabled with no plugin, enabled with a NoopPlugin connected from this process),
// and runs -cycles pod cycles on each, interleaved round by round with the order
// rotating each round, so that the machine's drift and whatever else runs on it weigh
// on all three alike. Three daemons at once rather than one restarted with each
// config: a restart between blocks would put minutes between the variants' cycles,
// and drift between them would read as NRI's cost. It stores NRIResults in res and
// leaves nothing behind.
func runNRICost(ctx context.Context, t *testing.T, root string, tmpl Spec, busybox string, res Results) (version string, err error) {
	var ws []*Workload
	for i, v := range NRIVariants {
		spec := tmpl
		spec.Name = "crisp-nri-" + v.Key
		spec.Dir = filepath.Join(root, "nri-"+v.Key)
		spec.Bridge = fmt.Sprintf("benchnri%d%s", *instance, v.Key)
		spec.Subnet = nriSubnet(*instance, i)
		spec.CgroupParent = "/bench-nri-" + v.Key
		if *instance != 0 {
			spec.CgroupParent += fmt.Sprint(*instance)
		}
		spec.NRI = v.Key != "off"
		if err := os.MkdirAll(spec.Dir, 0o711); err != nil {
			return "", err
		}
		d, stop, err := startRuntime(ctx, t, StartCrisp, spec)
		defer stop()
		if err != nil {
			return "", fmt.Errorf("%s: %w", spec.Name, err)
		}
		ws = append(ws, &Workload{D: d, Image: busybox})
	}
	if v, err := ws[0].D.RT.Version(ctx, &cri.VersionRequest{}); err == nil {
		version = v.RuntimeName + " " + v.RuntimeVersion
	}
	noop := ws[len(ws)-1].D
	plugin, stop, err := ConnectNoopPlugin(ctx, noop.NRISocket)
	if err != nil {
		return version, fmt.Errorf("%w\n%s", err, noop.LogTail())
	}
	// Before the daemons' teardown (deferred earlier, so run later): a plugin whose
	// runtime goes first only logs its lost connection.
	defer stop()

	for i, w := range ws {
		if _, err := w.Pull(ctx, busybox); err != nil {
			return version, fmt.Errorf("%s: %w", NRIVariants[i].Name, err)
		}
		if _, err := w.Cycles(ctx, 3); err != nil { // warm-up: caches, first CNI run, the plugin's first calls
			return version, fmt.Errorf("%s: %w", NRIVariants[i].Name, err)
		}
	}
	t.Logf("NRI cost: %d pod cycles on each of %d crisps, interleaved", *cycles, len(ws))
	before := len(plugin.Events())
	runs := make([][]CycleTimes, len(ws))
	for r := range *cycles {
		for k := range ws {
			i := (r + k) % len(ws)
			c, err := ws[i].Cycle(ctx)
			if err != nil {
				return version, fmt.Errorf("%s: %w", NRIVariants[i].Name, err)
			}
			runs[i] = append(runs[i], c)
		}
	}
	all := plugin.Events()
	events := len(all) - before
	t.Logf("the no-op plugin answered %d events in %d cycles, the last cycle's: %v", events, *cycles, all[max(before, len(all)-events/max(*cycles, 1)):])
	// RunPodSandbox, CreateContainer, PostCreateContainer, StartContainer,
	// PostStartContainer, StopContainer, StopPodSandbox, RemoveContainer,
	// RemovePodSandbox: fewer than these and the plugin was not in the cycle measured.
	if events < 9**cycles {
		return version, fmt.Errorf("the no-op plugin answered %d events in %d cycles: it was not called", events, *cycles)
	}
	res["nri_noop_events"] = float64(events) / float64(*cycles)
	return version, NRIResults(res, runs)
}
