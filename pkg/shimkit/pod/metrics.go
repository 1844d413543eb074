package pod

import (
	"context"
	"errors"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/crisp-runtime/crisp/internal/cgstats"
)

// Metrics reports the pod's cgroup metrics (see CgroupConfig.metricsPath for which
// cgroup) as containerd's shims do: an io.containerd.cgroups.v1.Metrics or
// io.containerd.cgroups.v2.Metrics. A stopped pod has no cgroup any more:
// FailedPrecondition.
func (s *Pod) Metrics(ctx context.Context) (*anypb.Any, error) {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	cg, err := s.metricsCgroup(sb)
	if err == nil {
		a, rerr := cg.Read()
		if rerr == nil {
			return a, nil
		}
		err = rerr
	}
	if errors.Is(err, cgstats.ErrGone) {
		return nil, kindf(errdefs.ErrFailedPrecondition, "sandbox %q has no cgroup (stopped?): %v", s.id, err)
	}
	return nil, kindf(errdefs.ErrInternal, "metrics of sandbox %q: %v", s.id, err)
}

func (s *Pod) metricsCgroup(sb *sandbox) (*cgstats.Cgroup, error) {
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
