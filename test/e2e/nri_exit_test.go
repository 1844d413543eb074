package e2e

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// rebalancePlugin answers every StopContainer with an update of each other container
// of the pod, as CPU-rebalancing resource plugins do.
type rebalancePlugin struct {
	*nriSyncer
	mu      sync.Mutex
	running map[string]string // container id -> pod id
}

func (p *rebalancePlugin) StartContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running[c.GetId()] = pod.GetId()
	return nil
}

func (p *rebalancePlugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.running, c.GetId())
	return nil
}

// StopContainer updates every other container of the pod it has seen start and not
// be removed: the stops of two siblings each ask for an update of the other.
func (p *rebalancePlugin) StopContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ups []*api.ContainerUpdate
	for id, podID := range p.running {
		if podID != pod.GetId() || id == c.GetId() {
			continue
		}
		u := &api.ContainerUpdate{}
		u.SetContainerId(id)
		u.SetLinuxCPUShares(512)
		u.SetIgnoreFailure()
		ups = append(ups, u)
	}
	return ups, nil
}

// TestE2ENRIStopSiblingsAtOnce stops two containers of one pod at once under a plugin
// that answers each stop with an update of the other: each exit's StopContainer
// event, and the update it brings, must not wait for the sibling's stop, which holds
// the sibling's lock for its grace period. Both stops return well within their grace.
func TestE2ENRIStopSiblingsAtOnce(t *testing.T) {
	n := newNRIEnv(t, "2s")
	n.start()
	ctx := ctxT(t)
	img := n.busybox(ctx)
	p := &rebalancePlugin{nriSyncer: &nriSyncer{synced: make(chan struct{})}, running: map[string]string{}}
	n.connectPlugin(t, "rebalance", "10", p, p.synced)

	pod := n.podConfig("nri-siblings")
	podID := n.runPod(ctx, pod)
	defer n.stopRemove(ctx, t, podID)
	var ids []string
	for _, name := range []string{"a", "b"} {
		id := n.runCtr(ctx, podID, pod, ctrConfig(name, img, "sh", "-c", `trap "exit 0" TERM; echo trapped; sleep 1000 & wait`))
		waitLogLine(t, filepath.Join(pod.LogDirectory, name+".log"), "stdout trapped", 10*time.Second)
		ids = append(ids, id)
	}

	const grace = 20 // seconds; each container exits at once on SIGTERM
	var wg sync.WaitGroup
	took := make([]time.Duration, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			begin := time.Now()
			_, errs[i] = n.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: grace})
			took[i] = time.Since(begin)
		}()
	}
	wg.Wait()
	for i, id := range ids {
		t.Logf("StopContainer %s: %v in %v", id, errs[i], took[i])
		if errs[i] != nil {
			t.Errorf("StopContainer %s: %v", id, errs[i])
		}
		if took[i] > 5*time.Second {
			t.Errorf("StopContainer %s took %v: its exit waited on its sibling's stop (grace %ds)", id, took[i], grace)
		}
		st, err := n.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil || st.GetStatus().GetState() != cri.ContainerState_CONTAINER_EXITED || st.GetStatus().GetExitCode() != 0 {
			t.Errorf("container %s after the stop: %v (exit %d), %v; want exited 0", id, st.GetStatus().GetState(), st.GetStatus().GetExitCode(), err)
		}
	}
}
