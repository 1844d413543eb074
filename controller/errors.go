package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fromShim turns a ttrpc status from a shim into an errdefs kind, so that the CRI
// edge maps it to the right gRPC code without knowing it came over ttrpc.
func fromShim(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ttrpc.ErrClosed) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	var kind error
	switch st.Code() {
	case codes.NotFound:
		kind = errdefs.ErrNotFound
	case codes.AlreadyExists:
		kind = errdefs.ErrAlreadyExists
	case codes.InvalidArgument:
		kind = errdefs.ErrInvalidArgument
	case codes.FailedPrecondition:
		kind = errdefs.ErrFailedPrecondition
	case codes.Unimplemented:
		kind = errdefs.ErrNotImplemented
	case codes.Unavailable:
		kind = errdefs.ErrUnavailable
	case codes.DeadlineExceeded:
		kind = context.DeadlineExceeded
	default:
		return errors.New(st.Message())
	}
	return fmt.Errorf("%w: %s", kind, st.Message())
}
