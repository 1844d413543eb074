package controller

import (
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/status"
)

// fromShim turns an error of a call to a shim into an errdefs kind, so that the CRI
// edge maps it to the right gRPC code without knowing it came over ttrpc. It is the
// controller's one translation at its shim edge: a shim's status code becomes its kind
// the way containerd's clients translate them (errgrpc), keeping the shim's message.
func fromShim(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ttrpc.ErrClosed) {
		// The shim went away (or the connection did): callers tell a dead shim by it.
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	if _, ok := status.FromError(err); !ok {
		// Not the shim's answer: the caller's context ending, or an error the
		// task-only sandboxer made in process, already of its kind. errgrpc would
		// make it ErrUnknown and lose what it wraps.
		return err
	}
	return errgrpc.ToNative(err)
}
