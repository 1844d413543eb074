package cri

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/encoding/protojson"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/cri/spec"
	"github.com/crisp-runtime/crisp/internal/nri"
)

// SetNRI hands the service its NRI (nil: off). Call it before serving and before
// n.Start(s.NRIRuntime()).
func (s *Service) SetNRI(n *nri.NRI) { s.nri = n }

// CDIInjector applies named CDI devices to a spec: what NRI plugins' CDI device
// adjustments go through, the same cache as the CRI's own CDI devices.
func (s *Service) CDIInjector() func(*specs.Spec, []string) error {
	return func(sp *specs.Spec, devices []string) error { return s.cdi.InjectDevices(sp, devices) }
}

// NRIRuntime is the service as NRI sees it.
func (s *Service) NRIRuntime() nri.Runtime { return nriRuntime{s} }

// nriPod is what NRI plugins are told of p.
func (s *Service) nriPod(p *pod) nri.Pod {
	md := p.config.GetMetadata()
	np := nri.Pod{
		ID: p.rec.ID, Name: md.GetName(), UID: md.GetUid(), Namespace: md.GetNamespace(),
		Labels: p.config.GetLabels(), Annotations: p.config.GetAnnotations(),
		RuntimeHandler: p.rec.Handler, CgroupParent: p.config.GetLinux().GetCgroupParent(),
	}
	if st, err := s.ctrl.Status(p.rec.ID); err == nil {
		np.Pid = st.Pid
		if st.IP != "" {
			np.IPs = append([]string{st.IP}, st.AdditionalIPs...)
		}
	}
	// These two fields change under s.mu (UpdatePodSandboxResources).
	s.mu.RLock()
	overhead, resources := p.rec.Overhead, p.rec.Resources
	s.mu.RUnlock()
	np.Overhead = decodeResources(overhead)
	np.Resources = decodeResources(resources)
	return np
}

func decodeResources(raw json.RawMessage) *runtime.LinuxContainerResources {
	if len(raw) == 0 {
		return nil
	}
	var r runtime.LinuxContainerResources
	if protojson.Unmarshal(raw, &r) != nil {
		return nil
	}
	return &r
}

// nriContainer is what NRI plugins are told of c; sp is its spec when there is one
// at hand (at create), else nil.
func nriContainer(c *container, sp *specs.Spec) nri.Container {
	rec := c.snapshot()
	return nri.Container{
		ID: rec.ID, PodID: rec.PodID, Name: c.config.GetMetadata().GetName(), State: criState(rec.State),
		Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(), Spec: sp,
		Resources: currentResources(rec, c.config), Pid: rec.Pid,
		CreatedAt: rec.CreatedAt, StartedAt: rec.StartedAt, FinishedAt: rec.FinishedAt, ExitCode: rec.ExitCode,
		Reason: rec.Reason, Message: rec.Message, Seccomp: c.config.GetLinux().GetSecurityContext().GetSeccomp(),
	}
}

// nriPodOf is the NRI view of the pod of a container, the zero Pod with just its id
// when the pod is gone (RemoveContainer of an orphan).
func (s *Service) nriPodOf(podID string) nri.Pod {
	s.mu.RLock()
	p := s.pods[podID]
	s.mu.RUnlock()
	if p == nil {
		return nri.Pod{ID: podID}
	}
	return s.nriPod(p)
}

// nriRuntime is the Service as NRI sees it: where plugins' updates and evictions
// land. Updates take the container's res lock and evictions its op lock, so no NRI
// event that plugins may answer with them is sent while a container's op is held
// (StopContainer, RemoveContainer and a failed StartContainer send theirs after
// releasing it; exits send theirs in the background).
type nriRuntime struct{ s *Service }

func (r nriRuntime) Pods() []nri.Pod {
	r.s.mu.RLock()
	pods := make([]*pod, 0, len(r.s.pods))
	for _, p := range r.s.pods {
		pods = append(pods, p)
	}
	r.s.mu.RUnlock()
	out := make([]nri.Pod, 0, len(pods))
	for _, p := range pods {
		out = append(out, r.s.nriPod(p))
	}
	return out
}

func (r nriRuntime) Containers() []nri.Container {
	r.s.mu.RLock()
	ctrs := make([]*container, 0, len(r.s.containers))
	for _, c := range r.s.containers {
		ctrs = append(ctrs, c)
	}
	r.s.mu.RUnlock()
	var out []nri.Container
	for _, c := range ctrs {
		// As containerd: exited containers are not synchronized.
		if c.snapshot().State == stateExited {
			continue
		}
		out = append(out, nriContainer(c, nil))
	}
	return out
}

// UpdateContainer applies a plugin's update through UpdateContainerResources' path.
func (r nriRuntime) UpdateContainer(ctx context.Context, id string, res *api.LinuxResources) error {
	c, err := r.s.resolveContainer(id)
	if err != nil {
		return err
	}
	if res == nil {
		return nil
	}
	// res, not op: a stop holds op for its whole grace period, and the update
	// plugins answer a sibling's stop with must not wait for it.
	c.res.Lock()
	defer c.res.Unlock()
	return r.s.updateResources(ctx, c, nri.ToCRIResources(res, 0))
}

// EvictContainer stops the container at once, as StopContainer with no grace period.
func (r nriRuntime) EvictContainer(ctx context.Context, id, reason string) error {
	c, err := r.s.resolveContainer(id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	r.s.log.Info("NRI plugin evicts container", "container", id, "reason", reason)
	c.op.Lock()
	err = r.s.stopContainer(ctx, c, 0)
	c.op.Unlock()
	if err != nil {
		return fmt.Errorf("evict container %s: %w", id, err)
	}
	r.s.nri.StopContainer(ctx, r.s.nriPodOf(c.rec.PodID), nriContainer(c, nil))
	return nil
}

// newNRIContainer is what NRI plugins are told of a container being created.
func newNRIContainer(p *pod, id string, cfg *runtime.ContainerConfig, sp *specs.Spec) nri.Container {
	return nri.Container{
		ID: id, PodID: p.rec.ID, Name: cfg.GetMetadata().GetName(), State: runtime.ContainerState_CONTAINER_CREATED,
		Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(), Spec: sp,
		Resources: cfg.GetLinux().GetResources(), Seccomp: cfg.GetLinux().GetSecurityContext().GetSeccomp(),
	}
}

// adjustWithNRI asks NRI plugins for their adjustments of a container about to be
// created and applies them to sp; its error fails the create. When plugins changed
// the resources it returns them in the CRI's form (the container's config merged with
// the spec's), for the record: ContainerStatus and later updates then start from what
// the container runs with.
func (s *Service) adjustWithNRI(ctx context.Context, p *pod, id string, cfg *runtime.ContainerConfig, sp *specs.Spec) (json.RawMessage, error) {
	if !s.nri.Enabled() {
		return nil, nil
	}
	adj, err := s.nri.CreateContainer(ctx, s.nriPod(p), newNRIContainer(p, id, cfg, sp))
	if err != nil {
		return nil, err
	}
	if adj.GetLinux().GetResources() == nil || sp.Linux == nil {
		return nil, nil
	}
	var oom int64
	if sp.Process != nil && sp.Process.OOMScoreAdj != nil {
		oom = int64(*sp.Process.OOMScoreAdj)
	}
	merged := spec.MergeResources(cfg.GetLinux().GetResources(), nri.ToCRIResources(api.FromOCILinuxResources(sp.Linux.Resources, nil), oom))
	merged.OomScoreAdj = oom
	raw, err := protojson.Marshal(merged)
	if err != nil {
		return nil, fmt.Errorf("encode NRI-adjusted resources of container %s: %w", id, err)
	}
	return raw, nil
}
