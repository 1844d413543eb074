package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/store"
)

// ctrPid is the host pid of a container's init, from ContainerStatus's verbose info.
func (e *env) ctrPid(ctx context.Context, id string) int {
	e.t.Helper()
	resp, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		e.t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return verbosePid(e.t, resp.GetInfo())
}

// verbosePid returns the host pid of a container's init from a verbose
// ContainerStatus answer's info (crisp's and containerd's both carry it as "pid"),
// failing the test when there is none.
func verbosePid(t *testing.T, info map[string]string) int {
	t.Helper()
	var v struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(info["info"]), &v); err != nil || v.Pid <= 0 {
		t.Fatalf("no pid in the verbose container status: %v %q", err, info["info"])
	}
	return v.Pid
}

// assertNoPanic fails the test when criserver died by itself or logged a panic.
func (e *env) assertNoPanic(t *testing.T) {
	t.Helper()
	if e.cmd != nil && e.cmd.ProcessState != nil {
		t.Errorf("criserver exited by itself: %v", e.cmd.ProcessState)
	}
	if log := e.log(); strings.Contains(log, "panic:") {
		t.Errorf("criserver panicked:\n%s", logLinesWith(log, "panic", "goroutine"))
	}
}

// A container created before a restart (kill -9 or SIGTERM) is started after it: its
// exit monitor must start once (it was closed twice: "close of closed channel").
func TestE2ERestartThenStartCreated(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("created")
	podID := e.runPod(ctx, pod)
	for _, restart := range []struct {
		name string
		stop func()
	}{{"kill9", e.kill9}, {"sigterm", e.stop}} {
		resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, SandboxConfig: pod,
			Config: ctrConfig("c-"+restart.name, img, "sh", "-c", "sleep 0.5; exit 3")})
		if err != nil {
			t.Fatalf("%s: CreateContainer: %v", restart.name, err)
		}
		restart.stop()
		e.start()
		if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatalf("%s: StartContainer after restart: %v", restart.name, err)
		}
		st := e.waitExit(ctx, resp.ContainerId, 10*time.Second)
		if st.ExitCode != 3 || st.Reason != "Error" {
			t.Errorf("%s: exit %d reason %q, want 3 Error", restart.name, st.ExitCode, st.Reason)
		}
		time.Sleep(200 * time.Millisecond) // a second monitor would close exited now
		if _, err := e.rt.Version(ctx, &cri.VersionRequest{}); err != nil {
			t.Fatalf("%s: criserver gone after the exit: %v", restart.name, err)
		}
		e.assertNoPanic(t)
	}
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}

// A clean SIGTERM stop closes the shim connections: the exit monitors must not take
// that for exits and record running containers as exited.
func TestE2ESigtermKeepsRunningContainers(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("term")
	podID := e.runPod(ctx, pod)
	id := e.runCtr(ctx, podID, pod, ctrConfig("sleeper", img, "sleep", "1000"))
	pid := e.ctrPid(ctx, id)
	for range 2 {
		e.stop()
		e.start()
		resp, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil || resp.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("after SIGTERM restart: %v %v (pid %d alive: %v)", resp.GetStatus(), err, pid, alive(pid))
		}
	}
	if got := e.ctrPid(ctx, id); got != pid {
		t.Errorf("container pid %d -> %d", pid, got)
	}
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}

// A shim killed under running containers takes them with it: the pod is NotReady and
// the containers Exited (Error, 137) only once the pause and container processes are
// dead; stop and remove then leave nothing. Once with criserver watching, once with
// the shim killed while criserver is down.
func TestE2EShimDeathKillsPod(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	for _, tc := range []struct {
		name string
		down bool
	}{{"live", false}, {"while-down", true}} {
		t.Run(tc.name, func(t *testing.T) {
			pod := e.podConfig("shimdeath-" + tc.name)
			podID := e.runPod(ctx, pod)
			_, info := e.status(ctx, podID)
			ctrs := []string{
				e.runCtr(ctx, podID, pod, ctrConfig("a", img, "sleep", "1000")),
				e.runCtr(ctx, podID, pod, ctrConfig("b", img, "sh", "-c", "trap '' TERM; while true; do sleep 1; done")),
			}
			pids := []int{info.Pid}
			for _, id := range ctrs {
				pids = append(pids, e.ctrPid(ctx, id))
			}
			if tc.down {
				e.kill9()
			}
			killed := time.Now()
			if err := syscall.Kill(info.ShimPid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if tc.down {
				e.start()
			}
			// Exited is reported only after the kill: every pid must be dead by then.
			var detected time.Duration
			for _, id := range ctrs {
				st := e.waitExit(ctx, id, 10*time.Second)
				if detected == 0 {
					detected = time.Since(killed)
				}
				for _, pid := range pids {
					if alive(pid) {
						t.Errorf("container %s reported exited while pid %d still runs", id, pid)
					}
				}
				if st.ExitCode != 137 || st.Reason != "Error" || !strings.Contains(st.Message, "shim died") {
					t.Errorf("container %s: exit %d reason %q message %q, want 137 Error naming the shim's death", id, st.ExitCode, st.Reason, st.Message)
				}
			}
			ps, _ := e.status(ctx, podID)
			if ps.State != cri.PodSandboxState_SANDBOX_NOTREADY {
				t.Errorf("pod %v after its shim died", ps.State)
			}
			t.Logf("%s: containers reported exited %v after the shim kill", tc.name, detected)
			if !tc.down && detected > 2*time.Second {
				t.Errorf("exit of a dead shim's containers took %v", detected)
			}
			for _, cg := range e.podCgroups() {
				for _, id := range ctrs {
					if strings.Contains(cg, id) {
						t.Errorf("container cgroup %s left after the shim died", cg)
					}
				}
			}
			t0 := time.Now()
			e.stopRemove(ctx, t, podID)
			t.Logf("%s: stop+remove of the dead pod took %v", tc.name, time.Since(t0))
			e.assertPodGone(t, podID, info)
		})
	}
	e.assertNoPanic(t)
	e.assertNodeClean(t)
}

// dirNames lists the entries of dir.
func dirNames(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// What a criserver killed in the middle of an operation leaves without a record is
// removed by the next start: a container the shim created but CreateContainer never
// recorded (its bundle, writable snapshot, cgroup and waiting init), the temporary
// rootfs mount of a spec being generated, exec FIFO dirs, the files of a pod never
// recorded. Records and their containers stay untouched.
func TestE2ERestartSweepsOrphans(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("orphans")
	podID := e.runPod(ctx, pod)
	kept := e.runCtr(ctx, podID, pod, ctrConfig("kept", img, "sleep", "1000"))
	keptPid := e.ctrPid(ctx, kept)
	resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, SandboxConfig: pod,
		Config: ctrConfig("orphan", img, "sleep", "1000")})
	if err != nil {
		t.Fatal(err)
	}
	orphan := resp.ContainerId
	snapsDir := filepath.Join(e.root, "images", "snapshots")
	snapsBefore := len(dirNames(snapsDir))
	e.kill9()

	// The crash between the shim's create and the record: drop the record.
	db, err := store.Open(filepath.Join(e.root, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Delete("containers", orphan); err != nil {
		t.Fatal(err)
	}
	db.Close()
	// A rootfs mounted while a spec was generated, an exec session's FIFO dir, the
	// files of a pod that never got a record.
	tmpRootfs := filepath.Join(e.state, "rootfs-123")
	if err := os.MkdirAll(tmpRootfs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", tmpRootfs, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.state, "exec", "deadbeef"), 0o700); err != nil {
		t.Fatal(err)
	}
	strayPod := filepath.Join(e.root, "pods", strings.Repeat("ab", 32))
	if err := os.MkdirAll(strayPod, 0o700); err != nil {
		t.Fatal(err)
	}

	e.start()
	if _, err := os.Stat(filepath.Join(e.state, "containers", orphan)); !os.IsNotExist(err) {
		t.Errorf("bundle of the unrecorded container left (err %v)", err)
	}
	if got := len(dirNames(snapsDir)); got != snapsBefore-1 {
		t.Errorf("%d snapshot dirs after restart, want %d (the orphan's rootfs removed)", got, snapsBefore-1)
	}
	for _, cg := range e.podCgroups() {
		if strings.Contains(cg, orphan) {
			t.Errorf("cgroup of the unrecorded container left: %s", cg)
		}
	}
	for _, m := range mountsUnder(e.dir) {
		if strings.Contains(m, orphan) || m == tmpRootfs {
			t.Errorf("mount left: %s", m)
		}
	}
	for _, p := range []string{tmpRootfs, filepath.Join(e.state, "exec", "deadbeef"), strayPod} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left (err %v)", p, err)
		}
	}
	list, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{})
	if err != nil || len(list.Containers) != 1 || list.Containers[0].Id != kept || list.Containers[0].State != cri.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("containers after restart: %v %v", list, err)
	}
	if got := e.ctrPid(ctx, kept); got != keptPid || !alive(keptPid) {
		t.Errorf("kept container pid %d -> %d", keptPid, got)
	}
	// The orphan's name is free again.
	e.runCtr(ctx, podID, pod, ctrConfig("orphan", img, "true"))
	e.assertNoPanic(t)
	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}
