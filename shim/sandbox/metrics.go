package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	"github.com/crisp-runtime/crisp/api/containerd/types"
	"github.com/crisp-runtime/crisp/internal/cgstats"
)

// SandboxMetrics reports the pod's cgroup metrics (see CgroupConfig.metricsPath for
// which cgroup) as containerd's shims do: a types.Metric whose data is an
// io.containerd.cgroups.v1.Metrics or io.containerd.cgroups.v2.Metrics. A stopped pod
// has no cgroup any more: FailedPrecondition.
func (s *Service) SandboxMetrics(ctx context.Context, req *sandboxapi.SandboxMetricsRequest) (*sandboxapi.SandboxMetricsResponse, error) {
	sb, err := s.lookup(req.GetSandboxID())
	if err != nil {
		return nil, err
	}
	cg, err := s.metricsCgroup(sb)
	if err == nil {
		var data *types.Metric
		a, rerr := cg.Read()
		if rerr == nil {
			data = &types.Metric{Timestamp: timestamppb.New(time.Now()), ID: s.id, Data: a}
			return &sandboxapi.SandboxMetricsResponse{Metrics: data}, nil
		}
		err = rerr
	}
	if errors.Is(err, cgstats.ErrGone) {
		return nil, kindf(errdefs.ErrFailedPrecondition, "sandbox %q has no cgroup (stopped?): %v", s.id, err)
	}
	return nil, kindf(errdefs.ErrInternal, "metrics of sandbox %q: %v", s.id, err)
}

func (s *Service) metricsCgroup(sb *sandbox) (*cgstats.Cgroup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb.stopped {
		return nil, cgstats.ErrGone
	}
	if sb.metrics != nil {
		return sb.metrics, nil
	}
	rel, err := sb.spec.cgroup.metricsPath()
	if err != nil {
		return nil, err
	}
	cg, err := cgstats.Load(rel)
	if err != nil {
		return nil, err
	}
	sb.metrics = cg
	return cg, nil
}
