// Command crisp-shimtest checks a containerd runtime-v2 shim binary against the shim
// contract (package pkg/shimconformance) and prints one line per capability: PASS,
// FAIL with the reason, or N/S (not supported) with the reason. Exit status: 0 when
// nothing failed, 1 when something failed, 2 on bad usage or when the suite could not
// run.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/crisp-runtime/crisp/pkg/shimconformance"
)

const usage = `usage: crisp-shimtest --shim PATH [--mode sandbox|task] [--json FILE] [--rootfs DIR]
       [--workdir DIR] [--task-options TOML|@FILE] [--runc-binary PATH] [--runc-root DIR]
       [--runtime-options-type URL --runtime-config PATH] [--run REGEXP] [--timeout D] [-v]

Runtime options go into every task Create (and the shim's start) as containerd sends
them: containerd.runc.v1.Options for a shim whose name contains "runc", else
runtimeoptions.v1.Options. --task-options takes the keys of crisp's
[runtimes.NAME.options] table, as TOML lines, an inline table body
('BinaryName = "/usr/sbin/runc", Root = "/run/r"') or @FILE; --runc-binary and
--runc-root set BinaryName and Root, --runtime-options-type and --runtime-config set
TypeUrl and ConfigPath (gVisor: io.containerd.runsc.v1.options and a runsc TOML).

`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("crisp-shimtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	var (
		shim        = fs.String("shim", "", "the shim binary to check")
		mode        = fs.String("mode", "sandbox", "sandbox (the shim serves containerd.runtime.sandbox.v1) or task (a task-only shim)")
		jsonPath    = fs.String("json", "", "also write the report as JSON to this file (- for stdout)")
		rootfs      = fs.String("rootfs", "", "a busybox rootfs directory (default: built from /bin/busybox)")
		workdir     = fs.String("workdir", "", "where bundles, sockets and FIFOs go (default: a new directory under $TMPDIR)")
		taskOptions = fs.String("task-options", "", "runtime options as TOML (or @FILE)")
		runcBinary  = fs.String("runc-binary", "", "runc options: BinaryName")
		runcRoot    = fs.String("runc-root", "", "runc options: Root")
		optType     = fs.String("runtime-options-type", "", "runtimeoptions.v1.Options TypeUrl (e.g. io.containerd.runsc.v1.options)")
		optConfig   = fs.String("runtime-config", "", "runtimeoptions.v1.Options ConfigPath")
		runRE       = fs.String("run", "", "check only the capabilities matching this regular expression")
		timeout     = fs.Duration("timeout", shimconformance.DefaultTimeout, "time limit of each check")
		verbose     = fs.Bool("v", false, "print progress to stderr")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	bad := func(format string, a ...any) int {
		_, _ = fmt.Fprintf(stderr, "crisp-shimtest: "+format+"\n", a...)
		fs.Usage()
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *shim == "" {
		return bad("--shim is required")
	}
	cfg := shimconformance.Config{
		Shim:    *shim,
		Mode:    shimconformance.Mode(*mode),
		Rootfs:  *rootfs,
		WorkDir: *workdir,
		Timeout: *timeout,
	}
	if cfg.Mode != shimconformance.ModeSandbox && cfg.Mode != shimconformance.ModeTask {
		return bad("--mode %q: want sandbox or task", *mode)
	}
	if *runRE != "" {
		re, err := regexp.Compile(*runRE)
		if err != nil {
			return bad("--run: %v", err)
		}
		cfg.Run = re
	}
	table, err := optionsTable(*taskOptions, *runcBinary, *runcRoot, *optType, *optConfig)
	if err != nil {
		return bad("%v", err)
	}
	runc := shimconformance.IsRuncShim(*shim)
	if *runcBinary != "" || *runcRoot != "" {
		runc = true
	} else if *optType != "" || *optConfig != "" {
		runc = false
	}
	if cfg.TaskOptions, err = shimconformance.RuntimeOptions(table, runc); err != nil {
		return bad("runtime options: %v", err)
	}
	if *verbose {
		cfg.Log = func(format string, a ...any) { _, _ = fmt.Fprintf(stderr, format+"\n", a...) }
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := shimconformance.Run(ctx, cfg)
	if rep == nil {
		_, _ = fmt.Fprintf(stderr, "crisp-shimtest: %v\n", err)
		return 2
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "crisp-shimtest: cleanup: %v\n", err)
	}
	if werr := rep.WriteText(stdout); werr != nil {
		_, _ = fmt.Fprintf(stderr, "crisp-shimtest: %v\n", werr)
	}
	_, _ = fmt.Fprintf(stdout, "# took %s\n", time.Since(start).Round(10*time.Millisecond))
	if *jsonPath != "" {
		if werr := writeJSON(*jsonPath, rep, stdout); werr != nil {
			_, _ = fmt.Fprintf(stderr, "crisp-shimtest: %v\n", werr)
			return 2
		}
	}
	if rep.Failed() || err != nil {
		return 1
	}
	return 0
}

// optionsTable merges --task-options with the flags that set one key each.
func optionsTable(text, runcBinary, runcRoot, optType, optConfig string) (map[string]any, error) {
	table := map[string]any{}
	if strings.HasPrefix(text, "@") {
		data, err := os.ReadFile(text[1:])
		if err != nil {
			return nil, fmt.Errorf("--task-options: %w", err)
		}
		text = string(data)
	}
	if strings.TrimSpace(text) != "" {
		t, err := shimconformance.ParseOptionsTable(text)
		if err != nil {
			return nil, fmt.Errorf("--task-options: %w", err)
		}
		table = t
	}
	for key, v := range map[string]string{"BinaryName": runcBinary, "Root": runcRoot, "TypeUrl": optType, "ConfigPath": optConfig} {
		if v != "" {
			table[key] = v
		}
	}
	return table, nil
}

func writeJSON(path string, rep *shimconformance.Report, stdout io.Writer) error {
	if path == "-" {
		return rep.WriteJSON(stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
