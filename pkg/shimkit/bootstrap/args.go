package bootstrap

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// ErrUsage is a command line the flags refuse; the usage has been written.
var ErrUsage = errors.New("usage")

// Args are a shim binary's command line as containerd and crisp give it.
type Args struct {
	Flags
	// Info is -info (print the RuntimeInfo), Version -v or -version.
	Info, Version bool
	// Action is "start", "delete" or "" (serve).
	Action string
}

// ParseArgs parses a shim binary's command line: containerd's -namespace, -address,
// -publish-binary, -id, -bundle, -debug, plus -info and -v, then the action. name is
// the binary's, for the usage written to stderr on a bad flag (an error of ErrUsage);
// an unknown action is an error of its own, for the caller to report.
func ParseArgs(name string, args []string, stderr io.Writer) (Args, error) {
	var a Args
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&a.Namespace, "namespace", "", "namespace that owns the shim")
	fs.StringVar(&a.Address, "address", "", "grpc address of the daemon (part of the socket name)")
	fs.StringVar(&a.PublishBinary, "publish-binary", "", "binary to publish events with (accepted for containerd compatibility)")
	fs.StringVar(&a.ID, "id", "", "id of the sandbox")
	fs.StringVar(&a.Bundle, "bundle", "", "bundle directory (default: the working directory)")
	fs.BoolVar(&a.Debug, "debug", false, "log at debug level")
	fs.BoolVar(&a.Info, "info", false, "print the protobuf RuntimeInfo and exit")
	fs.BoolVar(&a.Version, "v", false, "print the version and exit")
	fs.BoolVar(&a.Version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return a, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	a.Action = fs.Arg(0)
	switch a.Action {
	case "", "start", "delete":
	default:
		if !a.Info && !a.Version {
			return a, fmt.Errorf("unknown action %q (want start, delete or none)", a.Action)
		}
	}
	return a, nil
}
