// Command shim-wasm is crisp's WebAssembly sandboxer: a pod's containers are WASI
// preview 1 modules run with wazero, on the kit pkg/shimkit (see package wasm).
package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/crisp-runtime/crisp/internal/version"
	"github.com/crisp-runtime/crisp/pkg/shimkit"
	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
	"github.com/crisp-runtime/crisp/pkg/shimkit/pod"
	"github.com/crisp-runtime/crisp/wasm"
)

// runtimeName is what -info reports as the runtime's name.
const runtimeName = "crisp-shim-wasm"

// stateDir is the runner's state inside the shim's bundle.
const stateDir = "wasm"

// cacheDirName holds compiled modules, shared by the pods of one caller: next to the
// shims' bundles (crisp: <state_dir>/wasm-cache; containerd: next to its namespaces'
// task dirs), so it lives on the caller's state (tmpfs) and goes with it.
const cacheDirName = "wasm-cache"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == wasm.RunArg {
		// A container's process: it runs the module once the shim starts it.
		return wasm.RunChild(args[1:])
	}
	return shimkit.Main(args, shimkit.Binary{
		Name:         "shim-wasm",
		Product:      version.Name,
		Version:      version.Version,
		RuntimeName:  runtimeName,
		Features:     wasm.Features,
		StartOptions: bootstrap.StartOptions{Environ: environ},
		Delete:       deleteDead,
		Build:        services,
	})
}

// services are the kit's standard pod (pause process, pod cgroup) and the WASM runner.
func services(env shimkit.Env) (*shimkit.Services, error) {
	cache := filepath.Join(filepath.Dir(filepath.Dir(env.Bundle)), cacheDirName)
	runner, err := wasm.NewRunner(wasm.Config{StateDir: filepath.Join(env.Bundle, stateDir), CacheDir: cache, Logger: env.Log})
	if err != nil {
		return nil, err
	}
	return pod.Services(env, runtimeName, runner), nil
}

// deleteDead is `delete` after a dead shim: its containers' cgroups and mounts, then
// the pod (pause process, pod cgroup, files), then the socket.
func deleteDead(ctx context.Context, f bootstrap.Flags, stdout io.Writer, log *slog.Logger) error {
	return pod.Delete(ctx, f, stdout, log, func(bundle string) error {
		return wasm.CleanupDead(filepath.Join(bundle, stateDir), log)
	})
}

// environ is the serving shim's environment: one Go thread for Go code, and none of
// the variables the pause re-execution reads.
func environ(env []string) []string {
	kept := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "_CRISP_") {
			kept = append(kept, kv)
		}
	}
	return bootstrap.SetEnv(kept, map[string]string{"GOMAXPROCS": "1"})
}
