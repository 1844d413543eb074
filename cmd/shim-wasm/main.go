// Command shim-wasm is crisp's WebAssembly sandboxer: a pod's containers are WASI
// preview 1 modules run with wazero, on the kit pkg/shimkit (see package wasm).
package main

import (
	"context"
	"errors"
	"flag"
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
	kitsandbox "github.com/crisp-runtime/crisp/pkg/shimkit/sandbox"
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
	var (
		f            bootstrap.Flags
		info, versio bool
	)
	fs := flag.NewFlagSet("shim-wasm", flag.ContinueOnError)
	fs.StringVar(&f.Namespace, "namespace", "", "namespace that owns the shim")
	fs.StringVar(&f.Address, "address", "", "grpc address of the daemon (part of the socket name)")
	fs.StringVar(&f.PublishBinary, "publish-binary", "", "binary to publish events with (accepted for containerd compatibility)")
	fs.StringVar(&f.ID, "id", "", "id of the sandbox")
	fs.StringVar(&f.Bundle, "bundle", "", "bundle directory (default: the working directory)")
	fs.BoolVar(&f.Debug, "debug", false, "log at debug level")
	fs.BoolVar(&info, "info", false, "print the protobuf RuntimeInfo and exit")
	fs.BoolVar(&versio, "v", false, "print the version and exit")
	fs.BoolVar(&versio, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx := context.Background()
	var err error
	switch action := fs.Arg(0); {
	case versio:
		err = writeVersion(os.Stdout)
	case info:
		err = bootstrap.WriteInfo(os.Stdin, os.Stdout, runtimeName, versionString(), nil)
	case action == "start":
		err = bootstrap.Start(ctx, f, os.Stdin, os.Stdout, bootstrap.StartOptions{Environ: environ})
	case action == "delete":
		err = deleteDead(ctx, f, os.Stdout, logger(os.Stderr, f.Debug, slog.LevelWarn))
	case action == "":
		log := logger(os.Stderr, f.Debug, slog.LevelInfo)
		slog.SetDefault(log)
		// ttrpc logs through containerd/log; keep shim.log one JSON stream.
		_ = clog.SetFormat(clog.JSONFormat)
		err = shimkit.Serve(ctx, f, log, services)
	default:
		err = fmt.Errorf("unknown action %q (want start, delete or none)", action)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim-wasm: %v\n", err)
		return 1
	}
	return 0
}

// services are the kit's standard pod (pause process, pod cgroup) and the WASM runner.
func services(env shimkit.Env) (*shimkit.Services, error) {
	p := pod.New(pod.Config{ID: env.ID, Bundle: env.Bundle, Logger: env.Log, Runner: env.Reaper})
	svc := kitsandbox.New(kitsandbox.Config{
		ID:                  env.ID,
		Name:                runtimeName,
		Pod:                 p,
		Logger:              env.Log,
		BeforeShutdownReply: env.RemoveSocket,
		AfterShutdownReply:  env.Exit,
	})
	cache := filepath.Join(filepath.Dir(filepath.Dir(env.Bundle)), cacheDirName)
	runner, err := wasm.NewRunner(wasm.Config{StateDir: filepath.Join(env.Bundle, stateDir), CacheDir: cache, Logger: env.Log})
	if err != nil {
		return nil, err
	}
	return &shimkit.Services{Sandbox: svc, Runner: runner, PodFiles: p.PodFiles}, nil
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

func versionString() string { return version.Version }

func writeVersion(w io.Writer) error {
	return bootstrap.WriteVersion(w, version.Name, version.Version)
}

func logger(w io.Writer, debug bool, level slog.Level) *slog.Logger {
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
