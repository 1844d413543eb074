package e2e

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
	ctrPid := verbosePid(t, cs.GetInfo())
	if got := procStatusID(t, ctrPid, "Uid"); got != "100000" {
		t.Errorf("container process runs as host uid %s, want 100000", got)
	}
	if got := procStatusID(t, ctrPid, "Gid"); got != "100000" {
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
	if !alive(info.ShimPid) || !alive(ctrPid) {
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

// TestE2EUsernsHostNetwork: a pod with hostUsers: false on the host network (kubelet's
// UserNamespacesHostNetworkSupport; containerd's user_namespaces_host_network), as
// containerd 2.x runs one: a new user namespace with the pod's mappings owning the
// pod's own IPC and PID namespaces, the host's network and UTS namespaces. Inside, the
// container is root of the mapping; it sees the host's interfaces (a bridge the test
// adds), hostname, /etc/hosts and resolv.conf; it serves on the host's loopback
// (reached from the host directly and through PortForward); and it cannot change the
// host's network even with CAP_NET_ADMIN, nor bind a privileged port (the host's netns
// belongs to the initial user namespace). Its rootfs and hostPath volume are
// idmapped; the host's /sys is bound read-only (sysfs cannot be mounted there). The
// pod survives criserver's kill -9 and leaves nothing behind.
func TestE2EUsernsHostNetwork(t *testing.T) {
	e := newEnv(t)
	// The container's root is host uid 100000: it must be able to reach its rootfs
	// below the state dir, as containerd's docs require of /run/containerd (0711).
	if err := os.Chmod(e.dir, 0o711); err != nil {
		t.Fatal(err)
	}
	// A host interface of the test's own (a bridge, as the harness's): what the pod must see, and what it must not
	// be able to change (changing it would harm nothing if the kernel let it).
	link := fmt.Sprintf("cuh%d", rand.IntN(1000000))
	if out, err := exec.Command("ip", "link", "add", link, "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("ip link add %s: %v: %s", link, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", link).Run() })
	linkMTU := func() string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("/sys/class/net", link, "mtu"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	mtu := linkMTU()
	e.start()
	ctx := ctxT(t)

	st, err := e.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !st.GetFeatures().GetUserNamespacesHostNetwork() {
		t.Errorf("Status does not advertise user_namespaces_host_network: %v", st.GetFeatures())
	}

	// Still refused with a user namespace: the host's IPC or PID namespace.
	bad := e.podConfig("usernshost-bad")
	bad.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_NODE, UsernsOptions: usernsOptions(100000, 65536)}
	if _, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: bad}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "host pid namespace") {
		t.Errorf("RunPodSandbox with host network, host PID and a user namespace: %v, want InvalidArgument", err)
	}

	// A port on the host's loopback, free now, for the container to serve on; and a
	// privileged one (below the host's ip_unprivileged_port_start) that it cannot bind.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	img := e.busybox(ctx)
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	pod := e.podConfig("usernshost")
	pod.Hostname = hostname // what kubelet sends for a host-network pod
	pod.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER, UsernsOptions: usernsOptions(100000, 65536)}
	// An IPC sysctl is the pod's own (its IPC namespace is); kubelet sends a host
	// network pod's ports as host port = container port, which need no mapping.
	pod.Linux.Sysctls = map[string]string{"kernel.shm_rmid_forced": "1"}
	pod.PortMappings = []*cri.PortMapping{{Protocol: cri.Protocol_TCP, ContainerPort: int32(port), HostPort: int32(port)}}
	podID := e.runPod(ctx, pod)
	pst, info := e.status(ctx, podID)
	if u := pst.GetLinux().GetNamespaces().GetOptions(); u.GetNetwork() != cri.NamespaceMode_NODE || u.GetUsernsOptions().GetMode() != cri.NamespaceMode_POD {
		t.Errorf("PodSandboxStatus namespace options %v, want network NODE and userns POD", u)
	}
	if info.NetNS != "" {
		t.Errorf("host-network pod has a netns pin %q", info.NetNS)
	}
	uidMap, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", info.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(uidMap)); len(f) != 3 || f[0] != "0" || f[1] != "100000" || f[2] != "65536" {
		t.Errorf("pause process uid_map %q, want 0 100000 65536", uidMap)
	}
	pauseNS := fmt.Sprintf("/proc/%d/ns/", info.Pid)
	for _, ns := range []string{"net", "uts"} {
		if nsInode(t, pauseNS+ns) != nsInode(t, "/proc/thread-self/ns/"+ns) {
			t.Errorf("pause process is not in the host's %s namespace", ns)
		}
	}
	userNS := nsInode(t, pauseNS+"user")
	if userNS == nsInode(t, "/proc/thread-self/ns/user") {
		t.Fatal("pause process is in the host's user namespace")
	}
	for _, ns := range []string{"ipc", "pid"} {
		if nsInode(t, pauseNS+ns) == nsInode(t, "/proc/thread-self/ns/"+ns) {
			t.Errorf("pause process shares the host's %s namespace", ns)
		} else if ownerUserNS(t, pauseNS+ns) != userNS {
			t.Errorf("the pod's %s namespace is not owned by its user namespace", ns)
		}
	}

	vol := filepath.Join(e.dir, "uservol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "hostfile"), []byte("served from a user namespace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// What kubelet sends for the container of such a pod; CAP_NET_ADMIN is added to
	// show that it does not reach the host's network.
	cfg := ctrConfig("usernshost", img, "httpd", "-f", "-p", fmt.Sprintf("127.0.0.1:%d", port), "-h", "/data")
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER, UsernsOptions: usernsOptions(100000, 65536)}
	cfg.Linux.SecurityContext.Capabilities = &cri.Capability{AddCapabilities: []string{"NET_ADMIN"}}
	cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: vol}}
	ctrID := e.runCtr(ctx, podID, pod, cfg)
	execIn := func(cmd ...string) *cri.ExecSyncResponse {
		t.Helper()
		resp, err := e.execSync(ctx, ctrID, 10, cmd...)
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		return resp
	}
	run := func(cmd ...string) string {
		t.Helper()
		resp := execIn(cmd...)
		if resp.ExitCode != 0 {
			t.Fatalf("exec %q: exit %d: %s%s", cmd, resp.ExitCode, resp.Stdout, resp.Stderr)
		}
		return strings.TrimSpace(string(resp.Stdout))
	}
	if got := strings.Fields(run("cat", "/proc/self/uid_map")); len(got) != 3 || got[0] != "0" || got[1] != "100000" || got[2] != "65536" {
		t.Errorf("uid_map inside %q, want 0 100000 65536", got)
	}
	if got := run("id", "-u"); got != "0" {
		t.Errorf("id -u inside = %q, want 0", got)
	}
	// The host's network: its interfaces (through netlink and through the bound /sys)
	// and its hostname.
	if got := run("ip", "-o", "link", "show", link); !strings.Contains(got, link) {
		t.Errorf("ip link show %s inside: %q", link, got)
	}
	if got := run("cat", "/sys/class/net/"+link+"/mtu"); got != mtu {
		t.Errorf("/sys/class/net/%s/mtu inside = %q, want %s", link, got, mtu)
	}
	if got := run("hostname"); got != hostname {
		t.Errorf("hostname inside = %q, want the host's %q", got, hostname)
	}
	for _, f := range []string{"/etc/hosts", "/etc/resolv.conf"} {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := run("cat", f); got != strings.TrimSpace(string(want)) {
			t.Errorf("%s inside = %q, want the host's %q", f, got, want)
		}
	}
	if got := run("cat", "/proc/sys/kernel/shm_rmid_forced"); got != "1" {
		t.Errorf("pod sysctl kernel.shm_rmid_forced = %q inside, want 1", got)
	}
	// The host reaches the container's server on its own loopback.
	var body []byte
	url := fmt.Sprintf("http://127.0.0.1:%d/hostfile", port)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(url)
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				break
			}
			err = fmt.Errorf("%s: %v", resp.Status, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s from the host: %v", url, err)
		}
	}
	if string(body) != "served from a user namespace\n" {
		t.Errorf("GET %s = %q", url, body)
	}
	// kubectl port-forward reaches it too: the pod's network is the host's.
	local, stopForward := e.portForward(ctx, t, podID, int32(port))
	fwURL := fmt.Sprintf("http://127.0.0.1:%d/hostfile", local)
	if resp, err := http.Get(fwURL); err != nil {
		t.Errorf("GET %s through PortForward: %v", fwURL, err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != string(body) {
			t.Errorf("GET %s through PortForward: %s %q", fwURL, resp.Status, b)
		}
	}
	stopForward()

	// The capability is there, and still the host's network cannot be changed: the
	// host's netns belongs to the initial user namespace, where the container has none.
	ctrPid := e.ctrPid(ctx, ctrID)
	capEff, err := strconv.ParseUint(procStatusID(t, ctrPid, "CapEff"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	if capEff&(1<<unix.CAP_NET_ADMIN) == 0 {
		t.Errorf("container CapEff %x lacks CAP_NET_ADMIN", capEff)
	}
	if r := execIn("ip", "link", "set", link, "mtu", "1400"); r.ExitCode == 0 || !strings.Contains(string(r.Stderr), "Operation not permitted") {
		t.Errorf("ip link set %s mtu 1400 inside: exit %d, %s%s; want EPERM", link, r.ExitCode, r.Stdout, r.Stderr)
	}
	if r := execIn("ip", "link", "set", "lo", "mtu", "65536"); r.ExitCode == 0 || !strings.Contains(string(r.Stderr), "Operation not permitted") {
		t.Errorf("ip link set lo mtu inside: exit %d, %s%s; want EPERM", r.ExitCode, r.Stdout, r.Stderr)
	}
	if got := linkMTU(); got != mtu {
		t.Errorf("%s mtu on the host is %s after the container's attempt, want %s", link, got, mtu)
	}
	// Nor bind a privileged port of the host (CAP_NET_BIND_SERVICE is the user
	// namespace's, not the host network's), when the host keeps them privileged.
	if lowPort := freeLowPort(t); lowPort > 0 {
		r := execIn("timeout", "3", "nc", "-l", "-p", strconv.Itoa(lowPort))
		if !strings.Contains(string(r.Stderr), "Permission denied") {
			t.Errorf("nc -l -p %d inside: exit %d, %s%s; want EACCES", lowPort, r.ExitCode, r.Stdout, r.Stderr)
		}
	}
	// The host's /sys, bound read-only down to every submount. On cgroup v1 the
	// tmpfs libcontainer mounts at /sys/fs/cgroup to hold the hierarchies is the
	// container's own and stays writable, as in every container there.
	sysMounts := 0
	for _, line := range strings.Split(run("cat", "/proc/self/mountinfo"), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || (f[4] != "/sys" && !strings.HasPrefix(f[4], "/sys/")) {
			continue
		}
		sysMounts++
		if f[4] == cgroupRoot && strings.Contains(line, " - tmpfs ") {
			continue
		}
		if !strings.HasPrefix(f[5], "ro") {
			t.Errorf("%s is writable inside: %s", f[4], line)
		}
	}
	if sysMounts < 2 {
		t.Errorf("%d mounts at or below /sys inside, want the host's /sys with its submounts", sysMounts)
	}

	// Idmapped rootfs and volume: root-owned files are root's inside; what root
	// writes is host uid 100000 through the rootfs and 0 in the volume (its
	// in-container id on disk, as the volume's own files).
	if got := run("stat", "-c", "%u:%g", "/bin/busybox"); got != "0:0" {
		t.Errorf("image file /bin/busybox owned by %s inside, want 0:0 (idmapped layers)", got)
	}
	if got := run("stat", "-c", "%u", "/data/hostfile"); got != "0" {
		t.Errorf("root-owned volume file owned by %s inside, want 0 (idmapped bind)", got)
	}
	run("sh", "-c", "echo hi > /written && echo hi > /data/written && chown 1000:1000 /data/written")
	if got := procStatusID(t, ctrPid, "Uid"); got != "100000" {
		t.Errorf("container process runs as host uid %s, want 100000", got)
	}
	if got := fileUID(t, filepath.Join(e.state, "containers", ctrID, "rootfs", "written")); got != 100000 {
		t.Errorf("/written owned by %d on the host through the rootfs mount, want 100000", got)
	}
	if got := fileUID(t, filepath.Join(vol, "written")); got != 1000 {
		t.Errorf("volume file chowned to 1000 inside is owned by %d on the host, want 1000 (idmapped bind)", got)
	}

	// Stats as for any host-network pod: no network of the pod's own.
	if ps, err := e.rt.PodSandboxStats(ctx, &cri.PodSandboxStatsRequest{PodSandboxId: podID}); err != nil || ps.GetStats().GetLinux().GetMemory() == nil || ps.GetStats().GetLinux().GetNetwork() != nil {
		t.Errorf("PodSandboxStats: %v, %v; want memory and no network", ps, err)
	}
	if cst, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: ctrID}); err != nil || cst.GetStats().GetMemory().GetWorkingSetBytes().GetValue() == 0 {
		t.Errorf("ContainerStats: %v, %v", cst, err)
	}

	// criserver killed and restarted: the pod is found again as it was.
	e.kill9()
	if !alive(info.ShimPid) || !alive(ctrPid) {
		t.Fatal("the pod did not survive criserver's death")
	}
	e.start()
	if after, _ := e.status(ctx, podID); after.State != cri.PodSandboxState_SANDBOX_READY ||
		after.GetLinux().GetNamespaces().GetOptions().GetUsernsOptions().GetMode() != cri.NamespaceMode_POD {
		t.Errorf("pod after restart: state %v, namespaces %v", after.State, after.GetLinux().GetNamespaces().GetOptions())
	}
	if got := run("cat", "/data/hostfile"); got != "served from a user namespace" {
		t.Errorf("after restart: %q", got)
	}

	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); alive(info.Pid) || alive(info.ShimPid) || alive(ctrPid); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("left running after RemovePodSandbox: pause %v, shim %v, container %v", alive(info.Pid), alive(info.ShimPid), alive(ctrPid))
		}
	}
	for _, m := range mountsUnder(e.dir) {
		if m != filepath.Join(e.state, "netns") {
			t.Errorf("mount %s left after RemovePodSandbox", m)
		}
	}
	if c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Errorf("port %d still served after RemovePodSandbox", port)
	}
	if got := linkMTU(); got != mtu {
		t.Errorf("%s mtu is %s after the pod, want %s", link, got, mtu)
	}
}

const cgroupRoot = "/sys/fs/cgroup"

// freeLowPort returns a free TCP port below the host's ip_unprivileged_port_start (0
// when the host has none privileged).
func freeLowPort(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		t.Fatal(err)
	}
	start, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	for p := start - 1; p > 0 && p > start-200; p-- {
		if l, err := net.Listen("tcp4", fmt.Sprintf(":%d", p)); err == nil {
			l.Close()
			return p
		}
	}
	return 0
}
