package task

import (
	"context"
	"errors"

	taskv3 "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	"github.com/crisp-runtime/crisp/internal/cgstats"
)

// Stats reports the container's cgroup metrics as containerd's runc shim does: an
// io.containerd.cgroups.v1.Metrics (legacy and hybrid hosts) or
// io.containerd.cgroups.v2.Metrics (unified hosts) in the response's Any. A container
// that was created but not started already has its cgroup; one whose cgroup is gone
// (deleted meanwhile) is NotFound.
func (s *Service) Stats(ctx context.Context, req *taskv3.StatsRequest) (*taskv3.StatsResponse, error) {
	c, err := s.get(req.GetID())
	if err != nil {
		return nil, err
	}
	cg, err := c.cgroup()
	if err != nil {
		if errors.Is(err, cgstats.ErrGone) {
			return nil, notFound("cgroup of container %q is gone: %v", c.id, err)
		}
		return nil, internal("stats of container %q: %v", c.id, err)
	}
	a, err := cg.Read()
	if err != nil {
		if errors.Is(err, cgstats.ErrGone) {
			return nil, notFound("cgroup of container %q is gone: %v", c.id, err)
		}
		return nil, internal("stats of container %q: %v", c.id, err)
	}
	return &taskv3.StatsResponse{Stats: a}, nil
}

// cgroup returns the container's cgroup, loading it on first use from the path the
// helper that created the container reported (the cgroupfs path, or the systemd slice
// and scope).
func (c *container) cgroup() (*cgstats.Cgroup, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deleted {
		return nil, cgstats.ErrGone
	}
	if c.cg != nil {
		return c.cg, nil
	}
	switch {
	case c.cgInfo == nil:
		return nil, errors.New("the container's cgroup is not known")
	case c.cgInfo.Stats == "":
		return nil, errors.New(c.cgInfo.StatsErr)
	}
	cg, err := cgstats.Load(c.cgInfo.Stats)
	if err != nil {
		return nil, err
	}
	c.cg = cg
	return cg, nil
}
