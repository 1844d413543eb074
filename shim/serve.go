package shim

import (
	"path/filepath"

	"github.com/crisp-runtime/crisp/internal/version"
	"github.com/crisp-runtime/crisp/pkg/shimkit"
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

// Binary is crisp's shim-runc for shimkit.Main: the kit's standard pod (pause
// process, pod cgroup) with its containers run by libcontainer (shim/runc).
func Binary() shimkit.Binary {
	return shimkit.Binary{
		Name:         "shim-runc",
		Product:      version.Name,
		Version:      version.Version,
		RuntimeName:  RuntimeName,
		Features:     Features,
		StartOptions: StartOptions(),
		Delete:       Delete,
		Build:        build,
	}
}

// build makes the serving shim's services.
func build(env shimkit.Env) (*shimkit.Services, error) {
	runner, err := runc.New(runc.Config{StateRoot: filepath.Join(env.Bundle, TaskStateDir), Logger: env.Log, Reaper: env.Reaper})
	if err != nil {
		return nil, err
	}
	return pod.Services(env, RuntimeName, runner), nil
}
