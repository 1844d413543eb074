package pod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
)

// Delete is `delete` after a dead shim of the standard pod (shimkit.Binary.Delete):
// containers(bundle) cleans up the sandboxer's containers first (they hold the pause
// process's namespaces, and their cgroups are siblings of the pod cgroup), then
// Cleanup removes the pod, then the socket goes and the DeleteResponse is printed.
// Each step runs even when one before it failed; running it again is harmless.
func Delete(ctx context.Context, f bootstrap.Flags, stdout io.Writer, log *slog.Logger, containers func(bundle string) error) error {
	bundle, err := bootstrap.BundleDir(f.Bundle)
	if err != nil {
		return err
	}
	ctrErr := containers(bundle)
	exit, podErr := Cleanup(ctx, bundle, log)
	sockErr := bootstrap.RemoveSocket(f, bundle)
	if err := errors.Join(ctrErr, podErr, sockErr); err != nil {
		return fmt.Errorf("delete %s: %w", f.ID, err)
	}
	return bootstrap.WriteDeleteResponse(stdout, bootstrap.Exit{Pid: exit.Pid, Status: exit.Status, ExitedAt: exit.ExitedAt})
}
