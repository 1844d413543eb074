package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	cgmanager "github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/selinux/go-selinux"
	"github.com/pelletier/go-toml/v2"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The node tests (TestNode*) run inside the node VM that `make test-node` boots
// (hack/nodevm.sh): Debian 12 with systemd as PID 1, cgroup v2 and the LSM of the
// guest's flavour (AppArmor, or SELinux enforcing: nodeFlavour), crisp
// installed from its .deb and started by systemctl. They drive that installed service
// and skip everywhere else. The VM's run script sets:
//   - CRISP_NODE=1
//   - CRISP_NODE_DRIVER: the cgroup_driver the service was configured with
//   - CRISP_NODE_DEB, CRISP_NODE_OLD_DEB: this build's package and an older one (upgrade)

// nodeSocket is the installed service's CRI socket (packaging/deb/config.toml).
const nodeSocket = "/run/crisp/crisp.sock"

// nodeDriver is the cgroup driver the service runs with.
func nodeDriver() string {
	if d := os.Getenv("CRISP_NODE_DRIVER"); d != "" {
		return d
	}
	return "cgroupfs"
}

// nodeFlavour is the node VM's flavour, which says the LSM the guest runs: "apparmor"
// or "selinux" (hack/nodevm.sh's NODEVM_FLAVOUR; the image records it in
// /etc/crisp-nodevm-flavour). Empty outside the node VM.
func nodeFlavour() string {
	data, err := os.ReadFile("/etc/crisp-nodevm-flavour")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// newNodeEnv connects to the installed crisp service; each test's pods and kubelet
// cgroups are removed when it ends.
func newNodeEnv(t *testing.T) *env {
	t.Helper()
	if os.Getenv("CRISP_NODE") != "1" {
		t.Skip("node test: runs inside the node VM against the installed service (make test-node)")
	}
	dir, err := os.MkdirTemp("/tmp", "crisp-node-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(kubeletPodLogs, 0o755); err != nil {
		t.Fatal(err)
	}
	podLogs, err := os.MkdirTemp(kubeletPodLogs, "crisp-node-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{
		podLogs: podLogs,
		t:       t,
		dir:     dir,
		cfgPath: "/etc/crisp/config.toml",
		socket:  nodeSocket,
		root:    "/var/lib/crisp",
		state:   "/run/crisp",
		bridge:  "crisp0",
		logPath: filepath.Join(dir, "journal.log"),
	}
	started := time.Now()
	t.Cleanup(func() { e.nodeCleanup(started) })
	if err := e.connect(2 * time.Minute); err != nil {
		t.Fatalf("the crisp service does not answer on %s: %v\n%s", nodeSocket, err, journal(started))
	}
	return e
}

// nodeCleanup removes the test's pods, then the kubelet cgroups they ran in, and
// prints the service's journal of the test when it failed.
func (e *env) nodeCleanup(started time.Time) {
	if e.rt != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		if resp, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err == nil {
			for _, p := range resp.Items {
				_, _ = e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.Id})
				if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
					e.t.Errorf("cleanup: remove pod %s: %v", p.Id, err)
				}
			}
		}
		cancel()
	}
	for i := len(e.kubeletCgroups) - 1; i >= 0; i-- {
		if err := e.kubeletCgroups[i].Destroy(); err != nil {
			e.t.Logf("cleanup: destroy kubelet cgroup: %v", err)
		}
	}
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	if e.t.Failed() || os.Getenv("CRISP_E2E_LOG") != "" {
		e.t.Logf("crisp.service journal since the test started:\n%s", journal(started))
	}
	os.RemoveAll(e.dir)
	os.RemoveAll(e.podLogs)
}

// kubeletVolumes is a directory for a test's volumes (0711, removed when the test
// ends) below kubelet's /var/lib/kubelet/pods, where kubelet keeps pods' volumes: the
// SELinux policy labels it container_file_t, which the shims' domain may mount and
// containers use, where a test's directory in /tmp (initrc_tmp_t) is out of their
// reach.
func kubeletVolumes(t *testing.T) string {
	t.Helper()
	const pods = "/var/lib/kubelet/pods"
	if err := os.MkdirAll(pods, 0o750); err != nil {
		t.Fatal(err)
	}
	if selinux.GetEnabled() {
		if out, err := exec.Command("restorecon", "-R", "/var/lib/kubelet").CombinedOutput(); err != nil {
			t.Fatalf("restorecon /var/lib/kubelet: %v: %s", err, out)
		}
	}
	dir, err := os.MkdirTemp(pods, "crisp-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// kubeletPodLogs is where kubelet puts pods' log directories.
const kubeletPodLogs = "/var/log/pods"

// journal is crisp.service's journal since a time, its last 300 lines.
func journal(since time.Time) string {
	out, err := exec.Command("journalctl", "-u", "crisp", "--no-pager", "-o", "cat", "-n", "300",
		"--since", fmt.Sprintf("@%d", since.Add(-time.Second).Unix())).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("journalctl: %v: %s", err, out)
	}
	return string(out)
}

// kubeletPod is a pod as kubelet sets it up: its cgroup created first (kubelet's
// pod container manager, through the same libcontainer managers kubelet uses),
// named for the driver, and a pod config whose cgroup_parent names it.
type kubeletPod struct {
	cfg *cri.PodSandboxConfig
	// cgroup is the pod cgroup's directory under /sys/fs/cgroup.
	cgroup string
	mgr    cgroups.Manager
}

// kubeletPod creates a burstable pod's cgroup and config (name is also the uid).
// res, if not nil, is the pod-level limits kubelet would set.
func (e *env) kubeletPod(name string, res *cgroups.Resources) *kubeletPod {
	e.t.Helper()
	uid := fmt.Sprintf("%s%08x", strings.ReplaceAll(name, "-", ""), rand.Uint32())
	if res == nil {
		res = &cgroups.Resources{}
	}
	// Not through systemd's auto-created parents: kubelet makes kubepods and the QoS
	// level first (its QoS container manager), then the pod.
	var parent, cgroupParent string
	var levels []*cgroups.Cgroup
	if nodeDriver() == "systemd" {
		levels = []*cgroups.Cgroup{
			{Name: "kubepods.slice", Parent: "-.slice", Systemd: true, Resources: &cgroups.Resources{}},
			{Name: "kubepods-burstable.slice", Parent: "kubepods.slice", Systemd: true, Resources: &cgroups.Resources{}},
			{Name: "kubepods-burstable-pod" + uid + ".slice", Parent: "kubepods-burstable.slice", Systemd: true, Resources: res},
		}
		cgroupParent = "kubepods-burstable-pod" + uid + ".slice"
		parent = "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/" + cgroupParent
	} else {
		levels = []*cgroups.Cgroup{
			{Path: "/kubepods", Resources: &cgroups.Resources{}},
			{Path: "/kubepods/burstable", Resources: &cgroups.Resources{}},
			{Path: "/kubepods/burstable/pod" + uid, Resources: res},
		}
		cgroupParent = "/kubepods/burstable/pod" + uid
		parent = "/sys/fs/cgroup" + cgroupParent
	}
	var mgr cgroups.Manager
	for i, l := range levels {
		m, err := cgmanager.New(l)
		if err != nil {
			e.t.Fatalf("kubelet cgroup %+v: %v", l, err)
		}
		if err := m.Apply(-1); err != nil {
			e.t.Fatalf("create kubelet cgroup %s%s: %v", l.Name, l.Path, err)
		}
		if err := m.Set(l.Resources); err != nil {
			e.t.Fatalf("set kubelet cgroup %s%s: %v", l.Name, l.Path, err)
		}
		if i == len(levels)-1 {
			// Only the pod level is the test's to remove: the QoS levels are shared.
			e.kubeletCgroups = append(e.kubeletCgroups, m)
			mgr = m
		}
	}
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: "node-e2e", Uid: uid},
		Hostname:     name,
		LogDirectory: e.podLogDir(name),
		Labels:       map[string]string{"app": "node-e2e", "pod": name},
		Linux: &cri.LinuxPodSandboxConfig{
			CgroupParent:    cgroupParent,
			SecurityContext: &cri.LinuxSandboxSecurityContext{NamespaceOptions: &cri.NamespaceOption{}},
		},
	}
	return &kubeletPod{cfg: cfg, cgroup: parent, mgr: mgr}
}

// procCgroup is a process's cgroup v2 directory under /sys/fs/cgroup.
func procCgroup(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatalf("cgroup of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join("/sys/fs/cgroup", rest)
		}
	}
	t.Fatalf("pid %d has no cgroup v2 line: %q", pid, data)
	return ""
}

// cgroupFile reads one file of a cgroup directory, trimmed.
func cgroupFile(t *testing.T, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("read %s: %v", filepath.Join(dir, name), err)
	}
	return strings.TrimSpace(string(data))
}

// unitProps are properties of a systemd unit (systemctl show).
func unitProps(t *testing.T, unit string, props ...string) map[string]string {
	t.Helper()
	out, err := exec.Command("systemctl", "show", unit, "-p", strings.Join(props, ",")).CombinedOutput()
	if err != nil {
		t.Fatalf("systemctl show %s: %v: %s", unit, err, out)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// crispUnits lists the systemd units crisp made (crisp-*.scope), loaded or not.
func crispUnits(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("systemctl", "list-units", "--all", "--plain", "--no-legend", "crisp-*.scope").CombinedOutput()
	if err != nil {
		t.Fatalf("systemctl list-units: %v: %s", err, out)
	}
	var units []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			units = append(units, f[0])
		}
	}
	return units
}

// systemctl runs systemctl and fails the test on an error.
func systemctl(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
		t.Fatalf("systemctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// editNodeConfig changes the installed service's config (/etc/crisp/config.toml) with
// edit and restarts the service; the config as it was comes back, with a restart,
// when the test ends.
func (e *env) editNodeConfig(edit func(cfg map[string]any)) {
	e.t.Helper()
	orig, err := os.ReadFile(e.cfgPath)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := map[string]any{}
	if err := toml.Unmarshal(orig, &cfg); err != nil {
		e.t.Fatalf("%s: %v", e.cfgPath, err)
	}
	edit(cfg)
	b, err := toml.Marshal(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if err := os.WriteFile(e.cfgPath, orig, 0o644); err != nil {
			e.t.Errorf("restore %s: %v", e.cfgPath, err)
			return
		}
		if e.conn != nil {
			e.conn.Close()
			e.conn = nil
		}
		if out, err := exec.Command("systemctl", "restart", "crisp.service").CombinedOutput(); err != nil {
			e.t.Errorf("restart crisp with the config restored: %v: %s", err, out)
			return
		}
		if err := e.connect(2 * time.Minute); err != nil {
			e.t.Errorf("crisp does not answer after the config was restored: %v", err)
		}
	})
	if err := os.WriteFile(e.cfgPath, b, 0o644); err != nil {
		e.t.Fatal(err)
	}
	e.restartService("restart")
}

// restartService runs systemctl with args on crisp.service and reconnects.
func (e *env) restartService(args ...string) {
	e.t.Helper()
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	systemctl(e.t, append(args, "crisp.service")...)
	if err := e.connect(2 * time.Minute); err != nil {
		e.t.Fatalf("crisp does not answer after systemctl %v: %v", args, err)
	}
}
