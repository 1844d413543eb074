// Command criserver is crisp's CRI server: kubelet and crictl talk to it over a unix
// socket, and it runs every pod in its own shim process.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/daemon"
	"github.com/crisp-runtime/crisp/internal/preflight"
	"github.com/crisp-runtime/crisp/internal/version"
)

func main() {
	fs := flag.NewFlagSet("criserver", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "TOML config file (defaults apply to keys it leaves out)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "usage: criserver [--config FILE] [--version]\n       criserver config default\n       criserver [--config FILE] check [--kubelet-config FILE]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *showVersion {
		fmt.Printf("%s criserver %s\n", version.Name, version.Version)
		return
	}
	if args := fs.Args(); len(args) > 0 {
		if args[0] == "check" {
			os.Exit(check(*cfgPath, args[1:]))
		}
		if len(args) == 2 && args[0] == "config" && args[1] == "default" {
			out, err := config.Default().Marshal()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if _, err := os.Stdout.Write(out); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			return
		}
		fs.Usage()
		os.Exit(2)
	}
	os.Exit(serve(*cfgPath))
}

// serve runs the CRI server with the config at cfgPath (the defaults when empty) and
// returns the exit code.
func serve(cfgPath string) int {
	// First: SIGHUP's default action ends the process, and `systemctl reload` may send
	// it while the server is still starting. The request waits in the channel until
	// the daemon can apply it.
	reload := make(chan os.Signal, 1)
	signal.Notify(reload, syscall.SIGHUP)
	defer signal.Stop(reload)
	cfg := config.Default()
	if cfgPath != "" {
		var err error
		if cfg, err = config.Load(cfgPath); err != nil {
			fmt.Fprintln(os.Stderr, "criserver:", err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log, level := daemon.NewLogger(cfg.LogLevel)
	err := daemon.Run(ctx, cfg, daemon.Options{ConfigPath: cfgPath, Log: log, Level: level, Reload: reload})
	if err != nil {
		fmt.Fprintln(os.Stderr, "criserver:", err)
		return 1
	}
	return 0
}

// check runs the preflight checks against the config criserver would run with and
// prints one line per check; it returns the exit code: 1 when a required check fails.
func check(cfgPath string, args []string) int {
	fs := flag.NewFlagSet("criserver check", flag.ContinueOnError)
	kubelet := fs.String("kubelet-config", preflight.DefaultKubeletConfig, "kubelet's config file, for its cgroupDriver")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "criserver check: unexpected arguments %q\n", fs.Args())
		return 2
	}
	cfg := config.Default()
	if cfgPath != "" {
		var err error
		if cfg, err = config.Load(cfgPath); err != nil {
			fmt.Fprintln(os.Stderr, "criserver:", err)
			return 1
		}
	}
	h := preflight.Default()
	h.KubeletConfig = *kubelet
	if preflight.Write(os.Stdout, preflight.Run(cfg, h)) {
		return 1
	}
	return 0
}
