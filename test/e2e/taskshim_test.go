package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/tools/remotecommand"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// taskShimHandler is the runtime handler the task-only shim tests add.
const taskShimHandler = "runc-v2"

// taskShim is a task-only shim the tests run pods on.
type taskShim struct {
	name string
	// warmSpare asks for a warm spare shim for the handler.
	warmSpare bool
	// taskAPI is the task API version the shim serves.
	taskAPI string
	// shim and runc return the binaries, skipping the test when they are missing.
	shim, runc func(t *testing.T) string
}

// taskShims are containerd's runc shim 2.4.2 with runc 1.5.2 (hack/containerd.sh
// builds both: task API v3, bootstrap protocol) and Debian's containerd 1.6 runc shim
// (task API v2, legacy start) with Debian's runc.
var taskShims = []taskShim{
	{
		name:    "containerd-2.4.2",
		taskAPI: "3",
		shim:    func(t *testing.T) string { return filepath.Join(containerdBinDir(t), "containerd-shim-runc-v2") },
		runc: func(t *testing.T) string {
			p := filepath.Join(containerdBinDir(t), "runc")
			if _, err := os.Stat(p); err != nil {
				t.Skipf("runc 1.5.2 is not built (%v): hack/containerd.sh builds it (make test and .ci/run do)", err)
			}
			return p
		},
	},
	{
		name:    "debian-containerd-1.6",
		taskAPI: "2",
		shim:    func(t *testing.T) string { return lookBinary(t, "/usr/bin/containerd-shim-runc-v2", "containerd") },
		runc:    func(t *testing.T) string { return lookBinary(t, "/usr/sbin/runc", "runc") },
	},
}

// lookBinary returns path, or skips the test naming the Debian package that has it.
func lookBinary(t *testing.T, path, pkg string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s missing (%v): apt-get install %s (.ci/run does)", path, err, pkg)
	}
	return path
}

// containerdSockets is where containerd 1.x shims always put their sockets.
const containerdSockets = "/run/containerd/s"

// addTaskShim adds ts as the task-only runtime handler taskShimHandler to e's config
// (before start), and fails the test if it leaves a socket in containerdSockets.
func (e *env) addTaskShim(t *testing.T, ts taskShim) {
	t.Helper()
	before := map[string]bool{}
	for _, n := range dirNames(containerdSockets) {
		before[n] = true
	}
	t.Cleanup(func() {
		for _, n := range dirNames(containerdSockets) {
			if !before[n] {
				t.Errorf("shim socket left in %s: %s", containerdSockets, n)
				_ = os.Remove(filepath.Join(containerdSockets, n))
			}
		}
	})
	shim, runc := ts.shim(t), ts.runc(t)
	e.appendConfig(fmt.Sprintf("[runtimes.%s]\nshim = %q\nsandbox_mode = \"task\"\nwarm_spare = %v\n[runtimes.%s.options]\nBinaryName = %q\n",
		taskShimHandler, shim, ts.warmSpare, taskShimHandler, runc))
}

// taskEnv starts a criserver with ts as the task-only handler taskShimHandler and
// pulls busybox into it.
func taskEnv(t *testing.T, ts taskShim) (*env, context.Context, string) {
	t.Helper()
	e := newEnv(t)
	e.addTaskShim(t, ts)
	e.start()
	ctx := ctxT(t)
	return e, ctx, e.busybox(ctx)
}

// taskShimPids lists the containerd-shim-runc-v2 processes serving e's pods (their
// bundles lie under e's state dir), warm spares aside.
func (e *env) taskShimPids() []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		var pid int
		if _, err := fmt.Sscanf(en.Name(), "%d", &pid); err != nil {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if _, err := os.Stat(filepath.Join(cwd, warmSpareMarker)); err == nil {
			continue
		}
		if strings.HasSuffix(exe, "containerd-shim-runc-v2") && strings.HasPrefix(cwd, e.state+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// assertTaskShimClean checks what a task-only shim's pods could leave besides what
// assertNodeClean looks at: shims, runc state, container bundles.
func (e *env) assertTaskShimClean(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(e.taskShimPids()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if pids := e.taskShimPids(); len(pids) > 0 {
		t.Errorf("containerd-shim-runc-v2 processes left: %v", pids)
	}
	if left := dirNames(filepath.Join(e.state, "runc", "k8s.io")); len(left) > 0 {
		t.Errorf("runc state left: %v", left)
	}
	if left := dirNames(filepath.Join(e.state, "containers")); len(left) > 0 {
		t.Errorf("container bundles left: %v", left)
	}
	e.assertNodeClean(t)
}

func (e *env) taskPod(name string) *cri.PodSandboxConfig {
	pod := e.podConfig(name)
	return pod
}

func (e *env) runTaskPod(ctx context.Context, t *testing.T, pod *cri.PodSandboxConfig) string {
	t.Helper()
	resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: taskShimHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox on %s: %v\n%s", taskShimHandler, err, e.log())
	}
	return resp.PodSandboxId
}

// A pod on containerd-shim-runc-v2: two containers sharing the pod's namespaces, logs
// written by criserver, exit codes, exec, stats, OOM, stop/remove with nothing left.
func TestE2ETaskShimPod(t *testing.T) {
	for _, ts := range taskShims {
		t.Run(ts.name, func(t *testing.T) { testTaskShimPod(t, ts) })
	}
}

func testTaskShimPod(t *testing.T, ts taskShim) {
	e, ctx, img := taskEnv(t, ts)
	// Kubelet learns that the handler offers neither recursive read-only mounts nor
	// user namespaces, which crisp sets up only with its own shim.
	rtStatus, err := e.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, h := range rtStatus.GetRuntimeHandlers() {
		if h.GetName() == taskShimHandler {
			found = true
			if h.GetFeatures().GetRecursiveReadOnlyMounts() || h.GetFeatures().GetUserNamespaces() {
				t.Errorf("handler %s offers %v", h.GetName(), h.GetFeatures())
			}
		}
	}
	if !found {
		t.Errorf("Status lists no handler %s: %v", taskShimHandler, rtStatus.GetRuntimeHandlers())
	}
	pod := e.taskPod("taskpod")
	pod.Linux.Resources = &cri.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 256 << 20}
	podID := e.runTaskPod(ctx, t, pod)

	st, info := e.status(ctx, podID)
	if st.State != cri.PodSandboxState_SANDBOX_READY || st.GetNetwork().GetIp() == "" {
		t.Fatalf("pod status %v", st)
	}
	if info.Shim["sandbox_mode"] != "task" || info.Shim["task_api"] != ts.taskAPI || !alive(info.Pid) || !alive(info.ShimPid) {
		t.Errorf("verbose info %+v: want sandbox_mode task, task API v%s, live pause and shim", info, ts.taskAPI)
	}
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", info.ShimPid)); !strings.HasSuffix(exe, "containerd-shim-runc-v2") {
		t.Errorf("pod's shim is %s", exe)
	}
	// The pause renames itself once runc's init exec'd it, which can come after the
	// task's Start returned (as with containerd's podsandbox): runc:[2:INIT], then
	// pause, then crisp-pause.
	var comm []byte
	if !eventually(10*time.Second, func() bool {
		comm, _ = os.ReadFile(fmt.Sprintf("/proc/%d/comm", info.Pid))
		return strings.TrimSpace(string(comm)) == "crisp-pause"
	}) {
		t.Errorf("pause process %d is %q", info.Pid, comm)
	}
	// The pause container's spec carries what containerd gives a sandbox container.
	var pauseSpec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if data, err := os.ReadFile(filepath.Join(e.state, "sandboxes", podID, "config.json")); err != nil || json.Unmarshal(data, &pauseSpec) != nil {
		t.Fatalf("pause spec: %v", err)
	}
	for k, v := range map[string]string{
		"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": podID, "io.kubernetes.cri.sandbox-name": "taskpod",
		"io.kubernetes.cri.sandbox-namespace": "e2e", "io.kubernetes.cri.sandbox-memory": fmt.Sprint(256 << 20), "io.kubernetes.cri.sandbox-cpu-quota": "50000",
		"io.kubernetes.cri.sandbox-log-directory": pod.LogDirectory, "e2e/annotation": "taskpod",
	} {
		if got := pauseSpec.Annotations[k]; got != v {
			t.Errorf("pause annotation %s = %q, want %q", k, got, v)
		}
	}

	server := e.runCtr(ctx, podID, pod, ctrConfig("server", img, "sh", "-c", "echo started; echo warn >&2; while true; do echo pong | nc -l -p 8080; done"))
	quitter := e.runCtr(ctx, podID, pod, ctrConfig("quitter", img, "sh", "-c", "echo bye; echo oops >&2; exit 3"))
	qs := e.waitExit(ctx, quitter, 10*time.Second)
	if qs.ExitCode != 3 || qs.Reason != "Error" {
		t.Errorf("quitter: exit %d reason %q", qs.ExitCode, qs.Reason)
	}
	lines := logLines(t, qs.LogPath)
	sort.Strings(lines)
	if strings.Join(lines, "|") != "stderr oops|stdout bye" {
		t.Errorf("quitter log %q", lines)
	}
	ss, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: server})
	if err != nil || ss.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("server status %v %v", ss, err)
	}

	// Exec, and the pod's shared network and UTS namespaces: the second container
	// reaches the first on localhost and sees the pod's hostname.
	resp, err := e.execSync(ctx, server, 10, "sh", "-c", "echo out; echo err >&2; exit 7")
	if err != nil || string(resp.Stdout) != "out\n" || string(resp.Stderr) != "err\n" || resp.ExitCode != 7 {
		t.Fatalf("exec: %v %v", resp, err)
	}
	client := e.runCtr(ctx, podID, pod, ctrConfig("client", img, "sh", "-c", "hostname; nc 127.0.0.1 8080 </dev/null; sleep 1000"))
	deadline := time.Now().Add(10 * time.Second)
	cs, _ := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: client})
	for {
		got := logLines(t, cs.Status.LogPath)
		if slices.Equal(got, []string{"stdout taskpod", "stdout pong"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client log %q, want the pod's hostname and pong", got)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Stats from the shim's task API.
	cst, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: server})
	if err != nil || cst.Stats.GetMemory().GetWorkingSetBytes().GetValue() == 0 || cst.Stats.GetCpu() == nil {
		t.Errorf("container stats %v %v", cst, err)
	}
	pst, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID})
	if err != nil || pst.Stats.GetLinux().GetMemory().GetWorkingSetBytes().GetValue() < cst.Stats.GetMemory().GetWorkingSetBytes().GetValue() {
		t.Errorf("pod stats %v %v: want at least the server's working set", pst, err)
	}

	// OOM: the reason comes from the cgroup's oom_kill counter through task Stats.
	hog := ctrConfig("hog", img, "sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done")
	hog.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}
	hs := e.waitExit(ctx, e.runCtr(ctx, podID, pod, hog), 30*time.Second)
	if hs.Reason != "OOMKilled" || hs.ExitCode != 137 {
		t.Errorf("hog: reason %q exit %d, want OOMKilled 137", hs.Reason, hs.ExitCode)
	}

	// Attach: criserver serves the session from the output it copies; stdin_once
	// closes the container's stdin at the client's EOF.
	for _, tr := range []transport{spdyTransport, wsTransport} {
		cat := e.runCtr(ctx, podID, pod, stdinCtr("cat-"+string(tr), img, true, "cat"))
		as := e.attach(ctx, t, cat, tr, false, strings.NewReader("meow\n"))
		as.ended(t, 10*time.Second)
		if st := e.waitExit(ctx, cat, 10*time.Second); st.ExitCode != 0 {
			t.Errorf("%s: cat exit code %d", tr, st.ExitCode)
		}
		if got := as.out.String(); got != "meow\n" {
			t.Errorf("%s: cat echoed %q through attach, want meow", tr, got)
		}
		if got := logLines(t, filepath.Join(pod.LogDirectory, "cat-"+string(tr)+".log")); !slices.Equal(got, []string{"stdout meow"}) {
			t.Errorf("%s: cat's log %q", tr, got)
		}
	}
	shell := e.runCtr(ctx, podID, pod, stdinCtr("shell", img, false, "sh"))
	as := e.attach(ctx, t, shell, spdyTransport, false, nil)
	if _, err := as.stdin.Write([]byte("echo hi; echo oops >&2\n")); err != nil {
		t.Fatalf("write to the attach session: %v", err)
	}
	if !as.out.wait("hi\n", 10*time.Second) || !as.errOut.wait("oops\n", 10*time.Second) {
		t.Fatalf("attach: stdout %q, stderr %q; want hi and oops", as.out.String(), as.errOut.String())
	}
	as.stdin.Close()
	as.ended(t, 10*time.Second)
	if e.ctrState(ctx, t, shell) != cri.ContainerState_CONTAINER_RUNNING {
		t.Errorf("shell without stdin_once ended with its attach session")
	}
	// A terminal: the shim copies the pty to the stdout FIFO, which criserver logs and
	// serves to attach sessions.
	ttyCfg := stdinCtr("tty", img, false, "sh")
	ttyCfg.Tty = true
	ttyID := e.runCtr(ctx, podID, pod, ttyCfg)
	ts2 := e.attach(ctx, t, ttyID, spdyTransport, true, strings.NewReader("echo $((40+2))-tty\n"))
	ts2.ended(t, 10*time.Second)
	if got := ts2.out.String(); !strings.Contains(got, "42-tty") {
		t.Errorf("tty attach: output %q lacks 42-tty", got)
	}
	// An exec fed on stdin, through the streaming server.
	var catOut bytes.Buffer
	url := e.execURL(ctx, t, &cri.ExecRequest{ContainerId: server, Cmd: []string{"cat"}, Stdin: true, Stdout: true})
	if err := stream(ctx, t, url, spdyTransport, remotecommand.StreamOptions{Stdin: strings.NewReader("fed\n"), Stdout: &catOut}); err != nil || catOut.String() != "fed\n" {
		t.Errorf("exec cat with stdin: %q %v", catOut.String(), err)
	}
	// An exec with a terminal, through the streaming server.
	var ttyOut bytes.Buffer
	url = e.execURL(ctx, t, &cri.ExecRequest{ContainerId: server, Cmd: []string{"tty"}, Tty: true, Stdout: true})
	if err := stream(ctx, t, url, spdyTransport, remotecommand.StreamOptions{Stdout: &ttyOut, Tty: true}); err != nil || !strings.HasPrefix(ttyOut.String(), "/dev/pts/") {
		t.Errorf("exec tty: %q %v", ttyOut.String(), err)
	}

	// Port-forward into the pod's network, to the server's port.
	waitListening(t, info.Pid, 8080)
	local, stopPF := e.portForward(ctx, t, podID, 8080)
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), 5*time.Second)
	if err != nil {
		t.Fatalf("dial the forwarded port: %v", err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	reply, _ := io.ReadAll(conn)
	conn.Close()
	stopPF()
	if string(reply) != "pong\n" {
		t.Errorf("port-forward read %q, want pong", reply)
	}

	// Resources updated through the shim's task Update; the log rotated by
	// ReopenContainerLog, which criserver does itself.
	if _, err := e.rt.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{ContainerId: server, Linux: &cri.LinuxContainerResources{MemoryLimitInBytes: 96 << 20}}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", e.cgroup, "crisp-"+server, "memory.limit_in_bytes")); err != nil || strings.TrimSpace(string(data)) != fmt.Sprint(96<<20) {
		t.Errorf("memory limit after update: %q %v", data, err)
	}
	ticker := e.runCtr(ctx, podID, pod, ctrConfig("ticker", img, "sh", "-c", "while true; do echo tick; sleep 0.05; done"))
	tickLog := filepath.Join(pod.LogDirectory, "ticker.log")
	waitLogLine(t, tickLog, "stdout tick", 10*time.Second)
	if err := os.Rename(tickLog, tickLog+".1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.ReopenContainerLog(ctx, &cri.ReopenContainerLogRequest{ContainerId: ticker}); err != nil {
		t.Fatalf("ReopenContainerLog: %v", err)
	}
	waitLogLine(t, tickLog, "stdout tick", 10*time.Second)

	// An ExecSync past its timeout is killed; StopContainer escalates to SIGKILL.
	start := time.Now()
	if _, err := e.execSync(ctx, server, 1, "sleep", "30"); status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 5*time.Second {
		t.Errorf("exec timeout: %v after %v", err, time.Since(start))
	}
	// "trapped" tells when the shell ignores SIGTERM: a stop before that would end it
	// with SIGTERM (143), not the escalation's SIGKILL.
	stubborn := e.runCtr(ctx, podID, pod, ctrConfig("stubborn", img, "sh", "-c", "trap '' TERM; echo trapped; sleep 1000 & wait"))
	waitLogLine(t, filepath.Join(pod.LogDirectory, "stubborn.log"), "stdout trapped", 10*time.Second)
	if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: stubborn, Timeout: 1}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if st := e.waitExit(ctx, stubborn, 5*time.Second); st.ExitCode != 137 {
		t.Errorf("stopped container exit %d, want 137", st.ExitCode)
	}

	// What crisp cannot do through a task-only shim is refused clearly.
	if _, err := e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: server, Location: filepath.Join(e.dir, "cp.tar")}); status.Code(err) != codes.Unimplemented {
		t.Errorf("checkpoint: %v, want Unimplemented", err)
	}

	e.stopRemove(ctx, t, podID)
	e.assertPodGone(t, podID, info)
	e.assertTaskShimClean(t)
}

// criserver killed with SIGKILL and restarted: the pod and its containers are found
// again, output written meanwhile reaches the log, an exit meanwhile is reported, and
// a killed task-only shim takes its pod with it.
func TestE2ETaskShimRecovery(t *testing.T) {
	for _, ts := range taskShims {
		t.Run(ts.name, func(t *testing.T) { testTaskShimRecovery(t, ts) })
	}
}

func testTaskShimRecovery(t *testing.T, ts taskShim) {
	e, ctx, img := taskEnv(t, ts)
	pod := e.taskPod("taskrec")
	podID := e.runTaskPod(ctx, t, pod)
	ticker := e.runCtr(ctx, podID, pod, ctrConfig("ticker", img, "sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.05; done"))
	quitter := e.runCtr(ctx, podID, pod, ctrConfig("quitter", img, "sh", "-c", "sleep 1; echo last words; exit 5"))
	tickSt, _ := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ticker})
	qs0, _ := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: quitter})
	_, info := e.status(ctx, podID)

	e.kill9()
	time.Sleep(1500 * time.Millisecond)
	e.start()
	qs := e.waitExit(ctx, quitter, 10*time.Second)
	if qs.ExitCode != 5 || qs.Reason != "Error" {
		t.Errorf("quitter after restart: exit %d reason %q", qs.ExitCode, qs.Reason)
	}
	// Output of a container that exits while criserver is down is lost once the shim
	// closes its FIFOs (as under containerd: the README says so); it is never mangled.
	if got := logLines(t, qs0.Status.LogPath); len(got) > 0 && !slices.Equal(got, []string{"stdout last words"}) {
		t.Errorf("quitter's output written while criserver was down: log %q", got)
	}
	rs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ticker})
	if err != nil || rs.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("ticker after restart: %v %v", rs, err)
	}
	// Ticks are numbered: none is lost or doubled across the restart. A loaded
	// machine ticks slower than every 50 ms: wait for the ticks rather than the time.
	var got []string
	if !eventually(15*time.Second, func() bool { got = logLines(t, tickSt.Status.LogPath); return len(got) >= 30 }) {
		t.Fatalf("ticker log has %d lines after 15 s", len(got))
	}
	for i, l := range got {
		if l != fmt.Sprintf("stdout tick %d", i) {
			t.Fatalf("ticker log line %d is %q", i, l)
		}
	}

	// The shim dies: the pod is reported not ready, its containers exited 137, and
	// every process of it is killed.
	ctrPid := e.ctrPid(ctx, ticker)
	if err := syscall.Kill(info.ShimPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rs2 := e.waitExit(ctx, ticker, 15*time.Second)
	if rs2.ExitCode != 137 {
		t.Errorf("ticker after its shim died: exit %d reason %q", rs2.ExitCode, rs2.Reason)
	}
	if alive(ctrPid) || alive(info.Pid) {
		t.Errorf("container %d or pause %d still running after the shim died", ctrPid, info.Pid)
	}
	if st, _ := e.status(ctx, podID); st.State != cri.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("pod after its shim died: %v", st.State)
	}
	e.stopRemove(ctx, t, podID)
	e.assertTaskShimClean(t)
	e.assertNoPanic(t)
}

// readLogIfAny is logLines of a log that may not exist yet.
func readLogIfAny(t *testing.T, path string) []string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	return logLines(t, path)
}

// criserver killed with SIGKILL at different points of a pod start on a task-only
// shim (the shim's start, the pause container's create, a container's create): after
// the restart every pod is whole and ready or gone, and nothing of an undone one is
// left (shim, pause, runc state, bundles, netns, IP).
func TestE2ETaskShimKill9DuringStart(t *testing.T) {
	// And once with a warm spare, which the pod start adopts.
	spared := taskShims[0]
	spared.name, spared.warmSpare = spared.name+"-warm-spare", true
	for _, ts := range append(slices.Clone(taskShims), spared) {
		t.Run(ts.name, func(t *testing.T) {
			e, ctx, img := taskEnv(t, ts)
			for i, delay := range []time.Duration{5 * time.Millisecond, 15 * time.Millisecond, 30 * time.Millisecond, 50 * time.Millisecond, 80 * time.Millisecond} {
				done := make(chan struct{})
				go func() {
					defer close(done)
					pod := e.taskPod(fmt.Sprintf("crash%d", i))
					resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: taskShimHandler})
					if err != nil {
						return
					}
					_, _ = e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: resp.PodSandboxId, Config: ctrConfig("c", img, "sleep", "1000"), SandboxConfig: pod})
				}()
				time.Sleep(delay)
				e.kill9()
				<-done
				e.start()
				e.removeSurvivors(ctx, t, fmt.Sprintf("delay %v", delay))
				e.assertTaskShimClean(t)
			}
			e.assertNoPanic(t)
		})
	}
}

// taskSpare waits until the task-only handler has a warm spare whose shim serves, that
// the controller holds ready and that is not old, and returns it.
func (e *env) taskSpare(t *testing.T, old string) warmSpare {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, sp := range e.warmSpares() {
			if sp.handler == taskShimHandler && sp.id != old && spareShimPid(sp) > 0 && e.spareReady(sp.id) {
				return sp
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warm spare of %s within 10s; log:\n%s", taskShimHandler, e.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A task-only handler with warm_spare: the next pod adopts the spare shim (same id,
// same process), a replacement starts, a restart retires the spare of the killed
// criserver, and a clean stop leaves no shim of the handler behind.
func TestE2ETaskShimWarmSpare(t *testing.T) {
	for _, ts := range taskShims {
		ts.warmSpare = true
		t.Run(ts.name, func(t *testing.T) {
			e, ctx, img := taskEnv(t, ts)
			sp := e.taskSpare(t, "")
			pod := e.taskPod("spared")
			podID := e.runTaskPod(ctx, t, pod)
			_, info := e.status(ctx, podID)
			if podID != sp.id || info.ShimPid != spareShimPid(sp) {
				t.Errorf("pod %s with shim %d did not adopt spare %s with shim %d", podID, info.ShimPid, sp.id, spareShimPid(sp))
			}
			id := e.runCtr(ctx, podID, pod, ctrConfig("c", img, "sh", "-c", "echo from-spare; sleep 1000"))
			if resp, err := e.execSync(ctx, id, 10, "echo", "hi"); err != nil || string(resp.Stdout) != "hi\n" {
				t.Errorf("exec in the adopted shim's container: %v %v", resp, err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for st, _ := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id}); !slices.Equal(readLogIfAny(t, st.GetStatus().GetLogPath()), []string{"stdout from-spare"}); {
				if time.Now().After(deadline) {
					t.Fatalf("log of the adopted shim's container: %q", readLogIfAny(t, st.GetStatus().GetLogPath()))
				}
				time.Sleep(20 * time.Millisecond)
			}
			next := e.taskSpare(t, sp.id)
			e.stopRemove(ctx, t, podID)
			e.assertPodGone(t, podID, info)

			// The killed criserver's spare is retired at the restart, and a new one made.
			nextPid := spareShimPid(next)
			e.kill9()
			e.start()
			e.taskSpare(t, next.id)
			if nextPid == 0 || alive(nextPid) {
				t.Errorf("the previous run's spare shim %d still runs (or was never known)", nextPid)
			}
			e.stop()
			if pids := e.taskShimPids(); len(pids) > 0 {
				t.Errorf("containerd-shim-runc-v2 processes left after criserver stopped: %v", pids)
			}
		})
	}
}
