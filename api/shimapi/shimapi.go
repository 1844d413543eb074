package shimapi

import (
	"context"

	"github.com/containerd/ttrpc"

	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
)

// ServiceName is the ttrpc service name on the shim's socket.
const ServiceName = "crisp.shim.v1.Shim"

// Method names of ServiceName.
const (
	MethodReopenLog     = "ReopenLog"
	MethodContainerInfo = "ContainerInfo"
	MethodAttach        = "Attach"
)

// Service is crisp.shim.v1.Shim.
type Service interface {
	// ReopenLog reopens a container's log file after kubelet renamed it: later output
	// goes to a new file at the container's log path.
	ReopenLog(context.Context, *optionsv1.ReopenLogRequest) (*optionsv1.ReopenLogResponse, error)
	// ContainerInfo reports what the task API lacks about a container (OOM kills).
	ContainerInfo(context.Context, *optionsv1.ContainerInfoRequest) (*optionsv1.ContainerInfoResponse, error)
	// Attach connects FIFOs to a running container's main process: the caller's
	// stdin FIFO is copied into its stdin, its output is copied to the stdout and
	// stderr FIFOs (a terminal's to stdout) besides the log. It returns once the FIFOs
	// are open; the attachment ends when the caller closes them or the container exits.
	Attach(context.Context, *optionsv1.AttachRequest) (*optionsv1.AttachResponse, error)
}

// Register serves svc as ServiceName on srv. The service is registered by hand: there is
// no .proto service for it, only the messages in api/options/v1.
func Register(srv *ttrpc.Server, svc Service) {
	srv.RegisterService(ServiceName, &ttrpc.ServiceDesc{
		Methods: map[string]ttrpc.Method{
			MethodReopenLog: func(ctx context.Context, unmarshal func(any) error) (any, error) {
				var req optionsv1.ReopenLogRequest
				if err := unmarshal(&req); err != nil {
					return nil, err
				}
				return svc.ReopenLog(ctx, &req)
			},
			MethodContainerInfo: func(ctx context.Context, unmarshal func(any) error) (any, error) {
				var req optionsv1.ContainerInfoRequest
				if err := unmarshal(&req); err != nil {
					return nil, err
				}
				return svc.ContainerInfo(ctx, &req)
			},
			MethodAttach: func(ctx context.Context, unmarshal func(any) error) (any, error) {
				var req optionsv1.AttachRequest
				if err := unmarshal(&req); err != nil {
					return nil, err
				}
				return svc.Attach(ctx, &req)
			},
		},
	})
}

type client struct {
	c *ttrpc.Client
}

// NewClient returns a Service that calls a shim over c.
func NewClient(c *ttrpc.Client) Service {
	return &client{c: c}
}

func (c *client) ReopenLog(ctx context.Context, req *optionsv1.ReopenLogRequest) (*optionsv1.ReopenLogResponse, error) {
	var resp optionsv1.ReopenLogResponse
	if err := c.c.Call(ctx, ServiceName, MethodReopenLog, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

func (c *client) ContainerInfo(ctx context.Context, req *optionsv1.ContainerInfoRequest) (*optionsv1.ContainerInfoResponse, error) {
	var resp optionsv1.ContainerInfoResponse
	if err := c.c.Call(ctx, ServiceName, MethodContainerInfo, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

func (c *client) Attach(ctx context.Context, req *optionsv1.AttachRequest) (*optionsv1.AttachResponse, error) {
	var resp optionsv1.AttachResponse
	if err := c.c.Call(ctx, ServiceName, MethodAttach, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}
