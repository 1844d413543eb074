package runc

import (
	"github.com/containerd/errdefs"

	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// The runner's errors are errdefs kinds with the message alone (task.Errorf): the
// helper's answer carries the kind as a gRPC code, and the task service returns it.

func invalid(format string, args ...any) error {
	return task.Errorf(errdefs.ErrInvalidArgument, format, args...)
}

func failedPrecondition(format string, args ...any) error {
	return task.Errorf(errdefs.ErrFailedPrecondition, format, args...)
}

func internal(format string, args ...any) error {
	return task.Errorf(errdefs.ErrInternal, format, args...)
}

func alreadyExists(format string, args ...any) error {
	return task.Errorf(errdefs.ErrAlreadyExists, format, args...)
}
