// Command shim-wasm is crisp's WebAssembly sandboxer: a pod's containers are WASI
// preview 1 modules run with wazero, on the kit pkg/shimkit (see package wasm).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	clog "github.com/containerd/log"

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
	a, err := bootstrap.ParseArgs("shim-wasm", args, os.Stderr)
	if errors.Is(err, bootstrap.ErrUsage) {
		return 2
	}
	ctx := context.Background()
	switch {
	case err != nil:
	case a.Version:
		err = bootstrap.WriteVersion(os.Stdout, version.Name, version.Version)
	case a.Info:
		err = writeInfo()
	case a.Action == "start":
		err = bootstrap.Start(ctx, a.Flags, os.Stdin, os.Stdout, bootstrap.StartOptions{Environ: environ})
	case a.Action == "delete":
		err = deleteDead(ctx, a.Flags, os.Stdout, logger(os.Stderr, a.Debug, slog.LevelWarn))
	default:
		log := logger(os.Stderr, a.Debug, slog.LevelInfo)
		slog.SetDefault(log)
		// ttrpc logs through containerd/log; keep shim.log one JSON stream.
		_ = clog.SetFormat(clog.JSONFormat)
		err = shimkit.Serve(ctx, a.Flags, log, services)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim-wasm: %v\n", err)
		return 1
	}
	return 0
}

// writeInfo prints -info's RuntimeInfo with the runner's OCI features document.
func writeInfo() error {
	feat, err := bootstrap.FeaturesAny(wasm.Features())
	if err != nil {
		return err
	}
	return bootstrap.WriteInfo(os.Stdin, os.Stdout, runtimeName, version.Version, feat)
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
	bundle, err := bootstrap.BundleDir(f.Bundle)
	if err != nil {
		return err
	}
	ctrErr := wasm.CleanupDead(filepath.Join(bundle, stateDir), log)
	exit, podErr := pod.Cleanup(ctx, bundle, log)
	sockErr := bootstrap.RemoveSocket(f, bundle)
	if err := errors.Join(ctrErr, podErr, sockErr); err != nil {
		return fmt.Errorf("delete %s: %w", f.ID, err)
	}
	return bootstrap.WriteDeleteResponse(stdout, bootstrap.Exit{Pid: exit.Pid, Status: exit.Status, ExitedAt: exit.ExitedAt})
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

func logger(w io.Writer, debug bool, level slog.Level) *slog.Logger {
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
