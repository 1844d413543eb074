package task

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestGRPCStatus: the edge conversion gives each kind its gRPC code and keeps the
// message exactly as the shim wrote it; statuses and errors of no kind pass as they are.
func TestGRPCStatus(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{notFound("container %q not found", "c1"), codes.NotFound, `container "c1" not found`},
		{invalid("bad %s", "id"), codes.InvalidArgument, "bad id"},
		{alreadyExists("exists"), codes.AlreadyExists, "exists"},
		{failedPrecondition("not running"), codes.FailedPrecondition, "not running"},
		{internal("broke"), codes.Internal, "broke"},
		{withKind(context.DeadlineExceeded, "CRIU was killed"), codes.DeadlineExceeded, "CRIU was killed"},
		{context.Canceled, codes.Canceled, "context canceled"},
		{fmt.Errorf("wrapped: %w", errdefs.ErrNotFound), codes.NotFound, "wrapped: not found"},
		{withKind(kindOf(codes.FailedPrecondition), "from a helper"), codes.FailedPrecondition, "from a helper"},
		{status.Error(codes.Aborted, "as is"), codes.Aborted, "as is"},
	} {
		st, ok := status.FromError(GRPCStatus(tt.err))
		if !ok || st.Code() != tt.code || st.Message() != tt.msg {
			t.Errorf("GRPCStatus(%v) = %v %q, want %v %q", tt.err, st.Code(), st.Message(), tt.code, tt.msg)
		}
	}
	plain := errors.New("no kind")
	if got := GRPCStatus(plain); got != plain {
		t.Errorf("GRPCStatus of an error of no kind = %v, want it unchanged", got)
	}
	if GRPCStatus(nil) != nil {
		t.Error("GRPCStatus(nil) is not nil")
	}
}
