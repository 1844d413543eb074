package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// eventsSocket is the ttrpc address task-only shims publish their task events to, as
// containerd's shims publish to containerd's (TTRPC_ADDRESS). Without one they log a
// failure for every event and retry it.
func (o Options) eventsSocket() string { return filepath.Join(o.StateDir, "events.sock") }

// eventSink takes the events task-only shims forward. Exits and OOM kills reach crisp
// through task Wait and the cgroup's counters (which survive a restart), so the
// events are only logged.
type eventSink struct{ log *slog.Logger }

func (s eventSink) Forward(_ context.Context, req *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	env := req.GetEnvelope()
	s.log.Debug("task event", "topic", env.GetTopic(), "namespace", env.GetNamespace())
	return &emptypb.Empty{}, nil
}

// serveEvents listens on the events socket; Close stops the server.
func (c *Controller) serveEvents() error {
	path := c.opts.eventsSocket()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale events socket: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen for shim events: %w", err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		l.Close()
		return fmt.Errorf("events server: %w", err)
	}
	eventsapi.RegisterTTRPCEventsService(srv, eventSink{log: c.log})
	c.events = srv
	go func() {
		if err := srv.Serve(c.bg, l); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			c.log.Warn("shim events server stopped", "err", err)
		}
	}()
	return nil
}
