package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// crispFileTypes are the SELinux types crisp's package promises its paths
// (packaging/deb/crisp.cil): those the container policy gives containerd's.
var crispFileTypes = []struct{ path, typ string }{
	{"/var/lib/crisp", "container_var_lib_t"},
	{"/var/lib/crisp/meta.db", "container_var_lib_t"},
	{"/var/lib/crisp/images/snapshots", "container_ro_file_t"},
	{"/run/crisp", "container_runtime_t"},
	{"/run/crisp/crisp.sock", "container_runtime_t"},
	{"/etc/crisp", "container_config_t"},
	{"/etc/crisp/config.toml", "container_config_t"},
	{"/usr/bin/shim-runc", "container_engine_exec_t"},
	{"/usr/bin/shim-wasm", "container_engine_exec_t"},
	{"/lib/systemd/system/crisp.service", "container_engine_unit_t"},
}

// crispExes are crisp's binaries as the audit log names the processes running them,
// and the shim's domain, which also names a container's init before it runs the
// container's program (its exe is then the shim's copy).
var crispExes = []string{`exe="/usr/bin/criserver"`, `exe="/usr/bin/shim-runc"`, `exe="/usr/bin/shim-wasm"`, "scontext=system_u:system_r:" + selinuxShimDomain + ":"}

// TestNodeSELinuxService: in the SELinux node VM (enforcing, the reference policy with
// its container module), with enable_selinux off, the package's policy module is
// installed and crisp's paths carry the labels it promises, containers run as spc_t,
// criserver runs in the domain systemd gives the service and a pod's shim in the
// container engine's domain (runc's), and a pod's cycle (pod, container, exec, an exec
// with a terminal, stop, remove) leaves no AVC denial naming crisp's binaries in the
// audit log.
func TestNodeSELinuxService(t *testing.T) {
	e := newNodeEnv(t)
	if f := nodeFlavour(); f != "selinux" {
		t.Skipf("the node VM of flavour %q runs no SELinux", f)
	}
	ctx := ctxT(t)
	started := time.Now()
	if data, err := os.ReadFile("/sys/fs/selinux/enforce"); err != nil || strings.TrimSpace(string(data)) != "1" {
		t.Fatalf("SELinux is not enforcing (/sys/fs/selinux/enforce: %q, %v)", data, err)
	}
	if out, err := exec.Command("semodule", "-l").Output(); err != nil || !hasLine(string(out), "crisp") || !hasLine(string(out), "container") {
		t.Fatalf("semodule -l lists no crisp or no container module (%v):\n%s", err, out)
	}

	// With labelling off (the package turns it on; TestNodeSELinuxLabels runs that):
	// containers run unlabelled, which the policy makes its privileged type.
	e.seSetEnabled(false)
	img := e.busybox(ctx)
	pod := e.kubeletPod("selinux-service", nil)
	podID := e.runPod(ctx, pod.cfg)
	ctr := e.runCtr(ctx, podID, pod.cfg, ctrConfig("sleeper", img, "sleep", "100000"))
	if got := procType(t, e.ctrPid(ctx, ctr)); got != "spc_t" {
		t.Errorf("with enable_selinux off the container runs as %s, want spc_t", procLabel(t, e.ctrPid(ctx, ctr)))
	}
	if resp, err := e.execSync(ctx, ctr, 30, "echo", "hello"); err != nil || resp.ExitCode != 0 || strings.TrimSpace(string(resp.Stdout)) != "hello" {
		t.Errorf("exec echo hello: %v %+v", err, resp)
	}
	// An exec with a terminal: its pty is made in the container's devpts.
	u := e.execURL(ctx, t, &cri.ExecRequest{ContainerId: ctr, Cmd: []string{"sh"}, Stdin: true, Tty: true, Stdout: true})
	sctx, cancel := context.WithTimeout(ctx, nodeWithin)
	checkExecTTY(sctx, t, u, wsTransport, 2*time.Second)
	cancel()

	for _, f := range crispFileTypes {
		if got := fileType(t, f.path); got != f.typ {
			t.Errorf("%s is labelled %s, want type %s", f.path, got, f.typ)
		}
	}
	main := unitProps(t, "crisp.service", "MainPID")["MainPID"]
	pid, err := strconv.Atoi(main)
	if err != nil || pid == 0 {
		t.Fatalf("crisp.service MainPID %q: %v", main, err)
	}
	domain := procType(t, pid)
	if domain != selinuxServiceDomain {
		t.Errorf("criserver (pid %d) runs as %s, want %s", pid, procLabel(t, pid), selinuxServiceDomain)
	}
	_, info := e.status(ctx, podID)
	if got := procType(t, info.ShimPid); got != selinuxShimDomain {
		t.Errorf("the pod's shim (pid %d) runs as %s, want %s", info.ShimPid, procLabel(t, info.ShimPid), selinuxShimDomain)
	}

	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	for _, avc := range avcsSince(t, started, crispExes...) {
		t.Errorf("AVC denial during the pod's cycle: %s", avc)
	}
}

// selinuxServiceDomain is the domain criserver runs in: systemd starts
// the unit's bin_t binary, as it starts containerd's on this policy (the reference
// policy labels containerd's binaries only in its docker module, which Debian does not
// build), in initrc_t, which the unconfined module leaves unconfined.
const selinuxServiceDomain = "initrc_t"

// selinuxShimDomain is the domain of a pod's shim: its binary has runc's
// container_engine_exec_t, the only entry to the domain that may start container_t.
const selinuxShimDomain = "container_engine_t"

// hasLine reports whether text has a line that is exactly line.
func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// labelType is the type of an SELinux context user:role:type:level.
func labelType(label string) string {
	parts := strings.SplitN(label, ":", 4)
	if len(parts) < 3 {
		return ""
	}
	return parts[2]
}

// fileType is the SELinux type of a path's label (its security.selinux attribute).
func fileType(t *testing.T, path string) string {
	t.Helper()
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, "security.selinux", buf)
	if err != nil {
		t.Errorf("label of %s: %v", path, err)
		return ""
	}
	return labelType(strings.TrimRight(string(buf[:n]), "\x00"))
}

// procLabel is a process's SELinux context (/proc/<pid>/attr/current).
func procLabel(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/attr/current", pid))
	if err != nil {
		t.Fatalf("SELinux context of pid %d: %v", pid, err)
	}
	return strings.TrimRight(string(data), "\x00\n")
}

// procType is the type (the domain) of a process's SELinux context.
func procType(t *testing.T, pid int) string { return labelType(procLabel(t, pid)) }

// avcsSince lists the audit log's AVC and USER_AVC records since a time whose event contains any
// of the given strings: an AVC record names only the command (comm), its event's
// SYSCALL record (the same msg=audit(time:serial)) the executable (exe).
func avcsSince(t *testing.T, since time.Time, needles ...string) []string {
	t.Helper()
	f, err := os.Open("/var/log/audit/audit.log")
	if err != nil {
		t.Fatalf("the audit log: %v", err)
	}
	defer f.Close()
	avcs := map[string][]string{} // event (time:serial) -> its AVC records
	matched := map[string]bool{}  // events with a record naming a needle
	var order []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		// type=AVC msg=audit(1764300000.123:456): avc:  denied ...
		_, rest, ok := strings.Cut(line, " msg=audit(")
		if !ok {
			continue
		}
		event, _, ok := strings.Cut(rest, ")")
		stamp, _, _ := strings.Cut(event, ":")
		sec, err := strconv.ParseFloat(stamp, 64)
		if !ok || err != nil || sec < float64(since.Unix()-1) {
			continue
		}
		// USER_AVC: systemd's and D-Bus's own checks (a scope the shim asks for).
		if strings.HasPrefix(line, "type=AVC ") || strings.HasPrefix(line, "type=USER_AVC ") {
			if avcs[event] == nil {
				order = append(order, event)
			}
			avcs[event] = append(avcs[event], line)
		}
		for _, s := range needles {
			if strings.Contains(line, s) {
				matched[event] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read the audit log: %v", err)
	}
	var out []string
	for _, ev := range order {
		if matched[ev] {
			out = append(out, avcs[ev]...)
		}
	}
	return out
}
