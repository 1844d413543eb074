package cri

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/encoding/protojson"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/cri/spec"
	"github.com/crisp-runtime/crisp/internal/network"
)

// UpdateRuntimeConfig takes the node's pod CIDR from kubelet (spec.podCIDRs, joined by
// a comma on dual-stack nodes) and makes it the subnet of crisp's generated default
// CNI network, so pods created from now on get addresses in it. The CIDR is kept
// under root_dir and survives restarts. An operator's CNI config, or crisp's default
// file once someone edited it, is left alone: the CIDR is then only kept and logged.
// An empty CIDR changes nothing, as the CRI asks.
func (s *Service) UpdateRuntimeConfig(_ context.Context, req *runtime.UpdateRuntimeConfigRequest) (*runtime.UpdateRuntimeConfigResponse, error) {
	cidr := req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr()
	if cidr == "" {
		return &runtime.UpdateRuntimeConfigResponse{}, nil
	}
	res, err := s.net.SetPodCIDR(cidr)
	if errors.Is(err, network.ErrInvalidPodCIDR) {
		return nil, toStatus(invalid("runtime_config.network_config.pod_cidr: %v", err))
	}
	if err != nil {
		return nil, toStatus(fmt.Errorf("apply pod CIDR %q: %w", cidr, err))
	}
	log := s.log.With("pod_cidr", res.PodCIDR, "active_cni_config", res.ActiveFile)
	switch {
	case !res.Applied:
		log.Warn("pod CIDR kept, but the CNI config in use is not crisp's generated default: it decides pod addresses itself")
	case res.Changed:
		log.Info("pod CIDR applied to crisp's default CNI network: new pods get addresses in it")
	default:
		log.Debug("pod CIDR unchanged")
	}
	return &runtime.UpdateRuntimeConfigResponse{}, nil
}

// UpdatePodSandboxResources records the pod-level overhead and resources kubelet
// resized the pod to (in-place pod resize). Kubelet calls it after it has already
// written the pod cgroup (the pod's cgroup_parent), which is where pod-level limits
// live; crisp's own cgroup under it holds only the pause process and carries no
// limits, so there is nothing further for crisp to apply. The values are validated,
// stored with the pod (they survive restarts) and shown in PodSandboxStatus verbose
// info as "overhead" and "resources".
func (s *Service) UpdatePodSandboxResources(ctx context.Context, req *runtime.UpdatePodSandboxResourcesRequest) (*runtime.UpdatePodSandboxResourcesResponse, error) {
	p, err := s.resolvePod(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	if req.GetOverhead() == nil && req.GetResources() == nil {
		return nil, toStatus(invalid("neither overhead nor resources given for pod sandbox %s", p.rec.ID))
	}
	encode := func(name string, r *runtime.LinuxContainerResources) ([]byte, error) {
		if r == nil {
			return nil, nil
		}
		if _, err := spec.UpdateResources(r); err != nil {
			return nil, fmt.Errorf("%s of pod sandbox %s: %w", name, p.rec.ID, err)
		}
		b, err := protojson.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode %s of pod sandbox %s: %w", name, p.rec.ID, err)
		}
		return b, nil
	}
	overhead, err := encode("overhead", req.GetOverhead())
	if err != nil {
		return nil, toStatus(err)
	}
	resources, err := encode("resources", req.GetResources())
	if err != nil {
		return nil, toStatus(err)
	}
	if s.nri.Enabled() {
		// As in containerd: plugins see the new pod-level resources first, and their
		// error fails the update.
		np := s.nriPod(p)
		if req.GetOverhead() != nil {
			np.Overhead = req.GetOverhead()
		}
		if req.GetResources() != nil {
			np.Resources = req.GetResources()
		}
		if err := s.nri.UpdatePodSandbox(ctx, np); err != nil {
			return nil, toStatus(fmt.Errorf("NRI UpdatePodSandbox of pod %s: %w", p.rec.ID, err))
		}
	}
	// Under the service lock: the record is written whole, and a concurrent update of
	// the same pod must not interleave with this one.
	s.mu.Lock()
	if _, ok := s.pods[p.rec.ID]; !ok {
		s.mu.Unlock()
		return nil, toStatus(fmt.Errorf("pod sandbox %s was removed: %w", p.rec.ID, errdefs.ErrNotFound))
	}
	// Only these two fields of p.rec change, and they are read only under s.mu;
	// the others are read without it, so the record is never assigned whole.
	rec := p.rec
	if overhead != nil {
		rec.Overhead = overhead
	}
	if resources != nil {
		rec.Resources = resources
	}
	err = s.store.Put(podBucket, rec.ID, rec)
	if err == nil {
		p.rec.Overhead, p.rec.Resources = rec.Overhead, rec.Resources
	}
	s.mu.Unlock()
	if err != nil {
		return nil, toStatus(fmt.Errorf("record resources of pod sandbox %s: %w", rec.ID, err))
	}
	s.log.Info("recorded pod-level resources; the pod cgroup is kubelet's, nothing else to apply",
		"pod", rec.ID, "overhead", string(overhead), "resources", string(resources))
	if s.nri.Enabled() {
		s.nri.PostUpdatePodSandbox(ctx, s.nriPod(p))
	}
	return &runtime.UpdatePodSandboxResourcesResponse{}, nil
}
