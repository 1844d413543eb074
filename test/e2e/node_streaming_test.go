package e2e

import (
	"context"
	"crypto/md5"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// nodeWithin is how long a node test waits for something the VM does slowly (a
// service restart, a container start, an exec): everything in the TCG guest is
// ~12x slower than on a host, so waits are polls with generous deadlines.
const nodeWithin = 60 * time.Second

// tracedPod is a node test's pod in kubelet's pod cgroup, with what must be gone once
// it is removed: its containers and the cgroups its processes ran in.
type tracedPod struct {
	id   string
	kp   *kubeletPod
	info podInfo
	ctrs []string
	// cgroups are the pause's and the containers' cgroup directories.
	cgroups []string
}

// nodeCtx is a context for a whole node test: ctxT's two minutes are short in the VM.
func nodeCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// runTracedPod runs a pod in a kubelet pod cgroup made for it; mutate, if not nil,
// changes the config first. The pause process must run in a child of that cgroup
// (the scope crisp-<id>.scope under the systemd driver).
func (e *env) runTracedPod(ctx context.Context, t *testing.T, name string, mutate func(*cri.PodSandboxConfig)) *tracedPod {
	t.Helper()
	kp := e.kubeletPod(name, nil)
	if mutate != nil {
		mutate(kp.cfg)
	}
	p := &tracedPod{kp: kp}
	p.id = e.runPod(ctx, kp.cfg)
	_, p.info = e.status(ctx, p.id)
	p.cgroups = append(p.cgroups, e.tracedCgroup(t, p, p.id, p.info.Pid))
	return p
}

// tracedCgroup checks that pid (of the pod's pause or container id) runs in its own
// child of the pod's kubelet cgroup and returns that cgroup.
func (e *env) tracedCgroup(t *testing.T, p *tracedPod, id string, pid int) string {
	t.Helper()
	cg := procCgroup(t, pid)
	want := "crisp-" + id
	if nodeDriver() == "systemd" {
		want += ".scope"
	}
	if filepath.Dir(cg) != p.kp.cgroup || filepath.Base(cg) != want {
		t.Errorf("pid %d of %.12s runs in %s, want %s", pid, id, cg, filepath.Join(p.kp.cgroup, want))
	}
	return cg
}

// run creates and starts a container in the pod and records its cgroup.
func (p *tracedPod) run(ctx context.Context, t *testing.T, e *env, cfg *cri.ContainerConfig) string {
	t.Helper()
	id := e.runCtr(ctx, p.id, p.kp.cfg, cfg)
	p.ctrs = append(p.ctrs, id)
	p.cgroups = append(p.cgroups, e.tracedCgroup(t, p, id, e.ctrPid(ctx, id)))
	return id
}

// removeTraced stops and removes the pod and checks that nothing of it is left: no
// process, no cgroup of its pause or containers (nothing at all below kubelet's pod
// cgroup, which is kubelet's to remove), no crisp scope of it under the systemd driver.
func (e *env) removeTraced(ctx context.Context, t *testing.T, p *tracedPod) {
	t.Helper()
	e.stopRemove(ctx, t, p.id)
	if alive(p.info.ShimPid) || alive(p.info.Pid) {
		t.Errorf("pod %.12s removed: shim %d alive %v, pause %d alive %v", p.id, p.info.ShimPid, alive(p.info.ShimPid), p.info.Pid, alive(p.info.Pid))
	}
	for _, cg := range p.cgroups {
		if _, err := os.Stat(cg); !os.IsNotExist(err) {
			t.Errorf("pod %.12s removed: cgroup %s left (%v)", p.id, cg, err)
		}
	}
	if left := childCgroupDirs(p.kp.cgroup); len(left) > 0 {
		t.Errorf("pod %.12s removed: cgroups left in kubelet's pod cgroup %s: %v", p.id, p.kp.cgroup, left)
	}
	if nodeDriver() == "systemd" {
		for _, u := range crispUnits(t) {
			for _, id := range append([]string{p.id}, p.ctrs...) {
				if strings.Contains(u, id) {
					t.Errorf("pod %.12s removed: unit %s left", p.id, u)
				}
			}
		}
	}
}

// childCgroupDirs lists the cgroups directly below dir.
func childCgroupDirs(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, en := range ents {
		if en.IsDir() {
			out = append(out, en.Name())
		}
	}
	return out
}

// waitTrue polls cond until it holds or within passes; then the test fails with what
// cond last reported.
func waitTrue(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, desc := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, within, desc)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tracedExec runs cmd in the container with ExecSync and a VM-sized timeout; a failed
// call or a non-zero exit fails the test.
func (e *env) tracedExec(ctx context.Context, t *testing.T, id string, cmd ...string) string {
	t.Helper()
	return e.mustExecWithin(ctx, t, id, int64(nodeWithin/time.Second), cmd...)
}

// TestNodeStreaming: in one pod of kubelet's slices, with one container that serves
// HTTP in the background and echoes its stdin: ExecSync (both streams, exit code), a
// streaming exec with stdin and a terminal over websocket (a resize reaching it), an
// attach over SPDY whose lines the container echoes to the attach session and to its
// CRI log file, the log rotated (rename, ReopenContainerLog) with the next line in the
// new file only, and a port-forward to the HTTP server whose bytes match the file's
// checksum inside. Then nothing of the pod is left.
func TestNodeStreaming(t *testing.T) {
	e := newNodeEnv(t)
	ctx := nodeCtx(t, 4*time.Minute)
	start := time.Now()
	img := e.busybox(ctx)
	p := e.runTracedPod(ctx, t, "streaming", nil)

	// httpd without -f goes to the background once it listens; cat echoes stdin.
	cfg := ctrConfig("echo", img, "sh", "-c",
		"mkdir -p /tmp/www && echo hello-node-pf > /tmp/www/index.html && "+
			"head -c 200000 /dev/urandom > /tmp/www/big && "+
			"httpd -p 127.0.0.1:8080 -h /tmp/www && echo serving && exec cat")
	cfg.Stdin = true
	id := p.run(ctx, t, e, cfg)
	logPath := filepath.Join(p.kp.cfg.LogDirectory, cfg.LogPath)
	t.Logf("pod and container running after %v", time.Since(start).Round(time.Millisecond))

	t.Run("execsync", func(t *testing.T) {
		resp, err := e.execSync(ctx, id, int64(nodeWithin/time.Second), "sh", "-c", "echo out; echo err >&2; exit 3")
		if err != nil {
			t.Fatalf("ExecSync: %v", err)
		}
		if string(resp.Stdout) != "out\n" || string(resp.Stderr) != "err\n" || resp.ExitCode != 3 {
			t.Errorf("ExecSync: stdout %q stderr %q exit %d, want out, err, 3", resp.Stdout, resp.Stderr, resp.ExitCode)
		}
		if got := e.tracedExec(ctx, t, id, "cat", "/tmp/www/index.html"); got != "hello-node-pf\n" {
			t.Errorf("ExecSync cat: %q", got)
		}
	})

	t.Run("exec-tty", func(t *testing.T) {
		u := e.execURL(ctx, t, &cri.ExecRequest{ContainerId: id, Cmd: []string{"sh"}, Stdin: true, Tty: true, Stdout: true})
		sctx, cancel := context.WithTimeout(ctx, nodeWithin)
		defer cancel()
		checkExecTTY(sctx, t, u, wsTransport, 2*time.Second)
	})

	t.Run("attach-and-logs", func(t *testing.T) {
		actx, cancel := context.WithTimeout(ctx, 2*nodeWithin)
		defer cancel()
		s := e.attach(actx, t, id, spdyTransport, false, nil)
		// Until the session is connected a line may not reach it: type it again.
		for !s.out.wait("attached-1", 2*time.Second) {
			if actx.Err() != nil {
				t.Fatalf("attach: the echo never came back: %q", s.out.String())
			}
			if _, err := s.stdin.Write([]byte("attached-1\n")); err != nil {
				t.Fatalf("attach session ended: %v", err)
			}
		}
		waitTrue(t, nodeWithin, "attached line in the CRI log", func() (bool, string) {
			lines := logLines(t, logPath)
			return slices.Contains(lines, "stdout attached-1") && slices.Contains(lines, "stdout serving"), fmt.Sprint(lines)
		})

		// Rotated as kubelet rotates: rename, then ReopenContainerLog.
		if err := os.Rename(logPath, logPath+".1"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.rt.ReopenContainerLog(ctx, &cri.ReopenContainerLogRequest{ContainerId: id}); err != nil {
			t.Fatalf("ReopenContainerLog: %v", err)
		}
		if _, err := s.stdin.Write([]byte("after-rotation\n")); err != nil {
			t.Fatalf("attach session ended: %v", err)
		}
		if !s.out.wait("after-rotation", nodeWithin) {
			t.Fatalf("attach: no echo after the rotation: %q", s.out.String())
		}
		waitTrue(t, nodeWithin, "the line after the rotation in the new log file", func() (bool, string) {
			if _, err := os.Stat(logPath); err != nil {
				return false, err.Error()
			}
			lines := logLines(t, logPath)
			return slices.Contains(lines, "stdout after-rotation"), fmt.Sprint(lines)
		})
		if old := logLines(t, logPath+".1"); !slices.Contains(old, "stdout attached-1") || slices.Contains(old, "stdout after-rotation") {
			t.Errorf("rotated log %q: want attached-1 and not after-rotation", old)
		}
		// The client closes its stdin: the session ends, the container (stdin_once
		// unset) keeps running.
		s.stdin.Close()
		s.ended(t, nodeWithin)
		if st := e.ctrState(ctx, t, id); st != cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container after the attach session: %v", st)
		}
	})

	t.Run("portforward", func(t *testing.T) {
		// client-go ends the whole session on a refused connection: forward once
		// httpd listens.
		waitTrue(t, nodeWithin, "httpd listening on 8080 in the pod", func() (bool, string) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", p.info.Pid))
			b6, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp6", p.info.Pid))
			return strings.Contains(string(b), ":1F90 00000000:0000 0A") ||
				strings.Contains(string(b6), ":1F90 00000000000000000000000000000000:0000 0A"), string(b) + string(b6)
		})
		local, stop := e.portForward(ctx, t, p.id, 8080)
		defer stop()
		c := &http.Client{Timeout: nodeWithin}
		get := func(path string) []byte {
			t.Helper()
			resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/%s", local, path))
			if err != nil {
				t.Fatalf("port-forward GET /%s: %v", path, err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("port-forward GET /%s: %s, %d bytes, %v", path, resp.Status, len(body), err)
			}
			return body
		}
		if got := string(get("index.html")); got != "hello-node-pf\n" {
			t.Errorf("port-forward GET /index.html: %q", got)
		}
		big := get("big")
		inside := strings.Fields(e.tracedExec(ctx, t, id, "md5sum", "/tmp/www/big"))
		if len(big) != 200000 || len(inside) == 0 || fmt.Sprintf("%x", md5.Sum(big)) != inside[0] {
			t.Errorf("port-forward GET /big: %d bytes, md5 %x; inside: %v", len(big), md5.Sum(big), inside)
		}
	})

	e.removeTraced(ctx, t, p)
	t.Logf("TestNodeStreaming (%s driver) took %v", nodeDriver(), time.Since(start).Round(time.Millisecond))
}

// serviceMainPID is crisp.service's main pid as systemd knows it (0: none).
func serviceMainPID(t *testing.T) int {
	t.Helper()
	pid, err := strconv.Atoi(unitProps(t, "crisp.service", "MainPID")["MainPID"])
	if err != nil {
		t.Fatalf("MainPID of crisp.service: %v", err)
	}
	return pid
}

// TestNodeKillShimAndCriserver: (a) criserver's main process killed with SIGKILL:
// systemd restarts it (Restart=always, RestartSec=5), and only it (KillMode=process):
// the pod's shim, pause and container keep their pids, the pod is Ready again and an
// exec works. (b) The pod's shim killed with SIGKILL: criserver reports the pod
// NotReady and its container exited 137 once it killed everything the pod ran, and the
// container's and pause's processes are gone; Stop and Remove then leave no cgroup
// and no scope.
func TestNodeKillShimAndCriserver(t *testing.T) {
	e := newNodeEnv(t)
	ctx := nodeCtx(t, 5*time.Minute)
	start := time.Now()
	img := e.busybox(ctx)
	p := e.runTracedPod(ctx, t, "kills", nil)
	id := p.run(ctx, t, e, ctrConfig("sleeper", img, "sleep", "3600"))
	ctrPid := e.ctrPid(ctx, id)
	procStart := chaosProcStart(ctrPid)

	t.Run("kill-criserver", func(t *testing.T) {
		old := serviceMainPID(t)
		restarts := unitProps(t, "crisp.service", "NRestarts")["NRestarts"]
		if old == 0 {
			t.Fatal("crisp.service has no main pid")
		}
		if e.conn != nil {
			e.conn.Close()
			e.conn = nil
		}
		killed := time.Now()
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 criserver %d: %v", old, err)
		}
		var now int
		waitTrue(t, 2*nodeWithin, "systemd restarts criserver", func() (bool, string) {
			now = serviceMainPID(t)
			return now != 0 && now != old, fmt.Sprintf("MainPID %d (killed %d)", now, old)
		})
		if err := e.connect(2 * nodeWithin); err != nil {
			t.Fatalf("criserver does not answer after systemd restarted it: %v", err)
		}
		t.Logf("criserver %d killed; %d answers %v later", old, now, time.Since(killed).Round(time.Millisecond))
		if got := unitProps(t, "crisp.service", "NRestarts")["NRestarts"]; got == restarts {
			t.Errorf("NRestarts still %s after criserver was killed", got)
		}
		if !alive(p.info.ShimPid) || !alive(p.info.Pid) || !chaosStillRunning(ctrPid, procStart) {
			t.Fatalf("the pod did not survive criserver's death: shim %v, pause %v, container %v",
				alive(p.info.ShimPid), alive(p.info.Pid), chaosStillRunning(ctrPid, procStart))
		}
		if got := e.ctrPid(ctx, id); got != ctrPid {
			t.Errorf("container pid after the restart %d, was %d", got, ctrPid)
		}
		if got := e.tracedExec(ctx, t, id, "echo", "still-here"); got != "still-here\n" {
			t.Errorf("exec after the restart: %q", got)
		}
		if st, info := e.status(ctx, p.id); st.State != cri.PodSandboxState_SANDBOX_READY || info.ShimPid != p.info.ShimPid {
			t.Errorf("pod after the restart: %v, shim %d (was %d)", st.State, info.ShimPid, p.info.ShimPid)
		}
		if st := e.ctrState(ctx, t, id); st != cri.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container after the restart: %v", st)
		}
	})

	t.Run("kill-shim", func(t *testing.T) {
		ctrCg := p.cgroups[len(p.cgroups)-1]
		killed := time.Now()
		if err := syscall.Kill(p.info.ShimPid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 shim %d: %v", p.info.ShimPid, err)
		}
		var cs *cri.ContainerStatus
		waitTrue(t, nodeWithin, "pod NotReady and its container exited after the shim's death", func() (bool, string) {
			ps, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.id})
			if err != nil {
				return false, err.Error()
			}
			c, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
			if err != nil {
				return false, err.Error()
			}
			cs = c.Status
			return ps.Status.State == cri.PodSandboxState_SANDBOX_NOTREADY && cs.State == cri.ContainerState_CONTAINER_EXITED,
				fmt.Sprintf("pod %v, container %v", ps.Status.State, cs.State)
		})
		t.Logf("shim killed; pod NotReady and container exited %v later: exit %d, reason %q, message %q",
			time.Since(killed).Round(time.Millisecond), cs.ExitCode, cs.Reason, cs.Message)
		if cs.ExitCode != 137 || cs.FinishedAt == 0 {
			t.Errorf("container after the shim's death: exit %d, finished at %d; want 137 and a time", cs.ExitCode, cs.FinishedAt)
		}
		if chaosStillRunning(ctrPid, procStart) {
			t.Errorf("container process %d still running when reported exited", ctrPid)
		}
		if alive(p.info.Pid) {
			t.Errorf("pause process %d still running when the pod is reported NotReady", p.info.Pid)
		}
		// Nothing runs in the container's cgroup any more (gone, or empty).
		if procs, err := os.ReadFile(filepath.Join(ctrCg, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(procs))) > 0 {
			t.Errorf("container cgroup %s still holds %q", ctrCg, procs)
		}
	})

	e.removeTraced(ctx, t, p)
	t.Logf("TestNodeKillShimAndCriserver (%s driver) took %v", nodeDriver(), time.Since(start).Round(time.Millisecond))
}
