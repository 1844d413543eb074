package tasksandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// eventSink takes the events task-only shims forward. Exits and OOM kills reach crisp
// through task Wait and the cgroup's counters (which survive a restart), so the
// events are only logged.
type eventSink struct{ log *slog.Logger }

func (s eventSink) Forward(_ context.Context, req *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	env := req.GetEnvelope()
	s.log.Debug("task event", "topic", env.GetTopic(), "namespace", env.GetNamespace())
	return &emptypb.Empty{}, nil
}

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
		l.Close()
		return nil, fmt.Errorf("events server: %w", err)
	}
	eventsapi.RegisterTTRPCEventsService(srv, eventSink{log: s.log})
	go func() {
		if err := srv.Serve(ctx, l); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			s.log.Warn("shim events server stopped", "err", err)
		}
	}()
	return srv, nil
}
