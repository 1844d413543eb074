package shimkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	clog "github.com/containerd/log"
	"github.com/opencontainers/runtime-spec/specs-go/features"

	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
)

// Binary is a shim binary as Main runs it: its names, what -info and the version
// say, and the sandboxer's parts of `start`, `delete` and serving.
type Binary struct {
	// Name is the command's name in usage and errors ("shim-wasm").
	Name string
	// Product and Version are what --version prints ("crisp", "0.1.0").
	Product, Version string
	// RuntimeName is -info's runtime name ("crisp-shim-wasm").
	RuntimeName string
	// Features makes -info's OCI runtime features document, only for -info (probing
	// what the binary can run may cost syscalls no other mode should pay); nil, or a
	// nil document, prints none, and a runtime then assumes what the node offers.
	Features func() *features.Features
	// StartOptions adjust `start` (the serving shim's environment).
	StartOptions bootstrap.StartOptions
	// Delete is `delete` after a dead shim: clean up what it left, remove its socket
	// and print the DeleteResponse (pod.Delete for the kit's standard pod).
	Delete func(ctx context.Context, f bootstrap.Flags, stdout io.Writer, log *slog.Logger) error
	// Build makes the serving shim's services (Serve).
	Build func(Env) (*Services, error)
}

// Main runs the shim binary b with args (os.Args[1:]) as containerd's runtime-v2
// protocol calls it: -v/--version, -info, `start`, `delete`, or serving when none
// is given, with JSON logs on stderr (debug with -debug). It returns the exit code:
// 0, 1 on failure (the reason on stderr), 2 on bad usage. A sandboxer whose binary is
// also run as a helper of its own (a container's process) checks for that first.
func Main(args []string, b Binary) int {
	a, err := bootstrap.ParseArgs(b.Name, args, os.Stderr)
	if errors.Is(err, bootstrap.ErrUsage) {
		return 2
	}
	ctx := context.Background()
	switch {
	case err != nil:
	case a.Version:
		err = bootstrap.WriteVersion(os.Stdout, b.Product, b.Version)
	case a.Info:
		err = writeInfo(b)
	case a.Action == "start":
		// Silent on success: containerd reads stdout and stderr together as the result.
		err = bootstrap.Start(ctx, a.Flags, os.Stdin, os.Stdout, b.StartOptions)
	case a.Action == "delete":
		err = b.Delete(ctx, a.Flags, os.Stdout, Logger(os.Stderr, a.Debug, slog.LevelWarn))
	default:
		log := Logger(os.Stderr, a.Debug, slog.LevelInfo)
		slog.SetDefault(log)
		// ttrpc logs through containerd/log; keep shim.log one JSON stream.
		_ = clog.SetFormat(clog.JSONFormat)
		err = Serve(ctx, a.Flags, log, b.Build)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", b.Name, err)
		return 1
	}
	return 0
}

// writeInfo prints -info's RuntimeInfo with b's features document.
func writeInfo(b Binary) error {
	var doc *features.Features
	if b.Features != nil {
		doc = b.Features()
	}
	if doc == nil {
		return bootstrap.WriteInfo(os.Stdin, os.Stdout, b.RuntimeName, b.Version, nil)
	}
	feat, err := bootstrap.FeaturesAny(doc)
	if err != nil {
		return err
	}
	return bootstrap.WriteInfo(os.Stdin, os.Stdout, b.RuntimeName, b.Version, feat)
}

// Logger is the kit's JSON logger on w at level (debug when debug is set), as Main
// makes it for serving and `delete`.
func Logger(w io.Writer, debug bool, level slog.Level) *slog.Logger {
	if debug {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
