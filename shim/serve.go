package shim

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/crisp-runtime/crisp/pkg/shimkit"
	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
	"github.com/crisp-runtime/crisp/pkg/shimkit/pause"
	"github.com/crisp-runtime/crisp/pkg/shimkit/pod"
	"github.com/crisp-runtime/crisp/pkg/shimkit/reaper"
	"github.com/crisp-runtime/crisp/shim/runc"
)

// TaskStateDir is libcontainer's state root inside the shim's bundle.
const TaskStateDir = "libcontainer"

// The shim's reaper adopts the pause process that a pause joining containerd's user
// namespace forks (pause.Config.JoinUserNS).
var _ pause.Adopter = (*reaper.Reaper)(nil)

// Serve runs crisp's shim on the kit (shimkit.Serve): the kit's standard pod (pause
// process, pod cgroup), its containers with libcontainer (shim/runc).
func Serve(ctx context.Context, f bootstrap.Flags, log *slog.Logger) error {
	return shimkit.Serve(ctx, f, log, func(env shimkit.Env) (*shimkit.Services, error) {
		runner, err := runc.New(runc.Config{StateRoot: filepath.Join(env.Bundle, TaskStateDir), Logger: env.Log, Reaper: env.Reaper})
		if err != nil {
			return nil, err
		}
		return pod.Services(env, RuntimeName, runner), nil
	})
}
