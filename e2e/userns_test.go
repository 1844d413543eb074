package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// usernsOptions is what kubelet sends for hostUsers: false: one range for uids and gids.
func usernsOptions(hostID, length uint32) *cri.UserNamespace {
	m := []*cri.IDMapping{{ContainerId: 0, HostId: hostID, Length: length}}
	return &cri.UserNamespace{Mode: cri.NamespaceMode_POD, Uids: m, Gids: m}
}

// procStatusID returns the first (real) id of a "Uid:" or "Gid:" line of /proc/pid/status.
func procStatusID(t *testing.T, pid int, field string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == field+":" {
			return f[1]
		}
	}
	t.Fatalf("no %s line in /proc/%d/status", field, pid)
	return ""
}

func fileUID(t *testing.T, path string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

// TestE2EUserns: a pod with hostUsers: false (mode POD, container 0 -> host 100000,
// 65536 ids). Inside, the container is root and the image's and the volume's root-owned
// files are root's; on the host its process runs as 100000; its rootfs is an overlay
// of idmapped layers, so what it writes is stored as uid 0 in the upper dir (the
// in-container id) and shows as 100000 through the mount. The pod's network namespace
// belongs to its user namespace: sysfs mounts, lo is up, the pod sysctl is set, CNI
// gave an IP. Invalid mappings are InvalidArgument; Status advertises the feature;
// nothing is left mounted after RemovePodSandbox.
func TestE2EUserns(t *testing.T) {
	e := newEnv(t)
	// The container's root is host uid 100000: it must be able to reach its rootfs
	// below the state dir, as containerd's docs require of /run/containerd (0711).
	if err := os.Chmod(e.dir, 0o711); err != nil {
		t.Fatal(err)
	}
	e.start()
	ctx := ctxT(t)

	st, err := e.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range st.RuntimeHandlers {
		if !h.GetFeatures().GetUserNamespaces() {
			t.Errorf("handler %q does not advertise user_namespaces (kernel 6.18 idmaps overlay layers)", h.Name)
		}
	}

	// Invalid mappings: InvalidArgument, nothing created.
	bad := e.podConfig("userns-bad")
	bad.Linux.SecurityContext.NamespaceOptions.UsernsOptions = usernsOptions(100000, 65536)
	bad.Linux.SecurityContext.NamespaceOptions.UsernsOptions.Uids = append(bad.Linux.SecurityContext.NamespaceOptions.UsernsOptions.Uids,
		&cri.IDMapping{ContainerId: 65536, HostId: 300000, Length: 10})
	_, err = e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: bad})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "exactly one uid mapping") {
		t.Fatalf("RunPodSandbox with two uid ranges: %v, want InvalidArgument naming the uid mapping", err)
	}

	img := e.busybox(ctx)
	pod := e.podConfig("userns")
	pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = usernsOptions(100000, 65536)
	pod.Linux.Sysctls = map[string]string{"net.ipv4.ip_unprivileged_port_start": "80"}
	podID := e.runPod(ctx, pod)
	pst, info := e.status(ctx, podID)
	u := pst.GetLinux().GetNamespaces().GetOptions().GetUsernsOptions()
	if u.GetMode() != cri.NamespaceMode_POD || len(u.GetUids()) != 1 || u.GetUids()[0].GetHostId() != 100000 || u.GetGids()[0].GetLength() != 65536 {
		t.Errorf("PodSandboxStatus userns_options = %v, want POD 0:100000:65536", u)
	}
	if pst.GetNetwork().GetIp() == "" {
		t.Error("the user-namespaced pod has no IP: CNI did not run in its network namespace")
	}
	uidMap, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", info.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(uidMap)); len(f) != 3 || f[0] != "0" || f[1] != "100000" || f[2] != "65536" {
		t.Errorf("pause process uid_map %q, want 0 100000 65536", uidMap)
	}
	if got := procStatusID(t, info.Pid, "Uid"); got != "100000" {
		t.Errorf("pause process runs as host uid %s, want 100000", got)
	}
	// The pinned network namespace is the pause process's own, owned by the pod's
	// user namespace.
	var pinned, pauseNet syscall.Stat_t
	if err := syscall.Stat(info.NetNS, &pinned); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", info.Pid), &pauseNet); err != nil {
		t.Fatal(err)
	}
	if pinned.Ino != pauseNet.Ino {
		t.Errorf("pinned netns %s (inode %d) is not the pause process's (inode %d)", info.NetNS, pinned.Ino, pauseNet.Ino)
	}

	// A volume owned by root on the host.
	vol := filepath.Join(e.dir, "uservol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "hostfile"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := ctrConfig("userns", img, "sleep", "3600")
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{UsernsOptions: usernsOptions(100000, 65536)}
	cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: vol}}

	// A container whose mappings differ from its pod's is refused.
	other := ctrConfig("userns-other", img, "true")
	other.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{UsernsOptions: usernsOptions(200000, 65536)}
	_, err = e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: other, SandboxConfig: pod})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("CreateContainer with mappings other than the pod's: %v, want InvalidArgument", err)
	}

	ctrID := e.runCtr(ctx, podID, pod, cfg)
	run := func(cmd ...string) string {
		t.Helper()
		resp, err := e.execSync(ctx, ctrID, 10, cmd...)
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		if resp.ExitCode != 0 {
			t.Fatalf("exec %q: exit %d: %s%s", cmd, resp.ExitCode, resp.Stdout, resp.Stderr)
		}
		return strings.TrimSpace(string(resp.Stdout))
	}
	if got := run("id", "-u"); got != "0" {
		t.Errorf("id -u inside = %q, want 0", got)
	}
	if got := run("stat", "-c", "%u:%g", "/bin/busybox"); got != "0:0" {
		t.Errorf("image file /bin/busybox owned by %s inside, want 0:0 (idmapped layers)", got)
	}
	if f := strings.Fields(run("ls", "-ln", "/bin/busybox")); len(f) < 4 || f[2] != "0" || f[3] != "0" {
		t.Errorf("ls -ln /bin/busybox = %q, want owner 0 0", f)
	}
	if got := run("stat", "-c", "%u", "/data/hostfile"); got != "0" {
		t.Errorf("root-owned volume file owned by %s inside, want 0 (idmapped bind)", got)
	}
	if got := run("cat", "/sys/class/net/lo/flags"); got != "0x9" {
		t.Errorf("lo flags %q inside, want 0x9 (up, loopback; and sysfs mounted)", got)
	}
	if got := run("cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"); got != "80" {
		t.Errorf("pod sysctl ip_unprivileged_port_start = %q inside, want 80", got)
	}
	run("sh", "-c", "echo hi > /written && echo hi > /data/written")

	// The host's view: the process runs as 100000.
	cs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ctrID, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var cinfo struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(cs.Info["info"]), &cinfo); err != nil || cinfo.Pid <= 0 {
		t.Fatalf("container pid from verbose status: %v %q", err, cs.Info["info"])
	}
	if got := procStatusID(t, cinfo.Pid, "Uid"); got != "100000" {
		t.Errorf("container process runs as host uid %s, want 100000", got)
	}
	if got := procStatusID(t, cinfo.Pid, "Gid"); got != "100000" {
		t.Errorf("container process runs as host gid %s, want 100000", got)
	}
	if ms := cs.Status.GetMounts(); len(ms) != 1 || len(ms[0].GetUidMappings()) != 1 || ms[0].GetUidMappings()[0].GetHostId() != 100000 {
		t.Errorf("ContainerStatus mounts %v, want /data idmapped with the pod's range", ms)
	}
	// Through the container's rootfs mount the new file is the mapped root's; in the
	// upper dir on disk it is stored with the in-container id, 0 (idmapped upper layer).
	rootfsFile := filepath.Join(e.state, "containers", ctrID, "rootfs", "written")
	if got := fileUID(t, rootfsFile); got != 100000 {
		t.Errorf("%s owned by %d on the host through the overlay, want 100000", rootfsFile, got)
	}
	uppers, _ := filepath.Glob(filepath.Join(e.root, "images", "snapshots", "*", "*", "fs", "written"))
	more, _ := filepath.Glob(filepath.Join(e.root, "images", "snapshots", "*", "fs", "written"))
	uppers = append(uppers, more...)
	if len(uppers) != 1 {
		t.Fatalf("upper dir copies of /written: %v, want one", uppers)
	}
	if got := fileUID(t, uppers[0]); got != 0 {
		t.Errorf("%s owned by %d in the upper dir, want 0 (the in-container id)", uppers[0], got)
	}
	if got := fileUID(t, filepath.Join(vol, "written")); got != 0 {
		t.Errorf("file written to the volume owned by %d on the host, want 0 (idmapped bind)", got)
	}
	if got := fileUID(t, filepath.Join(vol, "hostfile")); got != 0 {
		t.Errorf("host file of the volume now owned by %d, want 0 (idmapping must not chown)", got)
	}

	// criserver killed and restarted: the pod and its container are found again as
	// they were (the pod-made netns pin, the idmapped rootfs, stats and exec).
	ip := pst.GetNetwork().GetIp()
	e.kill9()
	if !alive(info.ShimPid) || !alive(cinfo.Pid) {
		t.Fatal("the user-namespaced pod did not survive criserver's death")
	}
	e.start()
	if after, _ := e.status(ctx, podID); after.State != cri.PodSandboxState_SANDBOX_READY || after.GetNetwork().GetIp() != ip ||
		after.GetLinux().GetNamespaces().GetOptions().GetUsernsOptions().GetMode() != cri.NamespaceMode_POD {
		t.Errorf("pod after restart: state %v, ip %q (was %q), userns %v", after.State, after.GetNetwork().GetIp(), ip,
			after.GetLinux().GetNamespaces().GetOptions().GetUsernsOptions())
	}
	if got := run("id", "-u"); got != "0" {
		t.Errorf("id -u inside after restart = %q, want 0", got)
	}
	if cst, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: ctrID}); err != nil || cst.GetStats().GetMemory().GetWorkingSetBytes().GetValue() == 0 {
		t.Errorf("ContainerStats after restart: %v, %v", cst, err)
	}

	// Cleanup: no mount of the pod left (overlay, idmapped clones, netns pin, shm).
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	for _, m := range mountsUnder(e.dir) {
		// The netns directory itself stays a shared mount, as /run/netns does.
		if m != filepath.Join(e.state, "netns") {
			t.Errorf("mount %s left after RemovePodSandbox", m)
		}
	}
	if _, err := os.Stat(info.NetNS); !os.IsNotExist(err) {
		t.Errorf("netns pin %s left after RemovePodSandbox: %v", info.NetNS, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), "/proc/self/fd/") && strings.Contains(string(mi), e.dir) {
		t.Errorf("idmapped overlay still mounted:\n%s", mi)
	}
}
