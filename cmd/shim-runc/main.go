// Command shim-runc is crisp's per-pod shim; see package shim for its modes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	clog "github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"

	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
	"github.com/crisp-runtime/crisp/shim"
	"github.com/crisp-runtime/crisp/shim/runc"

	// Its C constructor joins namespaces before the Go runtime starts when libcontainer
	// re-executes this binary as a container's init.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

func init() {
	// libcontainer runs "/proc/self/exe init" as the container's init; that must happen
	// before anything else of the shim (as runc's own init.go does). Init never returns.
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == runc.HelperArg {
		// A short-lived task helper the shim runs for one container operation.
		return runc.RunHelper(args[1:], os.Stdin, os.Stdout, logger(os.Stderr, false, slog.LevelWarn))
	}
	a, err := bootstrap.ParseArgs("shim-runc", args, os.Stderr)
	if errors.Is(err, bootstrap.ErrUsage) {
		return 2
	}
	ctx := context.Background()
	switch {
	case err != nil:
	case a.Version:
		err = shim.WriteVersion(os.Stdout)
	case a.Info:
		err = shim.Info(os.Stdin, os.Stdout)
	case a.Action == "start":
		// Silent on success: containerd reads stdout and stderr together as the result.
		err = bootstrap.Start(ctx, a.Flags, os.Stdin, os.Stdout, shim.StartOptions())
	case a.Action == "delete":
		err = shim.Delete(ctx, a.Flags, os.Stdout, logger(os.Stderr, a.Debug, slog.LevelWarn))
	default:
		log := logger(os.Stderr, a.Debug, slog.LevelInfo)
		slog.SetDefault(log)
		// ttrpc logs through containerd/log; keep shim.log one JSON stream.
		_ = clog.SetFormat(clog.JSONFormat)
		err = shim.Serve(ctx, a.Flags, log)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim-runc: %v\n", err)
		return 1
	}
	return 0
}

func logger(w io.Writer, debug bool, level slog.Level) *slog.Logger {
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
