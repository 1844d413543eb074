package cri

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/cri/events"
)

// eventHub is the CRI's container event stream: kubelet's evented PLEG subscribes
// through GetContainerEvents. It is set up on first use so that New stays as it is.
type eventHub struct {
	once  sync.Once
	b     *events.Broadcaster[*runtime.ContainerEventResponse]
	subID atomic.Uint64
	// stopped holds the pods whose STOPPED event was sent: kubelet calls
	// StopPodSandbox again and again, and RemovePodSandbox may come without one.
	stopped sync.Map
}

// markStopped records that pod id's STOPPED event is due and reports whether it was
// not sent before.
func (h *eventHub) markStopped(id string) bool {
	_, sent := h.stopped.LoadOrStore(id, struct{}{})
	return !sent
}

// forget drops what the hub keeps of a removed pod.
func (h *eventHub) forget(id string) { h.stopped.Delete(id) }

// containerEvents returns the service's event broadcaster.
func (s *Service) containerEvents() *events.Broadcaster[*runtime.ContainerEventResponse] {
	s.evs.once.Do(func() {
		s.evs.b = events.New[*runtime.ContainerEventResponse](events.Options{
			Buffer: s.cfg.EventBuffer,
			Log:    s.log.With("stream", "container_events"),
		})
	})
	return s.evs.b
}

// GetContainerEvents streams container lifecycle events until the client goes away
// or criserver shuts down. Each event carries the pod's status and the status of
// every container of the pod, which is what kubelet's evented PLEG builds the pod's
// state from. Pod sandboxes send events too, with the pod id as the container id, as
// containerd does. A subscriber that reads too slowly loses events (see package
// events) rather than slowing down the runtime.
func (s *Service) GetContainerEvents(_ *runtime.GetEventsRequest, stream runtime.RuntimeService_GetContainerEventsServer) error {
	name := fmt.Sprintf("GetContainerEvents#%d", s.evs.subID.Add(1))
	sub := s.containerEvents().Subscribe(name)
	defer sub.Close()
	ctx := stream.Context()
	log := s.log.With("subscriber", name)
	// Headers go out once the subscription exists, so a client that waits for them
	// (stream.Header()) knows no later event can be missed.
	if err := stream.SendHeader(metadata.Pairs("crisp-event-subscriber", name)); err != nil {
		return fmt.Errorf("start container event stream %s: %w", name, err)
	}
	log.Info("container event subscriber connected")
	defer func() { log.Info("container event subscriber gone", "dropped_total", sub.Dropped()) }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-sub.C():
			if !ok {
				return nil // CloseEvents: criserver is stopping
			}
			if err := stream.Send(ev); err != nil {
				return fmt.Errorf("send container event to %s: %w", name, err)
			}
		}
	}
}

// CloseEvents ends every GetContainerEvents stream, so that a graceful stop of the
// gRPC server does not wait for subscribers that never hang up.
func (s *Service) CloseEvents() {
	s.containerEvents().Close()
}

// emitContainerEvent publishes an event about container id of pod podID. Statuses
// are built only when someone listens: kubelet without evented PLEG never pays.
func (s *Service) emitContainerEvent(id, podID string, typ runtime.ContainerEventType) {
	if s.containerEvents().Subscribers() == 0 {
		return
	}
	p, err := s.resolvePodExact(podID)
	if err != nil {
		// The pod went away concurrently: kubelet learns that from the pod's own event.
		s.log.Debug("no pod for container event", "container", id, "pod", podID, "type", typ.String())
		return
	}
	s.publishEvent(id, typ, s.podEventStatus(p))
}

// emitPodEvent publishes an event about a pod sandbox itself (container id = pod id).
func (s *Service) emitPodEvent(p *pod, typ runtime.ContainerEventType) {
	s.publishEvent(p.rec.ID, typ, s.podEventStatus(p))
}

// publishEvent publishes an event with statuses taken by podEventStatus, maybe
// earlier: RemovePodSandbox takes them before the pod is gone. Nothing is sent when
// they were not taken because nobody listened.
func (s *Service) publishEvent(id string, typ runtime.ContainerEventType, st podEventState) {
	if st.pod == nil {
		return
	}
	s.containerEvents().Publish(&runtime.ContainerEventResponse{
		ContainerId:        id,
		ContainerEventType: typ,
		CreatedAt:          time.Now().UnixNano(),
		PodSandboxStatus:   st.pod,
		ContainersStatuses: st.containers,
	})
}

// podEventState is the pod status and container statuses an event carries.
type podEventState struct {
	pod        *runtime.PodSandboxStatus
	containers []*runtime.ContainerStatus
}

// podEventStatus takes the pod's status as PodSandboxStatus builds it and the status
// of each of its containers as ContainerStatus builds it, oldest container first.
// It returns a zero value when nobody listens, so callers may take it unconditionally.
func (s *Service) podEventStatus(p *pod) podEventState {
	if s.containerEvents().Subscribers() == 0 {
		return podEventState{}
	}
	st, _ := s.ctrl.Status(p.rec.ID)
	out := podEventState{pod: s.podStatus(p, st)}
	for _, c := range s.containersOf(p.rec.ID) {
		cs, _ := s.containerStatus(c)
		out.containers = append(out.containers, cs)
	}
	sort.Slice(out.containers, func(i, j int) bool { return out.containers[i].CreatedAt < out.containers[j].CreatedAt })
	return out
}

// resolvePodExact finds a pod by its full id (events never use prefixes).
func (s *Service) resolvePodExact(id string) (*pod, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.pods[id]
	if !ok {
		return nil, fmt.Errorf("pod sandbox %q: %w", id, errNotFound)
	}
	return p, nil
}

// WatchSandboxExits publishes a pod's STOPPED event as soon as its pause process exits,
// also when it dies on its own (kubelet's evented PLEG would otherwise only learn it
// at its next relist). A stop kubelet asked for sends the event only once: whichever
// of this and StopPodSandbox comes first. It returns when ctx ends.
func (s *Service) WatchSandboxExits(ctx context.Context) {
	exits := s.ctrl.SandboxExits()
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-exits:
			p, err := s.resolvePodExact(id)
			if err != nil {
				continue // removed meanwhile: its events are out already
			}
			if s.evs.markStopped(id) {
				s.emitPodEvent(p, runtime.ContainerEventType_CONTAINER_STOPPED_EVENT)
			}
		}
	}
}
