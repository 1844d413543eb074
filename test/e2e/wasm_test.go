package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// wasmHandler is the runtime handler the tests give shim-wasm, as a RuntimeClass
// `handler: wasm` names it.
const wasmHandler = "wasm"

// The CNCF wasm OCI artifact's media types, as wasm-pkg-tools and runwasi's
// oci-tar-builder push them.
const (
	wasmConfigMediaType = "application/vnd.wasm.config.v0+json"
	wasmLayerMediaType  = "application/vnd.wasm.content.layer.v1+wasm"
)

// motd is the file the OCI image's layer carries next to the module, which the module
// reads from its rootfs.
const motd = "message of the day\n"

var wasmBuild struct {
	once   sync.Once
	module []byte
	skip   string
	err    error
}

// wasmModule returns testdata/wasm/hello built for wasip1 (once per test binary, in a
// temporary directory removed right after). The test skips, saying why, when the go
// command cannot build for wasip1 at all; any other failed build fails it. Where
// CRISP_E2E_WASM_MODULE names a file, that is the module, built beforehand: the node
// VM has no go command (hack/nodevm/test-node.sh builds it on the host).
func wasmModule(t *testing.T) []byte {
	t.Helper()
	wasmBuild.once.Do(func() {
		if p := os.Getenv("CRISP_E2E_WASM_MODULE"); p != "" {
			wasmBuild.module, wasmBuild.err = os.ReadFile(p)
			return
		}
		// go test puts the go command that runs it first in PATH.
		goBin, err := exec.LookPath("go")
		if err != nil {
			wasmBuild.skip = "no go command to build the test's WebAssembly module: " + err.Error()
			return
		}
		ports, err := exec.Command(goBin, "tool", "dist", "list").Output()
		if err != nil {
			wasmBuild.skip = fmt.Sprintf("%s tool dist list: %v: cannot tell whether it builds for wasip1", goBin, err)
			return
		}
		if !slices.Contains(strings.Fields(string(ports)), "wasip1/wasm") {
			wasmBuild.skip = goBin + " cannot build for wasip1/wasm (not in go tool dist list)"
			return
		}
		dir, err := os.MkdirTemp("", "crisp-e2e-wasm-")
		if err != nil {
			wasmBuild.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "hello.wasm")
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, "./testdata/wasm/hello")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=")
		if b, err := cmd.CombinedOutput(); err != nil {
			wasmBuild.err = fmt.Errorf("build testdata/wasm/hello for wasip1: %v\n%s", err, b)
			return
		}
		wasmBuild.module, wasmBuild.err = os.ReadFile(out)
	})
	if wasmBuild.skip != "" {
		t.Skip(wasmBuild.skip)
	}
	if wasmBuild.err != nil {
		t.Fatal(wasmBuild.err)
	}
	return wasmBuild.module
}

// wasmCompatImage is an ordinary OCI image whose layer holds the module at
// /hello.wasm (its entrypoint) and /etc/motd, as crun's and runwasi's compat
// variant images are.
func wasmCompatImage(t *testing.T, module []byte) v1.Image {
	t.Helper()
	return imagetest.NewImage(t, imagetest.ImageOptions{
		Config:      v1.Config{Entrypoint: []string{"/hello.wasm"}, Env: []string{"FROM_IMAGE=yes"}},
		Annotations: map[string]string{"module.wasm.image/variant": "compat"},
	}, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip,
		imagetest.File("hello.wasm", string(module)), imagetest.Dir("etc"), imagetest.File("etc/motd", motd)))
}

// rawWasmManifest is a manifest pushed as it is.
type rawWasmManifest []byte

func (m rawWasmManifest) RawManifest() ([]byte, error) { return m, nil }
func (m rawWasmManifest) MediaType() (types.MediaType, error) {
	return types.OCIManifestSchema1, nil
}

// pushWasmArtifact pushes module to host as ref in the CNCF wasm artifact form: a
// wasm config with layerDigests and one raw module layer titled hello.wasm.
func pushWasmArtifact(t *testing.T, host, ref string, module []byte) {
	t.Helper()
	r, err := name.ParseReference(host+"/"+ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	upload := func(b []byte, mt string) descriptor {
		l := static.NewLayer(b, types.MediaType(mt))
		if err := ggcrremote.WriteLayer(r.Context(), l); err != nil {
			t.Fatalf("push blob: %v", err)
		}
		d, _ := l.Digest()
		return descriptor{MediaType: mt, Digest: d.String(), Size: len(b)}
	}
	layer := upload(module, wasmLayerMediaType)
	layer.Annotations = map[string]string{"org.opencontainers.image.title": "hello.wasm"}
	cfg, err := json.Marshal(map[string]any{
		"created": "2024-01-01T00:00:00Z", "author": "crisp e2e", "architecture": "wasm", "os": "wasip1",
		"layerDigests": []string{layer.Digest},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     string(types.OCIManifestSchema1),
		"config":        upload(cfg, wasmConfigMediaType),
		"layers":        []descriptor{layer},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ggcrremote.Put(r, rawWasmManifest(m)); err != nil {
		t.Fatalf("push manifest: %v", err)
	}
}

// pullWasmImages serves module from a registry of the test's as both image forms
// (wasmCompatImage, the CNCF artifact), pulls them, and returns their references.
func (e *env) pullWasmImages(ctx context.Context, t *testing.T, module []byte) (compat, artifact string) {
	t.Helper()
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "hello-wasm:compat", wasmCompatImage(t, module))
	pushWasmArtifact(t, host, "hello-wasm:artifact", module)
	compat, artifact = host+"/hello-wasm:compat", host+"/hello-wasm:artifact"
	for _, ref := range []string{compat, artifact} {
		if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("PullImage %s: %v", ref, err)
		}
	}
	return compat, artifact
}

// wasmCtr is a container of image whose process is the image's entrypoint (the module)
// with args, and env (KEY, VALUE pairs).
func wasmCtr(ctrName, image string, env []string, args ...string) *cri.ContainerConfig {
	cfg := ctrConfig(ctrName, image)
	cfg.Args = args
	for i := 0; i+1 < len(env); i += 2 {
		cfg.Envs = append(cfg.Envs, &cri.KeyValue{Key: env[i], Value: []byte(env[i+1])})
	}
	return cfg
}

// wasmPod runs pod podName on the wasm handler. When the test ends the pod is stopped
// and removed (shim.log first printed if the test failed), and nothing of it may be
// left: its shim, pause, `_run` children, mounts, cgroups, bundles and state.
func (e *env) wasmPod(ctx context.Context, t *testing.T, podName string) (string, *cri.PodSandboxConfig) {
	t.Helper()
	cfg := e.podConfig(podName)
	resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: wasmHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox %s on %s: %v", podName, wasmHandler, err)
	}
	id := resp.PodSandboxId
	st, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", podName, err)
	}
	var info podInfo
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatalf("verbose info of %s: %v: %q", podName, err, st.Info["info"])
	}
	if st.Status.GetRuntimeHandler() != wasmHandler {
		t.Errorf("pod %s: runtime handler %q, want %q", podName, st.Status.GetRuntimeHandler(), wasmHandler)
	}
	t.Cleanup(func() {
		if t.Failed() {
			shimLog, _ := os.ReadFile(filepath.Join(e.state, "sandboxes", id, "shim.log"))
			t.Logf("shim.log of pod %s:\n%s", podName, shimLog)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var ids []string
		if list, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: id}}); err == nil {
			for _, c := range list.Containers {
				ids = append(ids, c.Id)
			}
		}
		runs := e.wasmRuns(ids...)
		// A test may have removed it already.
		if _, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id}); status.Code(err) != codes.NotFound {
			if err := stopRemovePod(ctx, e.rt, id); err != nil {
				t.Error(err)
			}
		}
		e.assertPodGone(t, id, info)
		e.assertContainersGone(t, ids, runs)
	})
	return id, cfg
}

// assertContainersGone checks that nothing of removed wasm containers is left: their
// `_run` processes (pids), cgroups, bundles and rootfs mounts.
func (e *env) assertContainersGone(t *testing.T, ids []string, pids map[int]string) {
	t.Helper()
	for pid, cmd := range pids {
		if alive(pid) {
			t.Errorf("container process %d (%s) still running", pid, cmd)
		}
	}
	cgs := e.leakCgroupTree()
	for _, id := range ids {
		for ctrl, dirs := range cgs {
			for _, d := range dirs {
				if strings.Contains(d, id) {
					t.Errorf("container %s: cgroup %s/%s left", id, ctrl, d)
				}
			}
		}
		if _, err := os.Stat(filepath.Join(e.state, "containers", id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("container %s: bundle left (err %v)", id, err)
		}
		for _, m := range mountsUnder(e.dir) {
			if strings.Contains(m, id) {
				t.Errorf("container %s: mount %s left", id, m)
			}
		}
	}
}

// wasmProcs lists the running processes of the test's shim-wasm binary (serving
// shims, pause processes, `_run` containers) as pid → command line, without the warm
// spare shims criserver keeps.
func (e *env) wasmProcs() map[int]string {
	return e.wasmProcsOf(filepath.Join(binDir, "shim-wasm"))
}

// wasmProcsOf lists the live processes of the shim-wasm binary bin, warm spares left
// out, with their command lines.
func (e *env) wasmProcsOf(bin string) map[int]string {
	spares := map[int]bool{}
	for _, s := range e.warmSpares() {
		spares[spareShimPid(s)] = true
	}
	out := map[int]string{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || spares[pid] || !alive(pid) {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe")); err != nil || exe != bin {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		out[pid] = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return out
}

// wasmRuns lists the `shim-wasm _run BUNDLE` processes (the containers) of the
// containers ids, of every container when none is given.
func (e *env) wasmRuns(ids ...string) map[int]string {
	return wasmRunsIn(e.wasmProcs(), ids...)
}

// wasmRunsIn keeps the `_run` processes of procs (wasmProcsOf) of the containers ids,
// of every container when none is given.
func wasmRunsIn(procs map[int]string, ids ...string) map[int]string {
	out := map[int]string{}
	for pid, cmd := range procs {
		f := strings.Fields(cmd)
		if len(f) < 2 || f[1] != "_run" {
			continue
		}
		if len(ids) == 0 || slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(cmd, id) }) {
			out[pid] = cmd
		}
	}
	return out
}

// runWasmCtr creates and starts cfg in the pod and returns its id and log path.
func (e *env) runWasmCtr(ctx context.Context, podID string, pod *cri.PodSandboxConfig, cfg *cri.ContainerConfig) (string, string) {
	e.t.Helper()
	return e.runCtr(ctx, podID, pod, cfg), filepath.Join(pod.LogDirectory, cfg.LogPath)
}

// logStreams splits a CRI log's "stream text" lines into stdout's and stderr's texts.
func logStreams(lines []string) (stdout, stderr []string) {
	for _, l := range lines {
		if s, ok := strings.CutPrefix(l, "stdout "); ok {
			stdout = append(stdout, s)
		} else if s, ok := strings.CutPrefix(l, "stderr "); ok {
			stderr = append(stderr, s)
		}
	}
	return stdout, stderr
}

// helloStdout is what the module prints first: its arguments and variables.
func helloStdout(args []string, greeting, fromImage, name string) []string {
	var out []string
	for i, a := range args {
		out = append(out, fmt.Sprintf("arg[%d]=%s", i, a))
	}
	return append(out, "GREETING="+greeting, "FROM_IMAGE="+fromImage, "NAME="+name)
}

// cgroupOf is pid's cgroup path in the memory hierarchy (cgroup v1) or the unified one.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 && (f[1] == "memory" || (unifiedCgroup() && f[0] == "0")) {
			return f[2]
		}
	}
	t.Fatalf("no memory cgroup for %d in %q", pid, data)
	return ""
}

// TestE2EWasm runs WebAssembly modules as containers on the wasm runtime handler
// (shim-wasm): from an ordinary OCI image and from a CNCF wasm artifact, with args,
// env, exit codes, CRI logs, the module's memory limit, a stop with a grace period,
// stats, exec and terminals refused, several containers in a pod, and checks that
// stopping and removing the pods leaves nothing.
func TestE2EWasm(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	module := wasmModule(t)
	e := newEnv(t)
	e.appendConfig(fmt.Sprintf("[runtimes.%s]\nshim = %q\nnamespace = \"k8s.io\"\n", wasmHandler, filepath.Join(buildBinaries(t), "shim-wasm")))
	e.start()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	compat, artifact := e.pullWasmImages(ctx, t, module)
	_, subnet, err := net.ParseCIDR(e.subnet)
	if err != nil {
		t.Fatal(err)
	}

	// run runs a subtest with the env's helpers failing that subtest.
	run := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			parent := e.t
			e.t = t
			defer func() { e.t = parent }()
			start := time.Now()
			f(t)
			t.Logf("%s took %v", name, time.Since(start).Round(time.Millisecond))
		})
	}

	// The module from an ordinary image: args, env (the image's and the CRI's), a
	// file of its rootfs, both streams in the CRI log, its exit code; the pod has an
	// IP like any pod.
	run("oci-image", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-oci")
		st, info := e.status(ctx, podID)
		ip := st.GetNetwork().GetIp()
		if st.State != cri.PodSandboxState_SANDBOX_READY || !subnet.Contains(net.ParseIP(ip)) {
			t.Fatalf("pod %v with IP %q, want ready with an IP in %s", st.State, ip, e.subnet)
		}
		if addr := nsenterOut(t, "--net="+info.NetNS, "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(addr, " "+ip+"/") {
			t.Errorf("the pod's eth0 lacks %s: %s", ip, addr)
		}
		args := []string{"a b", "read=/etc/motd", "exit=3"}
		id, logPath := e.runWasmCtr(ctx, podID, pod, wasmCtr("hello", compat, []string{"GREETING", "hi there"}, args...))
		cs := e.waitExit(ctx, id, time.Minute)
		if cs.ExitCode != 3 || cs.Reason != "Error" || cs.FinishedAt < cs.StartedAt || cs.StartedAt < cs.CreatedAt {
			t.Errorf("exited %d (%q), created %d started %d finished %d; want exit 3, Error, in order",
				cs.ExitCode, cs.Reason, cs.CreatedAt, cs.StartedAt, cs.FinishedAt)
		}
		stdout, stderr := logStreams(waitLogLine(t, logPath, "stdout read /etc/motd: message of the day", 10*time.Second))
		want := append(helloStdout(append([]string{"/hello.wasm"}, args...), "hi there", "yes", ""), "read /etc/motd: message of the day")
		if !slices.Equal(stdout, want) || !slices.Equal(stderr, []string{"hello from stderr"}) {
			t.Errorf("log: stdout %q, stderr %q; want stdout %q, stderr [hello from stderr]", stdout, stderr, want)
		}
	})

	// The module from a CNCF wasm artifact: its layer is /hello.wasm in the rootfs,
	// the entrypoint, whole.
	run("wasm-artifact", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-artifact")
		args := []string{"read=/hello.wasm"}
		id, logPath := e.runWasmCtr(ctx, podID, pod, wasmCtr("artifact", artifact, []string{"NAME", "artifact"}, args...))
		cs := e.waitExit(ctx, id, time.Minute)
		if cs.ExitCode != 0 || cs.Reason != "Completed" {
			t.Errorf("exited %d (%q), want 0 (Completed)", cs.ExitCode, cs.Reason)
		}
		read := fmt.Sprintf("read /hello.wasm: a WebAssembly module of %d bytes", len(module))
		stdout, stderr := logStreams(waitLogLine(t, logPath, "stdout "+read, 10*time.Second))
		want := append(helloStdout(append([]string{"/hello.wasm"}, args...), "", "", "artifact"), read)
		if !slices.Equal(stdout, want) || !slices.Equal(stderr, []string{"hello from stderr"}) {
			t.Errorf("log: stdout %q, stderr %q; want stdout %q, stderr [hello from stderr]", stdout, stderr, want)
		}
	})

	// The CRI memory limit is the module's: 8 MiB fit in 32, 64 do not (137).
	run("memory-limit", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-memory")
		type result struct {
			id, log string
		}
		cases := []struct {
			name     string
			mib      int
			wantCode int32
		}{
			{name: "within", mib: 8, wantCode: 0},
			{name: "beyond", mib: 64, wantCode: 137},
		}
		started := make([]result, len(cases))
		for i, tc := range cases {
			cfg := wasmCtr(tc.name, compat, nil, fmt.Sprintf("hog=%d", tc.mib))
			cfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}
			started[i].id, started[i].log = e.runWasmCtr(ctx, podID, pod, cfg)
		}
		for i, tc := range cases {
			cs := e.waitExit(ctx, started[i].id, time.Minute)
			stdout, stderr := logStreams(readLogIfAny(t, started[i].log))
			allocated := slices.Contains(stdout, fmt.Sprintf("allocated %d MiB", tc.mib))
			// Over its limit the module was killed for memory, as kubelet shows an OOM kill.
			wantReason := map[int32]string{0: "Completed", 137: "OOMKilled"}[tc.wantCode]
			if cs.ExitCode != tc.wantCode || cs.Reason != wantReason || allocated != (tc.wantCode == 0) {
				t.Errorf("%s: %d MiB under a 32 MiB limit exited %d (%q), want %d (%s); stdout %q, stderr %q",
					tc.name, tc.mib, cs.ExitCode, cs.Reason, tc.wantCode, wantReason, stdout, stderr)
			}
			if tc.wantCode == 137 && !slices.ContainsFunc(stderr, func(l string) bool { return strings.Contains(l, "memory limit") }) {
				t.Errorf("%s: stderr %q does not say the module exceeded its memory limit", tc.name, stderr)
			}
			t.Logf("%s: %d MiB: exit %d, reason %q", tc.name, tc.mib, cs.ExitCode, cs.Reason)
		}
	})

	// StopContainer with a grace of 10 s: SIGTERM ends the sleeping module at once
	// (143), long before the SIGKILL would come.
	run("stop", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-stop")
		id, logPath := e.runWasmCtr(ctx, podID, pod, wasmCtr("sleeper", compat, nil, "sleep=forever"))
		waitLogLine(t, logPath, "stdout sleeping", 30*time.Second)
		pid := e.ctrPid(ctx, id)
		start := time.Now()
		if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: 10}); err != nil {
			t.Fatalf("StopContainer: %v", err)
		}
		took := time.Since(start)
		resp, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		cs := resp.Status
		t.Logf("StopContainer took %v: exit %d (%q)", took.Round(time.Millisecond), cs.ExitCode, cs.Reason)
		if took > 5*time.Second || cs.State != cri.ContainerState_CONTAINER_EXITED || cs.ExitCode != 143 {
			t.Errorf("StopContainer with a 10 s grace took %v, then %v exit %d; want well under 5 s, exited 143 (SIGTERM)",
				took, cs.State, cs.ExitCode)
		}
		if alive(pid) {
			t.Errorf("the container's process %d still runs after StopContainer", pid)
		}
		if stdout, _ := logStreams(readLogIfAny(t, logPath)); slices.Contains(stdout, "woke up") {
			t.Errorf("the module woke up: %q", stdout)
		}
	})

	// Stats of a sleeping module come from its container's cgroup, which its `_run`
	// process is in.
	run("stats", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-stats")
		id, logPath := e.runWasmCtr(ctx, podID, pod, wasmCtr("sleeper", compat, nil, "sleep=forever"))
		waitLogLine(t, logPath, "stdout sleeping", 30*time.Second)
		pid := e.ctrPid(ctx, id)
		if cmd := e.wasmRuns(id)[pid]; cmd == "" {
			t.Errorf("the container's pid %d is no shim-wasm _run process of it: %v", pid, e.wasmRuns())
		}
		cg := cgroupOf(t, pid)
		if !strings.Contains(cg, id) {
			t.Errorf("the container's process is in cgroup %s, not the container's", cg)
		}
		first, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: id})
		if err != nil {
			t.Fatalf("ContainerStats: %v", err)
		}
		time.Sleep(time.Second)
		resp, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: id})
		if err != nil {
			t.Fatalf("ContainerStats: %v", err)
		}
		fileCPU, fileMem := cgroupFiles(t, cg)
		st := resp.GetStats()
		cpu, mem := st.GetCpu().GetUsageCoreNanoSeconds().GetValue(), st.GetMemory().GetUsageBytes().GetValue()
		ws := st.GetMemory().GetWorkingSetBytes().GetValue()
		cores := st.GetCpu().GetUsageNanoCores()
		t.Logf("cpu %d ns (cgroup %d), %v nanocores; memory usage %d (cgroup %d), working set %d",
			cpu, fileCPU, cores.GetValue(), mem, fileMem, ws)
		if st.GetAttributes().GetId() != id || st.GetCpu().GetTimestamp() == 0 || st.GetMemory().GetTimestamp() == 0 {
			t.Errorf("stats of %q at %d/%d, want %s with timestamps", st.GetAttributes().GetId(), st.GetCpu().GetTimestamp(), st.GetMemory().GetTimestamp(), id)
		}
		if cpu == 0 || cpu > fileCPU || cpu < first.GetStats().GetCpu().GetUsageCoreNanoSeconds().GetValue() {
			t.Errorf("CPU usage %d ns (first %d), the cgroup's %d after: want > 0, growing, not beyond the cgroup's",
				cpu, first.GetStats().GetCpu().GetUsageCoreNanoSeconds().GetValue(), fileCPU)
		}
		if cores == nil || cores.GetValue() > 500_000_000 {
			t.Errorf("CPU usage of a sleeping module %v nanocores, want a rate well under half a core", cores)
		}
		if ws < 1<<20 || ws > mem || !near(mem, fileMem, 0.25) {
			t.Errorf("memory usage %d, working set %d; the cgroup's usage %d: want a working set > 1 MiB within the usage, the usage the cgroup's",
				mem, ws, fileMem)
		}
		// The pod's stats (the kit's pod, its cgroup and network) list the module's
		// container and count at least its memory.
		ps, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
		if err != nil {
			t.Fatalf("PodSandboxStats: %v", err)
		}
		lin := ps.GetStats().GetLinux()
		t.Logf("pod: cpu %d ns, memory %d, %d containers, network %v", lin.GetCpu().GetUsageCoreNanoSeconds().GetValue(),
			lin.GetMemory().GetWorkingSetBytes().GetValue(), len(lin.GetContainers()), lin.GetNetwork().GetDefaultInterface())
		if len(lin.GetContainers()) != 1 || lin.GetContainers()[0].GetAttributes().GetId() != id {
			t.Errorf("pod stats list containers %v, want the module's %s", lin.GetContainers(), id)
		}
		if lin.GetCpu().GetUsageCoreNanoSeconds().GetValue() == 0 || lin.GetMemory().GetWorkingSetBytes().GetValue() < ws/2 {
			t.Errorf("pod CPU %d ns, working set %d: want CPU > 0 and at least the module's working set (%d) roughly",
				lin.GetCpu().GetUsageCoreNanoSeconds().GetValue(), lin.GetMemory().GetWorkingSetBytes().GetValue(), ws)
		}
		if lin.GetNetwork().GetDefaultInterface().GetName() != "eth0" {
			t.Errorf("pod network %v, want eth0 of the pod's netns", lin.GetNetwork())
		}
	})

	// Status advertises no user namespaces for the handler (shim-wasm's -info lists
	// no namespace) while runc's keeps them, and a user-namespaced pod is refused
	// with the reason before anything is made.
	run("features", func(t *testing.T) {
		st, err := e.rt.Status(ctx, &cri.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]*cri.RuntimeHandlerFeatures{}
		for _, h := range st.GetRuntimeHandlers() {
			got[h.GetName()] = h.GetFeatures()
		}
		w, r := got[wasmHandler], got["runc"]
		if w == nil || w.GetUserNamespaces() || !w.GetRecursiveReadOnlyMounts() {
			t.Errorf("handler %s features %v, want recursive read-only mounts and no user namespaces", wasmHandler, w)
		}
		if r == nil || !r.GetUserNamespaces() {
			t.Errorf("handler runc features %v, want user namespaces (the node has them)", r)
		}
		cfg := e.podConfig("wasm-userns")
		cfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions = usernsOptions(100000, 65536)
		_, err = e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: wasmHandler})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"`+wasmHandler+`" does not run pods in user namespaces`) {
			t.Errorf("RunPodSandbox of a user-namespaced pod on %s: %v, want FailedPrecondition naming the handler", wasmHandler, err)
		}
		if list, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{LabelSelector: cfg.Labels}}); err != nil || len(list.GetItems()) != 0 {
			t.Errorf("after the refused pod: %v (%v), want no pod", list.GetItems(), err)
		}
	})

	// Attach streams the module's stdout and feeds its stdin (the kit's attach,
	// as for any container): the module echoes what it reads and ends at stdin's end.
	run("attach", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-attach")
		cfg := wasmCtr("cat", compat, nil, "cat=echo ")
		cfg.Stdin, cfg.StdinOnce = true, true
		id, logPath := e.runWasmCtr(ctx, podID, pod, cfg)
		as := e.attach(ctx, t, id, spdyTransport, false, strings.NewReader("meow\npurr\n"))
		as.ended(t, 30*time.Second)
		cs := e.waitExit(ctx, id, time.Minute)
		if cs.ExitCode != 0 {
			t.Errorf("the attached module exited %d (%q), want 0", cs.ExitCode, cs.Reason)
		}
		for _, want := range []string{"echo meow", "echo purr", "cat: 2 lines"} {
			if !strings.Contains(as.out.String(), want+"\n") {
				t.Errorf("attach's stdout %q lacks %q", as.out.String(), want)
			}
		}
		stdout, _ := logStreams(waitLogLine(t, logPath, "stdout cat: 2 lines", 10*time.Second))
		if !slices.Contains(stdout, "echo meow") {
			t.Errorf("the log's stdout %q lacks what attach fed the module", stdout)
		}
	})

	// Nothing can be executed in a module, and a module has no terminal.
	run("exec-and-tty", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-exec")
		id, logPath := e.runWasmCtr(ctx, podID, pod, wasmCtr("sleeper", compat, nil, "sleep=forever"))
		waitLogLine(t, logPath, "stdout sleeping", 30*time.Second)
		resp, err := e.execSync(ctx, id, 10, "/hello.wasm", "exit=0")
		t.Logf("ExecSync: %v", err)
		if err == nil {
			t.Errorf("ExecSync in a wasm container succeeded (exit %d, stdout %q), want an error", resp.ExitCode, resp.Stdout)
		} else if s, _ := status.FromError(err); s.Code() != codes.Unimplemented && !strings.Contains(s.Message(), "one module") {
			t.Errorf("ExecSync: %v; want Unimplemented or the runtime's reason", err)
		}
		if cs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id}); err != nil || cs.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("after the refused exec the container is %v (%v), want running", cs.GetStatus().GetState(), err)
		}

		tty := wasmCtr("tty", compat, nil)
		tty.Tty, tty.Stdin = true, true
		created, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: tty, SandboxConfig: pod})
		t.Logf("CreateContainer with tty: %v", err)
		if err == nil {
			t.Errorf("CreateContainer with a terminal succeeded (%s), want InvalidArgument", created.ContainerId)
		} else if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), "terminal") {
			t.Errorf("CreateContainer with a terminal: %v; want InvalidArgument saying a module has no terminal", err)
		}
		list, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: podID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Containers) != 1 || list.Containers[0].Id != id {
			t.Errorf("containers of the pod after the refused one: %v, want only the sleeper", list.Containers)
		}
	})

	// Containers of one pod run and exit on their own: each its code, its log, while
	// another keeps running, and one removed leaves the others be.
	run("several-containers", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-several")
		type ctr struct {
			name     string
			env      []string
			args     []string
			wantCode int32 // -1: still running
			id, log  string
		}
		ctrs := []*ctr{
			{name: "zero", args: nil, wantCode: 0},
			{name: "five", env: []string{"EXIT_CODE", "5"}, args: []string{"sleep=300ms"}, wantCode: 5},
			{name: "seven", args: []string{"sleep=1s", "exit=7"}, wantCode: 7},
			{name: "sleeper", args: []string{"sleep=forever"}, wantCode: -1},
		}
		for _, c := range ctrs {
			c.id, c.log = e.runWasmCtr(ctx, podID, pod, wasmCtr(c.name, compat, append([]string{"NAME", c.name}, c.env...), c.args...))
		}
		for _, c := range ctrs {
			if c.wantCode < 0 {
				continue
			}
			cs := e.waitExit(ctx, c.id, time.Minute)
			if cs.ExitCode != c.wantCode {
				t.Errorf("%s exited %d, want %d", c.name, cs.ExitCode, c.wantCode)
			}
		}
		sleeper := ctrs[len(ctrs)-1]
		waitLogLine(t, sleeper.log, "stdout sleeping", 30*time.Second)
		for _, c := range ctrs {
			stdout, _ := logStreams(readLogIfAny(t, c.log))
			want := helloStdout(append([]string{"/hello.wasm"}, c.args...), "", "yes", c.name)
			if len(stdout) < len(want) || !slices.Equal(stdout[:len(want)], want) {
				t.Errorf("%s's log: %q, want it to start with %q", c.name, stdout, want)
			}
		}
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctrs[0].id}); err != nil {
			t.Fatalf("RemoveContainer %s: %v", ctrs[0].name, err)
		}
		e.assertContainersGone(t, []string{ctrs[0].id}, nil)
		resp, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: sleeper.id})
		if err != nil || resp.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("sleeper after the others exited and one was removed: %v (%v), want running", resp.GetStatus().GetState(), err)
		}
		if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: sleeper.id, Timeout: 10}); err != nil {
			t.Fatal(err)
		}
		if cs := e.waitExit(ctx, sleeper.id, 5*time.Second); cs.ExitCode != 143 {
			t.Errorf("sleeper stopped: exit %d, want 143", cs.ExitCode)
		}
	})

	// A pod stopped and removed with a running, a created and an exited container
	// leaves nothing: no container processes, shims, pause, mounts, cgroups.
	run("cleanup", func(t *testing.T) {
		podID, pod := e.wasmPod(ctx, t, "wasm-cleanup")
		_, info := e.status(ctx, podID)
		running, logPath := e.runWasmCtr(ctx, podID, pod, wasmCtr("running", compat, nil, "sleep=forever"))
		exited, _ := e.runWasmCtr(ctx, podID, pod, wasmCtr("exited", compat, nil))
		resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: wasmCtr("created", compat, nil), SandboxConfig: pod})
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
		created := resp.ContainerId
		waitLogLine(t, logPath, "stdout sleeping", 30*time.Second)
		e.waitExit(ctx, exited, time.Minute)
		ids := []string{running, exited, created}
		runningRuns, createdRuns := e.wasmRuns(running), e.wasmRuns(created)
		if len(runningRuns) != 1 || len(createdRuns) != 1 || len(e.wasmRuns(exited)) != 0 {
			t.Errorf("_run processes: running %v, created %v, exited %v; want one each for the running and the created",
				runningRuns, createdRuns, e.wasmRuns(exited))
		}
		if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
			t.Fatalf("StopPodSandbox: %v", err)
		}
		// The running container is stopped with the pod; the created one, never
		// started, is left to RemovePodSandbox, as crisp (and containerd) leave a runc
		// container's waiting init.
		for pid, cmd := range runningRuns {
			if alive(pid) {
				t.Errorf("the running container's process %d (%s) still runs after StopPodSandbox", pid, cmd)
			}
		}
		for _, id := range []string{running, exited} {
			if cs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id}); err != nil || cs.Status.State != cri.ContainerState_CONTAINER_EXITED {
				t.Errorf("container %s after StopPodSandbox: %v (%v), want exited", id, cs.GetStatus().GetState(), err)
			}
		}
		if st, _ := e.status(ctx, podID); st.State != cri.PodSandboxState_SANDBOX_NOTREADY {
			t.Errorf("pod after StopPodSandbox: %v, want not ready", st.State)
		}
		if alive(info.Pid) {
			t.Errorf("the pod's pause %d still runs after StopPodSandbox", info.Pid)
		}
		runs := runningRuns
		maps.Copy(runs, createdRuns)
		if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
			t.Fatalf("RemovePodSandbox: %v", err)
		}
		e.assertPodGone(t, podID, info)
		e.assertContainersGone(t, ids, runs)
	})

	// After every pod is gone: nothing of the wasm pods is left on the node.
	run("node-clean", func(t *testing.T) {
		list, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 0 {
			t.Fatalf("pods left: %v", list.Items)
		}
		e.assertNodeClean(t)
		var procs map[int]string
		if !eventually(5*time.Second, func() bool { procs = e.wasmProcs(); return len(procs) == 0 }) {
			t.Errorf("shim-wasm processes left (warm spares aside): %v", procs)
		}
		for ctrl, dirs := range e.leakCgroupTree() {
			if len(dirs) > 0 {
				t.Errorf("cgroups left in %s: %v", ctrl, dirs)
			}
		}
		if left := leakDirNames(filepath.Join(e.state, "containers")); len(left) > 0 {
			t.Errorf("container bundles left: %v", left)
		}
		for _, m := range mountsUnder(e.dir) {
			// The netns directory's own mount is criserver's, made once.
			if m != filepath.Join(e.state, "netns") && !slices.ContainsFunc(e.warmSpares(), func(s warmSpare) bool { return strings.Contains(m, s.id) }) {
				t.Errorf("mount left: %s", m)
			}
		}
	})
}
