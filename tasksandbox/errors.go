package tasksandbox

import (
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// isNotFound reports whether a task API call failed because the shim does not know
// the task: the shim's status code read as the controller and containerd's clients
// read it (errgrpc), or a NotFound made in process.
func isNotFound(err error) bool {
	return errdefs.IsNotFound(err) || errdefs.IsNotFound(errgrpc.ToNative(err))
}
