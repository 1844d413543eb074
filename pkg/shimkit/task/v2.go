package task

import (
	"context"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
)

// registerV2 serves s as containerd.task.v2.Task. The v2 and v3 protos are the same file
// under another package name, so the wire format is identical: v2 requests are decoded
// straight into the v3 messages, without importing (and linking) the v2 package.
func registerV2(srv *ttrpc.Server, s *Service) {
	srv.RegisterService("containerd.task.v2.Task", &ttrpc.ServiceDesc{
		Methods: map[string]ttrpc.Method{
			"State":      method(s.State),
			"Create":     method(s.Create),
			"Start":      method(s.Start),
			"Delete":     method(s.Delete),
			"Pids":       method(s.Pids),
			"Pause":      method(s.Pause),
			"Resume":     method(s.Resume),
			"Checkpoint": method(s.Checkpoint),
			"Kill":       method(s.Kill),
			"Exec":       method(s.Exec),
			"ResizePty":  method(s.ResizePty),
			"CloseIO":    method(s.CloseIO),
			"Update":     method(s.Update),
			"Wait":       method(s.Wait),
			"Stats":      method(s.Stats),
			"Connect":    method(s.Connect),
			"Shutdown":   method(s.Shutdown),
		},
	})
}

// method adapts a typed handler to ttrpc's untyped one.
func method[Req any, Resp any, P interface {
	*Req
	proto.Message
}](fn func(context.Context, P) (Resp, error)) ttrpc.Method {
	return func(ctx context.Context, unmarshal func(any) error) (any, error) {
		req := P(new(Req))
		if err := unmarshal(req); err != nil {
			return nil, err
		}
		return fn(ctx, req)
	}
}
