package shim

import (
	"context"
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
	return pod.Delete(ctx, f, stdout, log, func(bundle string) error {
		return runc.CleanupDead(filepath.Join(bundle, TaskStateDir), log)
	})
}
