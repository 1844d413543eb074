package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// gvisorVersion is the gVisor hack/gvisor.sh builds into its cache.
const gvisorVersion = "v0.0.0-20260905035102-160fafc42237"

// gvisorBinDir is where hack/gvisor.sh caches runsc and containerd-shim-runsc-v1; the
// test skips, saying how to build them, when they are not there.
func gvisorBinDir(t *testing.T) string {
	t.Helper()
	return cachedBinDir(t, "GVISOR_CACHE", "/var/cache/crisp/gvisor-"+gvisorVersion, "hack/gvisor.sh", "runsc", "containerd-shim-runsc-v1")
}

// TestE2EGVisor: gVisor's shim as a task-only runtime handler (runsc on its systrap
// platform, configured as gVisor documents it for containerd): a pod, a container's
// output and exit code in its log, exec, networking between containers over the pod's
// loopback, stats, and stop/remove leaving no gVisor process behind.
func TestE2EGVisor(t *testing.T) {
	needRoot(t)
	bin := gvisorBinDir(t)
	e := newEnv(t)
	toml := filepath.Join(e.dir, "runsc.toml")
	runscRoot := filepath.Join(e.dir, "runsc-root")
	if err := os.WriteFile(toml, []byte(fmt.Sprintf("binary_name = %q\nroot = %q\n[runsc_config]\nplatform = \"systrap\"\n",
		filepath.Join(bin, "runsc"), runscRoot)), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(e.cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "[runtimes.runsc]\nshim = %q\nsandbox_mode = \"task\"\n[runtimes.runsc.options]\nTypeUrl = \"io.containerd.runsc.v1.options\"\nConfigPath = %q\n",
		filepath.Join(bin, "containerd-shim-runsc-v1"), toml)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("gvisor")
	start := time.Now()
	resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: "runsc"})
	if err != nil {
		t.Fatalf("RunPodSandbox on runsc: %v\n%s", err, e.log())
	}
	t.Logf("RunPodSandbox on gVisor: %v", time.Since(start))
	podID := resp.PodSandboxId
	if st, _ := e.status(ctx, podID); st.State != cri.PodSandboxState_SANDBOX_READY || st.GetNetwork().GetIp() == "" {
		t.Errorf("pod %v with IP %q", st.State, st.GetNetwork().GetIp())
	}

	// The container runs on gVisor's kernel: its uname says so.
	hello := e.runCtr(ctx, podID, pod, ctrConfig("hello", img, "sh", "-c", "echo hello from $(uname -r); echo err >&2; exit 3"))
	cs := e.waitExit(ctx, hello, 30*time.Second)
	lines := strings.Join(logLines(t, cs.LogPath), "|")
	if cs.ExitCode != 3 || cs.Reason != "Error" || !strings.Contains(lines, "stdout hello from") || !strings.Contains(lines, "gvisor") || !strings.Contains(lines, "stderr err") {
		t.Errorf("hello: exit %d reason %q log %q", cs.ExitCode, cs.Reason, lines)
	}

	server := e.runCtr(ctx, podID, pod, ctrConfig("server", img, "sh", "-c", "while true; do echo pong | nc -l -p 8080; done"))
	ex, err := e.execSync(ctx, server, 10, "sh", "-c", "echo out; echo err >&2; exit 7")
	if err != nil || string(ex.Stdout) != "out\n" || string(ex.Stderr) != "err\n" || ex.ExitCode != 7 {
		t.Errorf("ExecSync: %q %q %d %v", ex.GetStdout(), ex.GetStderr(), ex.GetExitCode(), err)
	}
	// The pod's containers share gVisor's netstack: a client reaches the server on
	// 127.0.0.1 (the server may need a moment to listen).
	client := e.runCtr(ctx, podID, pod, ctrConfig("client", img, "sh", "-c",
		"for i in 1 2 3 4 5 6 7 8 9 10; do nc 127.0.0.1 8080 </dev/null && break; sleep 0.5; done; sleep 3600"))
	waitFor(t, 30*time.Second, "the client to read pong", func() bool {
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: client})
		return err == nil && strings.Contains(strings.Join(readLogIfAny(t, st.GetStatus().GetLogPath()), "|"), "pong")
	})
	if st, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: server}); err != nil || st.GetStats().GetAttributes().GetId() != server {
		t.Errorf("ContainerStats: %v %v", st, err)
	}

	e.stopRemove(ctx, t, podID)
	waitFor(t, 20*time.Second, "gVisor's processes to be gone", func() bool { return len(gvisorProcesses(runscRoot, e.state)) == 0 })
}

// gvisorProcesses lists the runsc processes whose command line names root (the test's
// runsc state) and the gVisor shims working in a bundle below state.
func gvisorProcesses(root, state string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err != nil {
			continue
		}
		c := strings.ReplaceAll(string(cmdline), "\x00", " ")
		cwd, _ := os.Readlink(filepath.Join("/proc", en.Name(), "cwd"))
		if strings.Contains(c, root) || (strings.Contains(c, "containerd-shim-runsc-v1") && strings.HasPrefix(cwd, state+"/")) {
			out = append(out, en.Name()+": "+c)
		}
	}
	return out
}
