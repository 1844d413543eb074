package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestNodeServiceRestart: the unit does what the README says (modules loaded by
// ExecStartPre, Delegate=yes, KillMode=process), and `systemctl restart` or `stop`
// then `start` leave running pods running and found again.
func TestNodeServiceRestart(t *testing.T) {
	e := newNodeEnv(t)
	ctx := ctxT(t)
	checkUnit(t, "crisp.service", map[string]string{"Delegate": "yes", "KillMode": "process", "ActiveState": "active", "Restart": "always"})
	for _, mod := range []string{"overlay", "br_netfilter"} {
		if !exists(filepath.Join("/sys/module", mod)) {
			t.Errorf("module %s not loaded: ExecStartPre's modprobe did not run", mod)
		}
	}
	// The node is what crisp needs: every check passes (warnings allowed).
	if out, err := exec.Command("criserver", "--config", "/etc/crisp/config.toml", "check").CombinedOutput(); err != nil {
		t.Errorf("criserver check: %v\n%s", err, out)
	}
	img := e.busybox(ctx)
	kp := e.kubeletPod("restart", nil)
	podID := e.runPod(ctx, kp.cfg)
	id := e.runCtr(ctx, podID, kp.cfg, ctrConfig("ticker", img, "sh", "-c", "while true; do echo tick; sleep 0.2; done"))
	pid := e.ctrPid(ctx, id)
	_, info := e.status(ctx, podID)
	// The shim stays in the service's cgroup (KillMode=process spares it); the
	// containers are in kubelet's.
	if cg := procCgroup(t, info.ShimPid); !strings.HasPrefix(cg, "/sys/fs/cgroup/system.slice/crisp.service") {
		t.Errorf("shim runs in %s, want crisp.service's cgroup", cg)
	}

	for _, step := range [][]string{{"restart"}, {"stop"}} {
		e.restartOrStop(step[0])
		if step[0] == "stop" {
			// With the service stopped the pod runs on by itself.
			time.Sleep(2 * time.Second)
			if err := syscall.Kill(pid, 0); err != nil {
				t.Fatalf("container pid %d gone while crisp was stopped: %v", pid, err)
			}
			e.restartService("start")
		}
		st, _ := e.status(ctx, podID)
		if st.State != cri.PodSandboxState_SANDBOX_READY {
			t.Errorf("after systemctl %s: pod %v", step[0], st.State)
		}
		if got := e.ctrPid(ctx, id); got != pid {
			t.Errorf("after systemctl %s: container pid %d, was %d", step[0], got, pid)
		}
		if out := e.mustExec(ctx, t, id, "echo", "alive"); out != "alive\n" {
			t.Errorf("exec after systemctl %s: %q", step[0], out)
		}
	}
	// New containers in the recovered pod, and logs that kept flowing.
	e.runCtr(ctx, podID, kp.cfg, ctrConfig("after", img, "sleep", "3600"))
	if n := len(logLines(t, filepath.Join(kp.cfg.LogDirectory, "ticker.log"))); n < 10 {
		t.Errorf("ticker logged %d lines across the restarts", n)
	}
	e.stopRemove(ctx, t, podID)
}

// restartOrStop restarts the service (and reconnects) or stops it.
func (e *env) restartOrStop(action string) {
	e.t.Helper()
	if action == "restart" {
		e.restartService("restart")
		return
	}
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	systemctl(e.t, "stop", "crisp.service")
}
