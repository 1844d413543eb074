package e2e

import (
	"testing"

	"github.com/crisp-runtime/crisp/internal/tracing/otlptest"
)

// TestNodeTracing is TestE2ETracing's pod start on the installed service, under
// systemd with cgroup v2 and the node's cgroup driver: kubelet's client spans, crisp's
// and the shim's in one trace, the pod's cgroup set up the driver's way (the systemd
// driver's scope is made over D-Bus in shim.cgroup.apply).
func TestNodeTracing(t *testing.T) {
	e := newNodeEnv(t)
	recv, err := otlptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(recv.Close)
	e.editNodeConfig(func(cfg map[string]any) {
		cfg["tracing"] = map[string]any{"enable": true, "endpoint": recv.GRPCAddr, "insecure": true}
	})
	ctx := ctxT(t)
	kp := e.kubeletPod("traced", nil)
	podID, trace := tracedPodStart(ctx, t, e, recv, kp.cfg)
	applied := false
	for _, s := range trace {
		if s.Name == "shim.cgroup.apply" {
			applied = true
			if s.Attrs["crisp.cgroup.driver"] != nodeDriver() {
				t.Errorf("shim.cgroup.apply attributes %v, want the %s driver", s.Attrs, nodeDriver())
			}
		}
	}
	if !applied {
		t.Error("no shim.cgroup.apply span")
	}
	e.stopRemove(ctx, t, podID)
}
