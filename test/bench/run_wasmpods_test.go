//go:build bench

package bench

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

var wasmOn = flag.Bool("wasm", true, "compare crisp's WebAssembly pods (shim-wasm) with its runc pods on one crisp with both handlers: -cycles pod cycles each, interleaved, then 10 pods each for memory (~1 min at 40)")

// wasmHandler is the runtime handler the comparison gives shim-wasm.
const wasmHandler = "wasm"

// wasmMemPods is how many pods of each handler run at once for the memory figures.
const wasmMemPods = 10

// wasmReadyWait bounds how long a wasm container may take to print its first line:
// a module compiled afresh takes seconds on a loaded machine.
const wasmReadyWait = 60 * time.Second

// buildWasmModule builds test/e2e/testdata/wasm/hello for wasip1 with the go command
// on PATH, as the e2e tests do, into a temporary directory removed right after. skip
// says why not when the go command cannot build for wasip1 or the module's source is
// not found (the bench runs outside the source tree).
func buildWasmModule() (module []byte, skip string, err error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, "no go command to build the WebAssembly module: " + err.Error(), nil
	}
	ports, err := exec.Command(goBin, "tool", "dist", "list").Output()
	if err != nil {
		return nil, fmt.Sprintf("%s tool dist list: %v: cannot tell whether it builds for wasip1", goBin, err), nil
	}
	if !slices.Contains(strings.Fields(string(ports)), "wasip1/wasm") {
		return nil, goBin + " cannot build for wasip1/wasm (not in go tool dist list)", nil
	}
	gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(gomod))
	if err != nil || mod == "" || mod == os.DevNull {
		return nil, fmt.Sprintf("not in crisp's module (go env GOMOD: %q, %v): no source for the WebAssembly module", mod, err), nil
	}
	src := filepath.Join(filepath.Dir(mod), "test", "e2e", "testdata", "wasm", "hello")
	if _, err := os.Stat(filepath.Join(src, "main.go")); err != nil {
		return nil, "no source for the WebAssembly module: " + err.Error(), nil
	}
	dir, err := os.MkdirTemp("", "crisp-bench-wasm-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "hello.wasm")
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("build %s for wasip1: %v\n%s", src, err, b)
	}
	module, err = os.ReadFile(out)
	return module, "", err
}

// wasmImage is an ordinary OCI image whose layer holds the module at /hello.wasm, its
// entrypoint, as the e2e tests' compat image.
func wasmImage(t *testing.T, module []byte) v1.Image {
	return imagetest.NewImage(t, imagetest.ImageOptions{
		Config:      v1.Config{Entrypoint: []string{"/hello.wasm"}},
		Annotations: map[string]string{"module.wasm.image/variant": "compat"},
	}, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip, imagetest.File("hello.wasm", string(module))))
}

// startCrispWasm starts criserver as StartCrisp does (own root, state, socket and
// CNI network; no metrics, NRI or tracing) with a second runtime handler,
// wasmHandler (shim-wasm from s.Bin, its default warm spare).
func startCrispWasm(ctx context.Context, s Spec) (*Daemon, error) {
	s.ExtraConfig += fmt.Sprintf("[runtimes.%s]\nshim = %q\nnamespace = \"k8s.io\"\n", wasmHandler, filepath.Join(s.Bin, "shim-wasm"))
	return StartCrisp(ctx, s)
}

// wasmCtrConfig is the container of a comparison pod: busybox's `sleep 3600` on runc,
// the module's entrypoint with sleep=forever on wasm. Both sleep until stopped.
func wasmCtrConfig(w *Workload) *cri.ContainerConfig {
	if w.Handler == wasmHandler {
		cfg := w.ctrConfig("hello")
		cfg.Args = []string{"sleep=forever"}
		return cfg
	}
	return w.ctrConfig("sleep", "sleep", "3600")
}

// waitOutput waits until the log at path has its first byte (a wasm container's
// module runs: it prints its arguments first).
func waitOutput(ctx context.Context, path string) error {
	deadline := time.Now().Add(wasmReadyWait)
	for {
		if st, err := os.Stat(path); err == nil && st.Size() > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no output in %s after %v", path, wasmReadyWait)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
}

// runWasmPod runs a pod on w's handler with its container (wasmCtrConfig) started and
// running, and returns the pod's and the container's ids and the times of the calls
// (Ready: from StartContainer's return until the container's first output, on wasm).
// On an error what it made is removed.
func runWasmPod(ctx context.Context, w *Workload, name string) (podID, ctrID string, c WasmCycle, err error) {
	rt := w.D.RT
	pod := w.podConfig(name)
	t := time.Now()
	rp, err := rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: w.Handler})
	if err != nil {
		return "", "", c, fmt.Errorf("run pod: %w", err)
	}
	c.Run = time.Since(t)
	id := rp.PodSandboxId
	fail := func(err error) (string, string, WasmCycle, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = rt.StopPodSandbox(cctx, &cri.StopPodSandboxRequest{PodSandboxId: id})
		_, _ = rt.RemovePodSandbox(cctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
		return "", "", c, err
	}
	cfg := wasmCtrConfig(w)
	t = time.Now()
	cc, err := rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: id, Config: cfg, SandboxConfig: pod})
	if err != nil {
		return fail(fmt.Errorf("create container: %w", err))
	}
	c.Create = time.Since(t)
	t = time.Now()
	if _, err := rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		return fail(fmt.Errorf("start container: %w", err))
	}
	c.Start = time.Since(t)
	if w.Handler == wasmHandler {
		t = time.Now()
		if err := waitOutput(ctx, filepath.Join(pod.LogDirectory, cfg.LogPath)); err != nil {
			return fail(err)
		}
		c.Ready = time.Since(t)
	}
	return id, cc.ContainerId, c, nil
}

// wasmCycle is one pod cycle on w's handler: runWasmPod, then StopContainer (no
// grace), StopPodSandbox and RemovePodSandbox, the calls of Workload.Cycle.
func wasmCycle(ctx context.Context, w *Workload) (WasmCycle, error) {
	rt := w.D.RT
	id, ctr, c, err := runWasmPod(ctx, w, "wcycle")
	if err != nil {
		return c, err
	}
	cleanup := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = rt.StopPodSandbox(cctx, &cri.StopPodSandboxRequest{PodSandboxId: id})
		_, _ = rt.RemovePodSandbox(cctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
	}
	t := time.Now()
	if _, err := rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: ctr, Timeout: 0}); err != nil {
		cleanup()
		return c, fmt.Errorf("stop container: %w", err)
	}
	c.Stop = time.Since(t)
	t = time.Now()
	if _, err := rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		cleanup()
		return c, fmt.Errorf("stop pod: %w", err)
	}
	c.StopPod = time.Since(t)
	t = time.Now()
	if _, err := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		cleanup()
		return c, fmt.Errorf("remove pod: %w", err)
	}
	c.Remove = time.Since(t)
	return c, nil
}

// verboseCtrPid is the host pid of a container's process, from its verbose
// ContainerStatus ("pid", as crisp reports it).
func verboseCtrPid(ctx context.Context, w *Workload, id string) (int, error) {
	st, err := w.D.RT.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, err
	}
	return sandboxPid(st.GetInfo()["info"])
}

// wasmPodsMem runs wasmMemPods pods on w's handler, each with its container running,
// and after settle reads each pod's shim, pause and container process.
func wasmPodsMem(ctx context.Context, t *testing.T, w *Workload) ([]WasmPodMem, error) {
	type pod struct{ id, ctr string }
	var pods []pod
	for i := range wasmMemPods {
		id, ctr, _, err := runWasmPod(ctx, w, fmt.Sprintf("wmem%d", i))
		if err != nil {
			return nil, err
		}
		pods = append(pods, pod{id, ctr})
	}
	time.Sleep(settle)
	var out []WasmPodMem
	for i, p := range pods {
		pause, err := w.SandboxPid(ctx, p.id)
		if err != nil {
			return nil, err
		}
		shim, err := PPid(pause)
		if err != nil {
			return nil, err
		}
		ctr, err := verboseCtrPid(ctx, w, p.ctr)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", p.ctr, err)
		}
		var m WasmPodMem
		for _, r := range []struct {
			pid int
			m   *Mem
		}{{shim, &m.Shim}, {pause, &m.Pause}, {ctr, &m.Ctr}} {
			if *r.m, err = ReadMem(r.pid); err != nil {
				return nil, fmt.Errorf("memory of %d (%s): %w", r.pid, Comm(r.pid), err)
			}
		}
		smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", ctr))
		if err != nil {
			return nil, err
		}
		if m.CtrKinds, err = SmapsUSS(smaps); err != nil {
			return nil, fmt.Errorf("container %d: %w", ctr, err)
		}
		if i == 0 {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ctr))
			t.Logf("wasm comparison: %s pod: shim %d (%s), pause %d (%s), container %d (%s)", w.D.Name+"/"+handlerName(w),
				shim, Comm(shim), pause, Comm(pause), ctr, strings.ReplaceAll(strings.TrimSpace(string(cmd)), "\x00", " "))
		}
		out = append(out, m)
	}
	return out, nil
}

func handlerName(w *Workload) string {
	if w.Handler == "" {
		return "runc"
	}
	return w.Handler
}

// dirKiB is the size of the files under dir in KiB.
func dirKiB(dir string) float64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return float64(n) / 1024
}

// runWasmCost starts one crisp with two runtime handlers, runc and wasm (shim-wasm),
// and runs -cycles pod cycles on each, interleaved round by round with the order
// alternating: on runc busybox's `sleep`, on wasm the e2e tests' hello module with
// sleep=forever, built here for wasip1 (skipped, with a log line, when the go command
// cannot). Three warm-up cycles each first; the first, for wasm the one that
// compiles the module into crisp's compilation cache, is reported on its own. Then,
// one handler at a time, wasmMemPods pods running at once for the memory of each
// pod's processes. It stores WasmResults and WasmMem in res and leaves nothing
// behind.
func runWasmCost(ctx context.Context, t *testing.T, root string, tmpl Spec, host, busybox string, res Results) error {
	t0 := time.Now()
	module, skip, err := buildWasmModule()
	if err != nil {
		return err
	}
	if skip != "" {
		t.Logf("wasm comparison skipped: %s", skip)
		return nil
	}
	if _, err := os.Stat(filepath.Join(tmpl.Bin, "shim-wasm")); err != nil {
		return fmt.Errorf("shim-wasm: %w (make build builds it)", err)
	}
	t.Logf("wasm comparison: the module built for wasip1 in %v (%d KiB)", time.Since(t0).Round(time.Millisecond), len(module)/1024)
	res["wasm_module_kib"] = float64(len(module)) / 1024
	imagetest.Push(t, host, "hello-wasm:bench", wasmImage(t, module))
	wasmRef := host + "/hello-wasm:bench"

	spec := tmpl
	spec.Name = "crisp-wasm"
	spec.Dir = filepath.Join(root, "wasm")
	spec.Bridge = fmt.Sprintf("benchwasm%d", *instance)
	// The last quarter of the crisp run's /16, which the tracing comparison leaves.
	spec.Subnet = nriSubnet(*instance, 3)
	spec.CgroupParent = "/bench-wasm"
	if *instance != 0 {
		spec.CgroupParent += fmt.Sprint(*instance)
	}
	if err := os.MkdirAll(spec.Dir, 0o711); err != nil {
		return err
	}
	d, stop, err := startRuntime(ctx, t, startCrispWasm, spec)
	defer stop()
	if err != nil {
		return fmt.Errorf("%s: %w", spec.Name, err)
	}
	ws := []*Workload{{D: d, Image: busybox}, {D: d, Image: wasmRef, Handler: wasmHandler}}
	for i, w := range ws {
		if _, err := w.Pull(ctx, w.Image); err != nil {
			return fmt.Errorf("wasm comparison %s: %w", WasmHandlers[i].Key, err)
		}
	}
	cycle := func(i int) (WasmCycle, error) {
		c, err := wasmCycle(ctx, ws[i])
		if err != nil {
			err = fmt.Errorf("wasm comparison %s: %w", WasmHandlers[i].Key, err)
		}
		return c, err
	}
	cold := make([]WasmCycle, len(ws))
	for k := range 3 { // warm-up: the first CNI run, the first shims, the module's compilation
		for i := range ws {
			c, err := cycle(i)
			if err != nil {
				return err
			}
			if k == 0 {
				cold[i] = c
				t.Logf("wasm comparison: first %s cycle: pod start %v, running %v", WasmHandlers[i].Key,
					c.PodStart().Round(time.Millisecond), c.Running().Round(time.Millisecond))
			}
		}
	}

	t.Logf("wasm comparison: %d pod cycles on each of %d handlers of one crisp, interleaved", *cycles, len(ws))
	runs := make([][]WasmCycle, len(ws))
	for r := range *cycles {
		for k := range ws {
			i := (r + k) % len(ws)
			c, err := cycle(i)
			if err != nil {
				return err
			}
			runs[i] = append(runs[i], c)
		}
	}
	if err := WasmResults(res, runs, cold); err != nil {
		return err
	}

	// Memory, one handler at a time: each handler's pods alone on the machine.
	mems := map[string][]WasmPodMem{}
	for i, w := range ws {
		t.Logf("wasm comparison: %d %s pods for memory", wasmMemPods, WasmHandlers[i].Key)
		ms, err := wasmPodsMem(ctx, t, w)
		if err != nil {
			return fmt.Errorf("wasm comparison %s: %w", WasmHandlers[i].Key, err)
		}
		mems[WasmHandlers[i].Key] = ms
		if err := w.RemoveAll(ctx, clients); err != nil {
			return fmt.Errorf("wasm comparison %s: remove the memory pods: %w", WasmHandlers[i].Key, err)
		}
	}
	res["wasm_cache_kib"] = dirKiB(filepath.Join(spec.Dir, "state", "wasm-cache"))
	t.Logf("wasm comparison took %v", time.Since(t0).Round(time.Second))
	return WasmMem(res, mems)
}
