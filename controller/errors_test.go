package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	sandboxapi "github.com/containerd/containerd/api/runtime/sandbox/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kinds are the errdefs kinds (and context errors) an error from a shim can become;
// each test case names the one it must be, and no other.
var kinds = map[string]func(error) bool{
	"NotFound":           errdefs.IsNotFound,
	"AlreadyExists":      errdefs.IsAlreadyExists,
	"InvalidArgument":    errdefs.IsInvalidArgument,
	"FailedPrecondition": errdefs.IsFailedPrecondition,
	"NotImplemented":     errdefs.IsNotImplemented,
	"Unavailable":        errdefs.IsUnavailable,
	"PermissionDenied":   errdefs.IsPermissionDenied,
	"ResourceExhausted":  errdefs.IsResourceExhausted,
	"OutOfRange":         errdefs.IsOutOfRange,
	"DataLoss":           errdefs.IsDataLoss,
	"Unauthorized":       errdefs.IsUnauthorized,
	"Aborted":            errdefs.IsAborted,
	"Internal":           errdefs.IsInternal,
	"Unknown":            errdefs.IsUnknown,
	"DeadlineExceeded":   func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
	"Canceled":           func(err error) bool { return errors.Is(err, context.Canceled) },
}

// kindsOf names the kinds err is.
func kindsOf(err error) []string {
	var is []string
	for name, of := range kinds {
		if of(err) {
			is = append(is, name)
		}
	}
	return is
}

// codeCases are the shim's status codes and the kind each becomes.
var codeCases = []struct {
	code codes.Code
	kind string
}{
	{codes.NotFound, "NotFound"},
	{codes.AlreadyExists, "AlreadyExists"},
	{codes.InvalidArgument, "InvalidArgument"},
	{codes.FailedPrecondition, "FailedPrecondition"},
	{codes.Unimplemented, "NotImplemented"},
	{codes.Unavailable, "Unavailable"},
	{codes.DeadlineExceeded, "DeadlineExceeded"},
	{codes.Canceled, "Canceled"},
	{codes.PermissionDenied, "PermissionDenied"},
	{codes.ResourceExhausted, "ResourceExhausted"},
	{codes.OutOfRange, "OutOfRange"},
	{codes.DataLoss, "DataLoss"},
	{codes.Unauthenticated, "Unauthorized"},
	{codes.Aborted, "Aborted"},
	{codes.Internal, "Internal"},
	{codes.Unknown, "Unknown"},
}

func TestFromShim(t *testing.T) {
	const msg = `sandbox "p1" has already stopped; create a new one`
	for _, tc := range codeCases {
		t.Run(tc.code.String(), func(t *testing.T) {
			err := fromShim(status.Error(tc.code, msg))
			if got := kindsOf(err); len(got) != 1 || got[0] != tc.kind {
				t.Errorf("kinds of %v = %v, want [%s]", err, got, tc.kind)
			}
			if !strings.Contains(err.Error(), msg) {
				t.Errorf("message %q lost the shim's %q", err, msg)
			}
			if _, ok := status.FromError(err); ok {
				t.Errorf("%v is still a gRPC status inside the controller", err)
			}
		})
	}

	t.Run("message", func(t *testing.T) {
		// The shim's message alone: the kind is for errors.Is, the CRI edge names the code.
		if got, want := fromShim(status.Error(codes.NotFound, `sandbox "p1" not found`)).Error(), `sandbox "p1" not found`; got != want {
			t.Errorf("message = %q, want %q", got, want)
		}
	})
	t.Run("wrapped status", func(t *testing.T) {
		err := fromShim(fmt.Errorf("wait for the pause container of pod p1: %w", status.Error(codes.NotFound, "no task p1")))
		if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "wait for the pause container of pod p1: ") || !strings.Contains(err.Error(), "no task p1") {
			t.Errorf("got %v (kinds %v), want NotFound with both messages", err, kindsOf(err))
		}
	})
	t.Run("closed connection", func(t *testing.T) {
		err := fromShim(fmt.Errorf("create: %w", ttrpc.ErrClosed))
		if got := kindsOf(err); len(got) != 1 || got[0] != "Unavailable" || !errors.Is(err, ttrpc.ErrClosed) {
			t.Errorf("kinds of %v = %v, want [Unavailable] and still ttrpc.ErrClosed", err, got)
		}
	})
	t.Run("plain error", func(t *testing.T) {
		plain := errors.New("boom")
		if err := fromShim(plain); err != plain {
			t.Errorf("fromShim(%v) = %v, want it unchanged", plain, err)
		}
	})
	t.Run("in-process kind", func(t *testing.T) {
		// The task-only sandboxer answers in process: its kinds stay.
		in := fmt.Errorf("update of a task-only shim's sandbox: %w", errdefs.ErrNotImplemented)
		if err := fromShim(in); err != in {
			t.Errorf("fromShim(%v) = %v, want it unchanged", in, err)
		}
	})
	t.Run("caller's deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 0)
		defer cancel()
		<-ctx.Done()
		if err := fromShim(ctx.Err()); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("fromShim(ctx.Err()) = %v, want DeadlineExceeded", err)
		}
	})
	if fromShim(nil) != nil {
		t.Error("fromShim(nil) is not nil")
	}
}

// pingErrors is a shim's sandbox service whose PingSandbox fails with the error named
// by the request's sandbox id.
type pingErrors struct {
	sandboxapi.TTRPCSandboxService
	errs map[string]error
}

func (p pingErrors) PingSandbox(_ context.Context, req *sandboxapi.PingRequest) (*sandboxapi.PingResponse, error) {
	return nil, p.errs[req.GetSandboxID()]
}

// The errors as they really come out of a ttrpc client, closed connection included.
func TestFromShimOverTTRPC(t *testing.T) {
	errs := map[string]error{}
	for _, tc := range codeCases {
		errs[tc.kind] = status.Error(tc.code, "shim says "+tc.kind)
	}
	server, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	sandboxapi.RegisterTTRPCSandboxService(server, pingErrors{errs: errs})
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(context.Background(), l) }()
	defer server.Close()
	client, err := dialShim(context.Background(), "unix://"+l.Addr().String(), nil, func() {})
	if err != nil {
		t.Fatal(err)
	}
	svc := sandboxapi.NewTTRPCSandboxClient(client)
	for _, tc := range codeCases {
		_, err := svc.PingSandbox(context.Background(), &sandboxapi.PingRequest{SandboxID: tc.kind})
		err = fromShim(err)
		if got := kindsOf(err); len(got) != 1 || got[0] != tc.kind || !strings.Contains(err.Error(), "shim says "+tc.kind) {
			t.Errorf("%s: got %v (kinds %v)", tc.code, err, got)
		}
	}
	client.Close()
	_, err = svc.PingSandbox(context.Background(), &sandboxapi.PingRequest{SandboxID: "NotFound"})
	if err = fromShim(err); !errdefs.IsUnavailable(err) {
		t.Errorf("call on a closed connection: %v (kinds %v), want Unavailable", err, kindsOf(err))
	}
}
