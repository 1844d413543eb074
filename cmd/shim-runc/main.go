// Command shim-runc is crisp's per-pod shim; see package shim for its modes.
package main

import (
	"log/slog"
	"os"

	"github.com/opencontainers/runc/libcontainer"

	"github.com/crisp-runtime/crisp/pkg/shimkit"
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
		return runc.RunHelper(args[1:], os.Stdin, os.Stdout, shimkit.Logger(os.Stderr, false, slog.LevelWarn))
	}
	return shimkit.Main(args, shim.Binary())
}
