package cri

import (
	"github.com/crisp-runtime/crisp/internal/metrics"
)

// SetMetrics has the service record into m, and report its pods, containers and
// event subscribers to m at scrape time. Call it once, before Recover and serving:
// the exit monitors Recover starts record exits.
func (s *Service) SetMetrics(m *metrics.Metrics) {
	s.metrics = m
	m.WatchPods(func() int {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return len(s.pods)
	})
	m.WatchContainers(s.containersByState)
	m.WatchContainerEvents(
		func() int { return s.containerEvents().Subscribers() },
		func() uint64 { return s.containerEvents().Dropped() },
	)
}

// containersByState counts the containers in each CRI state; every state is present,
// so a state with none reads 0 rather than vanishing.
func (s *Service) containersByState() map[string]int {
	s.mu.RLock()
	ctrs := make([]*container, 0, len(s.containers))
	for _, c := range s.containers {
		ctrs = append(ctrs, c)
	}
	s.mu.RUnlock()
	out := map[string]int{stateCreated: 0, stateRunning: 0, stateExited: 0}
	for _, c := range ctrs {
		c.mu.Lock()
		out[c.rec.State]++
		c.mu.Unlock()
	}
	return out
}
