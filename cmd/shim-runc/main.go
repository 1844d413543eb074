// Command shim-runc is crisp's per-pod shim; see package shim for its modes.
package main

import (
	"context"
	"flag"
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
	var (
		f            bootstrap.Flags
		info, versio bool
	)
	fs := flag.NewFlagSet("shim-runc", flag.ContinueOnError)
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
		err = shim.WriteVersion(os.Stdout)
	case info:
		err = shim.Info(os.Stdin, os.Stdout)
	case action == "start":
		// Silent on success: containerd reads stdout and stderr together as the result.
		err = bootstrap.Start(ctx, f, os.Stdin, os.Stdout, shim.StartOptions())
	case action == "delete":
		err = shim.Delete(ctx, f, os.Stdout, logger(os.Stderr, f.Debug, slog.LevelWarn))
	case action == "":
		log := logger(os.Stderr, f.Debug, slog.LevelInfo)
		slog.SetDefault(log)
		// ttrpc logs through containerd/log; keep shim.log one JSON stream.
		_ = clog.SetFormat(clog.JSONFormat)
		err = shim.Serve(ctx, f, log)
	default:
		err = fmt.Errorf("unknown action %q (want start, delete or none)", action)
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
