package cri

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// toStatus maps an internal error to the gRPC status the CRI client sees. It is the
// one place where error kinds become codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Unknown
	switch {
	case errdefs.IsInvalidArgument(err):
		code = codes.InvalidArgument
	case errdefs.IsNotFound(err):
		code = codes.NotFound
	case errdefs.IsAlreadyExists(err):
		code = codes.AlreadyExists
	case errdefs.IsFailedPrecondition(err), errdefs.IsConflict(err):
		code = codes.FailedPrecondition
	case errdefs.IsUnavailable(err):
		code = codes.Unavailable
	case errdefs.IsNotImplemented(err):
		code = codes.Unimplemented
	case errdefs.IsUnauthorized(err):
		code = codes.Unauthenticated
	case errdefs.IsPermissionDenied(err):
		code = codes.PermissionDenied
	case errdefs.IsDataLoss(err):
		code = codes.DataLoss
	case errdefs.IsResourceExhausted(err):
		code = codes.ResourceExhausted
	case errdefs.IsOutOfRange(err):
		code = codes.OutOfRange
	case errors.Is(err, context.DeadlineExceeded), errdefs.IsDeadlineExceeded(err):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled), errdefs.IsCanceled(err):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}

// invalid returns an InvalidArgument error with a formatted message.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrInvalidArgument, fmt.Sprintf(format, args...))
}
