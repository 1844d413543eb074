package e2e

import (
	"os"
	"strings"
	"testing"
)

// kubeletDefaultMasked and kubeletDefaultReadonly are what kubelet sends for
// procMount: Default (k8s.io/kubernetes pkg/securitycontext: DefaultProcMount).
var (
	kubeletDefaultMasked = []string{"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"}
	kubeletDefaultReadonly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// TestE2EProcMount: in a hostUsers: false pod, procMount: Unmasked (kubelet sends empty
// lists, which arrive as none) leaves /proc without masked or read-only mounts, as
// containerd gives it; Default keeps kubelet's lists; and a container of a pod
// without a user namespace that sends no lists (crictl) keeps crisp's defaults.
func TestE2EProcMount(t *testing.T) {
	e := newEnv(t)
	if err := os.Chmod(e.dir, 0o711); err != nil { // userns root must reach its rootfs
		t.Fatal(err)
	}
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	// procMounts counts the mounts below /proc in the container's mount table.
	procMounts := func(id string) int {
		out := e.mustExec(ctx, t, id, "cat", "/proc/self/mountinfo")
		n := 0
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], "/proc/") {
				n++
			}
		}
		return n
	}
	userns := e.podConfig("procmount-userns")
	userns.Linux.SecurityContext.NamespaceOptions.UsernsOptions = usernsOptions(100000, 65536)
	usernsID := e.runPod(ctx, userns)
	defer e.stopRemove(ctx, t, usernsID)
	plain := e.podConfig("procmount-plain")
	plainID := e.runPod(ctx, plain)
	defer e.stopRemove(ctx, t, plainID)

	unmasked := ctrConfig("unmasked", img, "sleep", "3600")
	unmasked.Linux.SecurityContext.MaskedPaths, unmasked.Linux.SecurityContext.ReadonlyPaths = []string{}, []string{}
	def := ctrConfig("default", img, "sleep", "3600")
	def.Linux.SecurityContext.MaskedPaths, def.Linux.SecurityContext.ReadonlyPaths = kubeletDefaultMasked, kubeletDefaultReadonly
	if n := procMounts(e.runCtr(ctx, usernsID, userns, unmasked)); n != 0 {
		t.Errorf("procMount Unmasked in a user-namespaced pod: %d mounts below /proc, want 0", n)
	}
	if n := procMounts(e.runCtr(ctx, usernsID, userns, def)); n < len(kubeletDefaultReadonly) {
		t.Errorf("procMount Default in a user-namespaced pod: %d mounts below /proc, want kubelet's", n)
	}
	crictl := ctrConfig("crictl", img, "sleep", "3600")
	if n := procMounts(e.runCtr(ctx, plainID, plain, crictl)); n < len(kubeletDefaultReadonly) {
		t.Errorf("no lists, no user namespace: %d mounts below /proc, want crisp's defaults", n)
	}
}
