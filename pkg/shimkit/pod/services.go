package pod

import (
	"github.com/crisp-runtime/crisp/pkg/shimkit"
	kitsandbox "github.com/crisp-runtime/crisp/pkg/shimkit/sandbox"
	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// Services are the parts of a serving shim on the standard pod: the kit's sandbox
// service over this package's Pod, and runner for its containers. name is the
// runtime's, for messages. A sandboxer whose containers are processes needs nothing
// else: `shimkit.Serve(ctx, flags, log, func(env shimkit.Env) (*shimkit.Services,
// error) { return pod.Services(env, name, runner), nil })`.
func Services(env shimkit.Env, name string, runner task.Runner) *shimkit.Services {
	p := New(Config{ID: env.ID, Bundle: env.Bundle, Logger: env.Log, Runner: env.Reaper})
	svc := kitsandbox.New(kitsandbox.Config{
		ID:                  env.ID,
		Name:                name,
		Pod:                 p,
		Logger:              env.Log,
		BeforeShutdownReply: env.RemoveSocket,
		AfterShutdownReply:  env.Exit,
	})
	return &shimkit.Services{Sandbox: svc, Runner: runner, PodFiles: p.PodFiles}
}
