package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskapi "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	"github.com/crisp-runtime/crisp/shim/sandbox"
	"github.com/crisp-runtime/crisp/shim/task"
)

// Delete implements `shim-runc delete`: clean up after a dead shim (its containers'
// processes, cgroups and rootfs mounts, then the pause process, the pod cgroup and the
// socket) and print a protobuf DeleteResponse. Running it twice is harmless.
func Delete(ctx context.Context, f Flags, stdout io.Writer, log *slog.Logger) error {
	bundle, err := bundleDir(f.Bundle)
	if err != nil {
		return err
	}
	// Containers before the pause process: they hold its namespaces, and their cgroups
	// are siblings of the pod cgroup that Cleanup removes.
	ctrErr := task.CleanupDead(filepath.Join(bundle, TaskStateDir), log)
	exit, cleanupErr := sandbox.Cleanup(ctx, bundle, log)
	sockErr := removeSocket(f, bundle)
	if err := errors.Join(ctrErr, cleanupErr, sockErr); err != nil {
		return fmt.Errorf("delete %s: %w", f.ID, err)
	}
	data, err := proto.Marshal(&taskapi.DeleteResponse{
		Pid:        exit.Pid,
		ExitStatus: exit.Status,
		ExitedAt:   timestamppb.New(exit.ExitedAt),
	})
	if err != nil {
		return fmt.Errorf("encode delete response: %w", err)
	}
	_, err = stdout.Write(data)
	return err
}

// removeSocket removes the socket named in the bundle, or else the one the flags point
// to in the default socket dir.
func removeSocket(f Flags, bundle string) error {
	var path string
	if data, err := os.ReadFile(filepath.Join(bundle, AddressFile)); err == nil {
		path = strings.TrimPrefix(strings.TrimSpace(string(data)), "unix://")
	} else if f.ID != "" {
		ns := firstNonEmpty(f.Namespace, os.Getenv("NAMESPACE"), "default")
		path = SocketPath(DefaultSocketDir, firstNonEmpty(f.Address, os.Getenv("GRPC_ADDRESS")), ns, f.ID)
	}
	if path == "" || !filepath.IsAbs(path) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove socket: %w", err)
	}
	return nil
}
