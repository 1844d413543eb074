package tasksandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"

	apievents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// taskOOMTopic is the topic of the TaskOOM events shims publish (containerd's
// runtime.TaskOOMEventTopic).
const taskOOMTopic = "/tasks/oom"

// eventSink takes the events task-only shims forward. Exits reach crisp through task
// Wait, OOM kills through the cgroup's counters (which survive a restart) and, for a
// shim whose counters cannot tell, through its TaskOOM events: gVisor's shim reads no
// container cgroup (its containers' processes are the Sentry's, in the sandbox's
// cgroup) and reports an OOM kill in the sandbox's cgroup as a TaskOOM event for each
// container of the sandbox, which is what containerd's CRI goes by. Other events are
// only logged.
type eventSink struct {
	log *slog.Logger
	oom *oomSet
}

func (s eventSink) Forward(_ context.Context, req *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	env := req.GetEnvelope()
	s.log.Debug("task event", "topic", env.GetTopic(), "namespace", env.GetNamespace())
	if env.GetTopic() == taskOOMTopic && env.GetEvent() != nil {
		var ev apievents.TaskOOM
		if err := proto.Unmarshal(env.GetEvent().GetValue(), &ev); err != nil {
			s.log.Warn("undecodable TaskOOM event", "err", err)
		} else if ev.GetContainerID() != "" {
			s.log.Info("shim reports an OOM kill", "container", ev.GetContainerID())
			s.oom.add(ev.GetContainerID())
		}
	}
	return &emptypb.Empty{}, nil
}

// oomSet holds the containers a shim reported OOM kills of (TaskOOM events), until
// they are forgotten. Its zero value is empty.
type oomSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (o *oomSet) add(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ids == nil {
		o.ids = map[string]bool{}
	}
	o.ids[id] = true
}

func (o *oomSet) has(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ids[id]
}

func (o *oomSet) forget(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.ids, id)
}

// OOMReported reports whether the shim of container id sent a TaskOOM event for it
// (since criserver started; until ForgetOOM).
func (s *Sandboxer) OOMReported(id string) bool { return s.oom.has(id) }

// ForgetOOM drops what TaskOOM events said of container id, once it is deleted.
func (s *Sandboxer) ForgetOOM(id string) { s.oom.forget(id) }

// ServeEvents listens on path, the ttrpc address task-only shims publish their task
// events to, as containerd's shims publish to containerd's (TTRPC_ADDRESS): without
// one they log a failure for every event and retry it. It serves until ctx ends or the
// server is closed.
func (s *Sandboxer) ServeEvents(ctx context.Context, path string) (*ttrpc.Server, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale events socket: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen for shim events: %w", err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("events server: %w", err)
	}
	eventsapi.RegisterTTRPCEventsService(srv, eventSink{log: s.log, oom: &s.oom})
	go func() {
		if err := srv.Serve(ctx, l); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			s.log.Warn("shim events server stopped", "err", err)
		}
	}()
	return srv, nil
}
