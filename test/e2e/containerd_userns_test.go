package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ctrdUsernsHost and ctrdUsernsSize are the pod's range: container ids 0..65535 are
// host ids 100000..165535, as kubelet hands out for hostUsers: false.
const (
	ctrdUsernsHost = 100000
	ctrdUsernsSize = 65536
)

// TestE2EContainerdUserns runs a user-namespaced pod (hostUsers: false: UserNamespace
// mode POD with one uid and one gid range, the mount mapped with the same range, as
// kubelet and critest's user-namespace specs send it) through containerd 2.4.2 on
// crisp's shim under both sandboxers and on containerd's runc shim. containerd offers
// user namespaces for a handler only when its shim's features claim the "user"
// namespace and idmapped mounts; each handler must then run the pod as containerd's
// runc shim does: the container is root of the pod's range (uid_map), the image's
// files are root's inside and the rootfs is writable (idmapped lower layers, an
// upper dir owned by the mapped root), a file the container creates in a hostPath
// volume lands with its in-container id on the host (idmapped bind mount), and the
// pod's network namespace belongs to the pod's user namespace; the pod survives a
// SIGKILL of containerd. A user-namespaced pod on the host network runs on every
// handler too.
func TestE2EContainerdUserns(t *testing.T) {
	c := newContainerd(t)
	// The container's root is host uid 100000: it must be able to reach its rootfs
	// below containerd's state dir, as containerd's docs require of /run/containerd.
	if err := os.Chmod(c.dir, 0o711); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for _, ref := range []string{c.busybox, c.pause} {
		if _, err := c.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("pull %s: %v\n%s", ref, err, c.logTail(4000))
		}
	}
	st, err := c.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	offered := map[string]bool{}
	for _, h := range st.GetRuntimeHandlers() {
		offered[h.GetName()] = h.GetFeatures().GetUserNamespaces()
	}
	for _, h := range ctrdHandlers {
		if !offered[h] {
			t.Errorf("containerd: handler %s does not offer user namespaces (features %v)", h, offered)
		}
	}
	for _, h := range ctrdHandlers {
		t.Run(h, func(t *testing.T) { c.userns(t, h) })
	}
	// containerd ≥ 2.0 also runs user-namespaced pods on the host network (its
	// runtime feature user_namespaces_host_network; kubelet's
	// UserNamespacesHostNetworkSupport).
	if !st.GetFeatures().GetUserNamespacesHostNetwork() {
		t.Fatalf("containerd does not offer user namespaces on the host network: %v", st.GetFeatures())
	}
	for _, h := range ctrdHandlers {
		t.Run("hostnet-"+h, func(t *testing.T) { c.usernsHostNetwork(t, h) })
	}
}

// usernsHostNetwork: a user-namespaced pod on the host network runs in the pod's user
// namespace (its uid_map, root inside, a writable rootfs) and in the host's network
// namespace, and leaves nothing behind.
func (c *ctrd) usernsHostNetwork(t *testing.T, handler string) {
	ctx := ctxT(t)
	before := c.leftovers()
	pod := c.podConfig("usernshost-" + handler)
	pod.Hostname = ""
	pod.Linux.SecurityContext.NamespaceOptions.Network = cri.NamespaceMode_NODE
	pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = ctrdUsernsOptions()
	podID := c.runPod(ctx, t, pod, handler)
	defer func() {
		c.removePod(ctx, t, podID)
		c.assertClean(t, 20*time.Second, before)
	}()
	cfg := c.ctrConfig("usernshost", "sleep", "3600")
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, UsernsOptions: ctrdUsernsOptions()}
	id, err := c.createStart(ctx, podID, pod, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", "cat /proc/self/uid_map; id -u; echo x > /written && cat /written"}, Timeout: 10})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("0 %d %d\n0\nx\n", ctrdUsernsHost, ctrdUsernsSize)
	if got := strings.Join(strings.Fields(string(ex.GetStdout())), " "); ex.GetExitCode() != 0 || got != strings.Join(strings.Fields(want), " ") {
		t.Errorf("inside: exit %d, %q (stderr %q), want %q", ex.GetExitCode(), ex.GetStdout(), ex.GetStderr(), want)
	}
	pid := c.ctrPid(ctx, t, id)
	proc := fmt.Sprintf("/proc/%d/ns/", pid)
	if nsInode(t, proc+"net") != nsInode(t, "/proc/thread-self/ns/net") {
		t.Error("the host-network pod's container is not in the host's network namespace")
	}
	if nsInode(t, proc+"user") == nsInode(t, "/proc/thread-self/ns/user") {
		t.Error("the container is in the host's user namespace")
	}
}

func ctrdUsernsOptions() *cri.UserNamespace {
	m := []*cri.IDMapping{{ContainerId: 0, HostId: ctrdUsernsHost, Length: ctrdUsernsSize}}
	return &cri.UserNamespace{Mode: cri.NamespaceMode_POD, Uids: m, Gids: m}
}

// ownerUserNS returns the inode of the user namespace owning the namespace at path.
func ownerUserNS(t *testing.T, path string) uint64 {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	owner, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	if err != nil {
		t.Fatalf("NS_GET_USERNS %s: %v", path, err)
	}
	defer unix.Close(owner)
	var st unix.Stat_t
	if err := unix.Fstat(owner, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func (c *ctrd) userns(t *testing.T, handler string) {
	ctx := ctxT(t)
	before := c.leftovers()
	pod := c.podConfig("userns-" + handler)
	pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = ctrdUsernsOptions()
	podID := c.runPod(ctx, t, pod, handler)
	removed := false
	defer func() {
		if !removed {
			c.removePod(ctx, t, podID)
		}
	}()

	// A hostPath volume owned by root on the host, with a root-owned file.
	vol := filepath.Join(c.dir, "uservol-"+handler)
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "hostfile"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := ctrdUsernsOptions()
	cfg := c.ctrConfig("userns", "sleep", "3600")
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{UsernsOptions: m}
	cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: vol, UidMappings: m.Uids, GidMappings: m.Gids}}
	id, err := c.createStart(ctx, podID, pod, cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, c.logTail(6000))
	}
	run := func(cmd ...string) string {
		t.Helper()
		ex, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 10})
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		if ex.ExitCode != 0 {
			t.Fatalf("exec %q: exit %d: %s%s", cmd, ex.ExitCode, ex.Stdout, ex.Stderr)
		}
		return strings.TrimSpace(string(ex.Stdout))
	}
	want := fmt.Sprintf("0 %d %d", ctrdUsernsHost, ctrdUsernsSize)
	for _, f := range []string{"uid_map", "gid_map"} {
		if got := strings.Join(strings.Fields(run("cat", "/proc/self/"+f)), " "); got != want {
			t.Errorf("/proc/self/%s inside = %q, want %q", f, got, want)
		}
	}
	if got := run("id", "-u"); got != "0" {
		t.Errorf("id -u inside = %q, want 0", got)
	}
	// The rootfs: the image's files are root's, and root can write (a new file and a
	// copy-up of an image directory).
	if got := run("stat", "-c", "%u:%g", "/bin/busybox"); got != "0:0" {
		t.Errorf("image file /bin/busybox owned by %s inside, want 0:0 (idmapped layers)", got)
	}
	if got := run("sh", "-c", "echo hi > /written && mkdir -p /etc/x && echo y > /etc/x/f && cat /written /etc/x/f && stat -c %u:%g /written /etc/x/f"); got != "hi\ny\n0:0\n0:0" {
		t.Errorf("rootfs write as container root: %q", got)
	}
	// The pod's files and /dev/shm (the shim sandboxer's own, containerd's under
	// podsandbox) are usable by the pod's root.
	if got := run("sh", "-c", "echo s > /dev/shm/f && cat /dev/shm/f && cat /etc/hostname && test -s /etc/resolv.conf && grep -c localhost /etc/hosts"); got != "s\nuserns-"+handler+"\n1" && got != "s\nuserns-"+handler+"\n2" {
		t.Errorf("/dev/shm, /etc/hostname, /etc/resolv.conf, /etc/hosts inside: %q", got)
	}
	// On disk, the upper dir holds host ids, as containerd's overlayfs snapshotter
	// prepares it (chowned to the mapped root, lower layers idmapped, upper not).
	uppers, _ := filepath.Glob(filepath.Join(c.root, "io.containerd.snapshotter.v1.overlayfs", "snapshots", "*", "fs", "written"))
	if len(uppers) != 1 {
		t.Errorf("upper dir copies of /written: %v, want one", uppers)
	}
	for _, u := range uppers {
		var st syscall.Stat_t
		if err := syscall.Lstat(u, &st); err != nil || st.Uid != ctrdUsernsHost || st.Gid != ctrdUsernsHost {
			t.Errorf("%s is %d:%d on disk (%v), want %d:%d (host ids)", u, st.Uid, st.Gid, err, ctrdUsernsHost, ctrdUsernsHost)
		}
	}
	// The volume: the host's root-owned file is root's inside; what the container's
	// root writes is owned by host uid 0, the in-container id (idmapped bind).
	if got := run("stat", "-c", "%u:%g", "/data/hostfile"); got != "0:0" {
		t.Errorf("root-owned volume file owned by %s inside, want 0:0 (idmapped bind)", got)
	}
	run("sh", "-c", "echo hi > /data/written && chown 1000:1000 /data/hostfile")
	var vst syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(vol, "written"), &vst); err != nil {
		t.Fatal(err)
	} else if vst.Uid != 0 || vst.Gid != 0 {
		t.Errorf("file the container wrote to the volume is %d:%d on the host, want 0:0 (idmapped bind)", vst.Uid, vst.Gid)
	}
	if err := syscall.Lstat(filepath.Join(vol, "hostfile"), &vst); err != nil {
		t.Fatal(err)
	} else if vst.Uid != 1000 || vst.Gid != 1000 {
		t.Errorf("volume file chowned to 1000:1000 inside is %d:%d on the host, want 1000:1000", vst.Uid, vst.Gid)
	}

	// The host's view: the container runs as the range's root, in the pod's user
	// namespace, and its network namespace (containerd's, set up by CNI) belongs to
	// that user namespace, so the pod's root owns its network.
	pid := c.ctrPid(ctx, t, id)
	if got := procStatusID(t, pid, "Uid"); got != fmt.Sprint(ctrdUsernsHost) {
		t.Errorf("container process runs as host uid %s, want %d", got, ctrdUsernsHost)
	}
	proc := fmt.Sprintf("/proc/%d/ns/", pid)
	if user, net := nsInode(t, proc+"user"), ownerUserNS(t, proc+"net"); user != net {
		t.Errorf("the container's network namespace is owned by user namespace %d, not the pod's %d", net, user)
	}
	for _, ns := range []string{"ipc", "uts", "pid"} {
		if user, owner := nsInode(t, proc+"user"), ownerUserNS(t, proc+ns); user != owner {
			t.Errorf("the container's %s namespace is owned by user namespace %d, not the pod's %d", ns, owner, user)
		}
	}
	ps, err := c.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: podID})
	if err != nil {
		t.Fatal(err)
	}
	if ps.GetStatus().GetNetwork().GetIp() == "" {
		t.Errorf("the user-namespaced pod has no IP")
	}
	if got := run("cat", "/sys/class/net/lo/flags"); got != "0x9" {
		t.Errorf("lo flags %q inside, want 0x9 (up, loopback, and the pod's sysfs)", got)
	}

	// containerd killed and restarted: the pod is found again, its container runs on
	// as the range's root.
	c.restart(syscall.SIGKILL)
	if ps, err := c.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: podID}); err != nil || ps.GetStatus().GetState() != cri.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod after containerd's restart: %v %v", ps.GetStatus().GetState(), err)
	}
	if got := run("sh", "-c", "id -u; cat /written"); got != "0\nhi" {
		t.Errorf("after containerd's restart: %q, want 0 and the rootfs file", got)
	}
	if got := procStatusID(t, pid, "Uid"); got != fmt.Sprint(ctrdUsernsHost) {
		t.Errorf("container process after containerd's restart runs as host uid %s, want %d", got, ctrdUsernsHost)
	}

	if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Errorf("StopPodSandbox: %v", err)
	}
	if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Errorf("RemovePodSandbox: %v", err)
	}
	removed = true
	c.assertClean(t, 20*time.Second, before)
}
