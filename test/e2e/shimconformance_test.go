package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/testutil"
	"github.com/crisp-runtime/crisp/pkg/shimconformance"
)

// conformanceTimeout bounds each capability's check: crisp's and containerd's shims
// answer every check in well under a second here, gVisor's in under two.
const conformanceTimeout = 8 * time.Second

// unsettled marks, in an expected table, a capability whose result a shim gives one
// way or the other from run to run: it is reported, not compared.
const unsettled shimconformance.Status = "unsettled"

// expectTable compares a report with the statuses measured for a shim and reports
// every difference (a regression of the suite or a change of the shim).
func expectTable(t *testing.T, rep *shimconformance.Report, want map[string]shimconformance.Status) {
	t.Helper()
	for _, name := range shimconformance.Capabilities() {
		res, ok := rep.Result(name)
		if !ok {
			t.Errorf("%s: not run", name)
			continue
		}
		w, ok := want[name]
		if !ok {
			w = shimconformance.Pass
		}
		if w != unsettled && res.Status != w {
			t.Errorf("%s: %s (%s), measured before: %s", name, res.Status, res.Detail, w)
		}
	}
}

func logReport(t *testing.T, rep *shimconformance.Report) {
	t.Helper()
	var b strings.Builder
	_ = rep.WriteText(&b)
	t.Logf("\n%s", b.String())
}

// unmountAll detaches what runsc keeps mounted below its root (the empty network
// namespace it pins per root) once the test is over.
func unmountAll(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			_ = unix.Unmount(f[4], unix.MNT_DETACH)
		}
	}
}

// TestE2EShimConformance runs pkg/shimconformance against crisp's shim in both modes
// (every capability passes, or is not supported for the mode), containerd's runc shim
// 2.4.2 and gVisor's shim (each against its measured table), and checks the
// crisp-shimtest command. The four runs go in parallel: each has its own directory,
// cgroup parent and network namespace.
func TestE2EShimConformance(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	bin := buildBinaries(t)
	crispShim := filepath.Join(bin, "shim-runc")
	N, F := shimconformance.Unsupported, shimconformance.Fail
	sandboxNS := map[string]shimconformance.Status{
		"sandbox.create": N, "sandbox.start": N, "sandbox.status": N, "sandbox.ping": N,
		"sandbox.platform": N, "sandbox.metrics": N, "sandbox.stop": N, "sandbox.wait": N, "sandbox.shutdown": N,
	}
	with := func(base map[string]shimconformance.Status, more map[string]shimconformance.Status) map[string]shimconformance.Status {
		out := map[string]shimconformance.Status{}
		for k, v := range base {
			out[k] = v
		}
		for k, v := range more {
			out[k] = v
		}
		return out
	}

	t.Run("crisp-sandbox", func(t *testing.T) {
		t.Parallel()
		rep, err := shimconformance.Run(context.Background(), shimconformance.Config{
			Shim: crispShim, Mode: shimconformance.ModeSandbox, WorkDir: t.TempDir(), Timeout: conformanceTimeout,
		})
		if err != nil {
			t.Fatal(err)
		}
		logReport(t, rep)
		// Task Shutdown leaves a sandbox's shim up: ShutdownSandbox ends it.
		expectTable(t, rep, map[string]shimconformance.Status{"task.shutdown": N})
	})

	t.Run("crisp-task", func(t *testing.T) {
		t.Parallel()
		rep, err := shimconformance.Run(context.Background(), shimconformance.Config{
			Shim: crispShim, Mode: shimconformance.ModeTask, WorkDir: t.TempDir(), Timeout: conformanceTimeout,
		})
		if err != nil {
			t.Fatal(err)
		}
		logReport(t, rep)
		expectTable(t, rep, sandboxNS)
	})

	t.Run("containerd-shim-runc-v2", func(t *testing.T) {
		t.Parallel()
		cbin := containerdBinDir(t)
		dir := t.TempDir()
		opts, err := shimconformance.RuntimeOptions(map[string]any{
			"BinaryName": filepath.Join(cbin, "runc"), "Root": filepath.Join(dir, "runc"),
		}, true)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := shimconformance.Run(context.Background(), shimconformance.Config{
			Shim: filepath.Join(cbin, "containerd-shim-runc-v2"), Mode: shimconformance.ModeTask,
			WorkDir: dir, TaskOptions: opts, Timeout: conformanceTimeout,
		})
		if err != nil {
			t.Fatal(err)
		}
		logReport(t, rep)
		expectTable(t, rep, with(sandboxNS, map[string]shimconformance.Status{
			// 2.4.2 refuses a start without BootstrapParams when given runtime options.
			"bootstrap.legacy": N,
			"task.attach":      N, // crisp's own service
			// Its delete leaves a killed shim's socket (the serving shim removes it on exit).
			"shim.delete": F,
		}))
	})

	t.Run("containerd-shim-runsc-v1", func(t *testing.T) {
		t.Parallel()
		gbin := gvisorBinDir(t)
		dir := t.TempDir()
		t.Cleanup(func() { unmountAll(dir) })
		config, _ := writeRunscTOML(t, gbin, dir)
		opts, err := shimconformance.RuntimeOptions(map[string]any{
			"TypeUrl": "io.containerd.runsc.v1.options", "ConfigPath": config,
		}, false)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := shimconformance.Run(context.Background(), shimconformance.Config{
			Shim: filepath.Join(gbin, "containerd-shim-runsc-v1"), Mode: shimconformance.ModeTask,
			WorkDir: dir, TaskOptions: opts, Timeout: conformanceTimeout,
		})
		if err != nil {
			t.Fatal(err)
		}
		logReport(t, rep)
		expectTable(t, rep, with(sandboxNS, map[string]shimconformance.Status{
			"bootstrap.params": N, // answers the legacy JSON, ignoring BootstrapParams
			"task.pids":        F, // the sandbox's own pids, not the host's
			"task.attach":      N,
			"task.oom":         F, // a container's memory limit is not enforced
			"events.order":     F, // no /tasks/create, /tasks/delete for a container
			// Passes in some runs; in others Shutdown answers "ttrpc: marshal called
			// with nil" or times out while runsc removes the last containers.
			"task.shutdown": unsettled,
			"shim.delete":   F, // the socket of a killed shim is left
		}))
	})

	t.Run("command", func(t *testing.T) {
		t.Parallel()
		cmdBin := filepath.Join(bin, "crisp-shimtest")
		dir := t.TempDir()
		report := filepath.Join(dir, "report.json")
		run := func(args ...string) (string, int) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, cmdBin, args...).CombinedOutput()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return string(out), ee.ExitCode()
			}
			if err != nil {
				t.Fatalf("%v: %v", args, err)
			}
			return string(out), 0
		}
		out, code := run("--shim", crispShim, "--mode", "sandbox", "--json", report, "--workdir", dir,
			"--run", `^(bootstrap\.(params|info)|sandbox\.(create|start)|task\.(create|start|exit-code))$`, "--timeout", "10s")
		if code != 0 {
			t.Fatalf("exit %d on crisp's shim:\n%s", code, out)
		}
		data, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		var rep shimconformance.Report
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatalf("report %s: %v", data, err)
		}
		if rep.Shim != crispShim || rep.Mode != shimconformance.ModeSandbox || rep.Version == "" || len(rep.Results) != 7 {
			t.Errorf("report: shim %q mode %q version %q, %d results; want 7:\n%s", rep.Shim, rep.Mode, rep.Version, len(rep.Results), data)
		}
		for _, r := range rep.Results {
			if r.Status != shimconformance.Pass || r.Duration <= 0 || !strings.Contains(out, "PASS  "+r.Capability) {
				t.Errorf("%s: %s in %v; text:\n%s", r.Capability, r.Status, r.Duration, out)
			}
		}
		// A "shim" that answers start with nothing: exit 1, the failure named.
		out, code = run("--shim", "/bin/false", "--workdir", dir, "--run", `^bootstrap\.params$`, "--timeout", "5s")
		if code != 1 || !strings.Contains(out, "FAIL  bootstrap.params") {
			t.Errorf("exit %d with /bin/false, want 1 and a FAIL line:\n%s", code, out)
		}
		out, code = run("--mode", "vm")
		if code != 2 {
			t.Errorf("exit %d on bad usage, want 2:\n%s", code, out)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Errorf("work dir holds %d entries after the runs, want only the report: %v", len(entries), fmt.Sprint(entries))
		}
	})
}
