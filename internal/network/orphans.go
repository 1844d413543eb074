package network

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/crisp-runtime/crisp/internal/proc"
)

// AwaitOrphanPlugins waits until no CNI plugin runs for pod id any more, and after the
// CNI timeout kills those still running with their process groups. Recovery calls it
// before it undoes a pod whose RunPodSandbox a crash cut short: the dead criserver's
// ADD may still be running, and a DEL racing it leaves behind what the ADD adds after
// the DEL (a NAT rule and chain, an IP). A plugin killed here may leave what the DEL
// cannot find; Release, which undoes the creation next, frees that too (hostlocal.go).
// It returns how many plugins it found.
func (m *Manager) AwaitOrphanPlugins(ctx context.Context, id string) int {
	found := pluginsOf(id)
	if len(found) == 0 {
		return 0
	}
	limit := m.cfg.Timeout
	if limit <= 0 {
		limit = DefaultTimeout
	}
	deadline := time.Now().Add(limit)
	for len(pluginsOf(id)) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	for _, pid := range pluginsOf(id) {
		m.log.Warn("killing CNI plugin left running by a previous criserver", "pod", id, "pid", pid)
		// Plugins run in process groups of their own (pluginExec).
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		} else {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return len(found)
}

// pluginsOf lists the processes whose environment names pod id as CNI_CONTAINERID:
// the CNI plugins (and their children) run for the pod.
func pluginsOf(id string) []int {
	want := []byte("CNI_CONTAINERID=" + id + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if st, err := proc.ReadStat(pid); err != nil || st.Exiting() {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}
