package tasksandbox

import (
	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// isNotFound reports whether a task API call failed because the shim does not know
// the task: ttrpc carries the shim's gRPC status code.
func isNotFound(err error) bool {
	return status.Code(err) == codes.NotFound || errdefs.IsNotFound(err)
}
