package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
	"github.com/crisp-runtime/crisp/pkg/shimkit/pod"
	"github.com/crisp-runtime/crisp/shim/runc"
)

// Delete implements `shim-runc delete`: clean up after a dead shim (its containers'
// processes, cgroups and rootfs mounts, then the pause process, the pod cgroup and the
// socket) and print a protobuf DeleteResponse. Running it twice is harmless.
func Delete(ctx context.Context, f bootstrap.Flags, stdout io.Writer, log *slog.Logger) error {
	bundle, err := bootstrap.BundleDir(f.Bundle)
	if err != nil {
		return err
	}
	// Containers before the pause process: they hold its namespaces, and their cgroups
	// are siblings of the pod cgroup that Cleanup removes.
	ctrErr := runc.CleanupDead(filepath.Join(bundle, TaskStateDir), log)
	exit, cleanupErr := pod.Cleanup(ctx, bundle, log)
	sockErr := bootstrap.RemoveSocket(f, bundle)
	if err := errors.Join(ctrErr, cleanupErr, sockErr); err != nil {
		return fmt.Errorf("delete %s: %w", f.ID, err)
	}
	return bootstrap.WriteDeleteResponse(stdout, bootstrap.Exit{Pid: exit.Pid, Status: exit.Status, ExitedAt: exit.ExitedAt})
}
