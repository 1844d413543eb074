package run

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// ExitUsage is Main's exit code when its arguments are wrong (as docker run's 125 for
// its own failures); a bundle that does not load is ExitCannotRun.
const ExitUsage = 125

// Main is the `shim-wasm _run [--cache-dir DIR] [--oom-file FILE] BUNDLE` child: the shim starts it
// with the container's stdio as fds 0-2 and in the container's cgroup. It runs the
// bundle's module and returns the exit code for os.Exit: the module's, or one of
// the Exit constants. SIGTERM and SIGINT stop the module (ExitTerminated). Errors
// go to stderr, the container's log. A run that ends over the memory limit creates
// FILE first: ExitMemoryLimit alone cannot tell it from a SIGKILL.
func Main(args []string) int {
	fs := flag.NewFlagSet("_run", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	cacheDir := fs.String("cache-dir", "", "directory of compiled modules shared between runs")
	oomFile := fs.String("oom-file", "", "file to create when the module exceeds its memory limit")
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: _run [--cache-dir DIR] [--oom-file FILE] BUNDLE")
		return ExitUsage
	}
	plan, err := Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "wasm: %v\n", err)
		return ExitCannotRun
	}
	plan.CacheDir = *cacheDir

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			cancel(fmt.Errorf("%w by %v", ErrTerminated, s))
		case <-ctx.Done():
		}
	}()
	code, err := plan.Run(ctx, os.Stdin, os.Stdout, os.Stderr)
	// A termination asked for is no error of the module's: the log stays the module's.
	if err != nil && !errors.Is(err, ErrTerminated) {
		fmt.Fprintf(os.Stderr, "wasm: %v\n", err)
	}
	if errors.Is(err, ErrMemoryLimit) && *oomFile != "" {
		if f, ferr := os.Create(*oomFile); ferr != nil {
			fmt.Fprintf(os.Stderr, "wasm: record the memory limit's kill: %v\n", ferr)
		} else {
			_ = f.Close()
		}
	}
	return code
}
