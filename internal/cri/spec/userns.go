package spec

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/mount"
)

// UserNS is a pod's validated user namespace: the single uid and gid range kubelet
// hands out (hostUsers: false), container id 0 first.
type UserNS struct {
	UID specs.LinuxIDMapping
	GID specs.LinuxIDMapping
}

// PodUserNS validates a pod's (or a container's) userns_options. It returns nil for
// the host's user namespace (no options, or mode NODE) and the mappings for mode POD.
// Every refusal is InvalidArgument and says what to change:
//   - modes CONTAINER and TARGET: the CRI defines them, kubelet never sends them and
//     crisp, like containerd, does not implement them;
//   - NODE with mappings: the mappings would be ignored;
//   - POD with anything but exactly one uid range and one gid range: the CRI's
//     contract (kubelet allocates one contiguous range per pod);
//   - a range that is empty, does not start at container id 0 (root inside must be
//     mapped, or the image's root-owned files have no owner inside), or overflows the
//     32-bit id space on either side;
//   - uid and gid ranges that differ: kubelet always sends the same range for both,
//     and the idmapped rootfs layers take one user namespace for both, so a difference
//     is a caller bug rather than something to honour half-way.
func PodUserNS(ns *runtime.NamespaceOption) (*UserNS, error) {
	u := ns.GetUsernsOptions()
	if u == nil {
		return nil, nil
	}
	switch u.GetMode() {
	case runtime.NamespaceMode_NODE:
		if len(u.GetUids()) > 0 || len(u.GetGids()) > 0 {
			return nil, invalidf("user namespace mode NODE takes no uid or gid mappings (got %d uid and %d gid ranges): drop them or use mode POD", len(u.GetUids()), len(u.GetGids()))
		}
		return nil, nil
	case runtime.NamespaceMode_POD:
	default:
		return nil, invalidf("user namespace mode %s is not supported: use POD (hostUsers: false) or NODE", u.GetMode())
	}
	uid, err := oneRange("uid", u.GetUids())
	if err != nil {
		return nil, err
	}
	gid, err := oneRange("gid", u.GetGids())
	if err != nil {
		return nil, err
	}
	if uid != gid {
		return nil, invalidf("user namespace: uid mapping %s and gid mapping %s differ; crisp needs the same range for both (as kubelet allocates)", fmtRange(uid), fmtRange(gid))
	}
	return &UserNS{UID: uid, GID: gid}, nil
}

func oneRange(kind string, ms []*runtime.IDMapping) (specs.LinuxIDMapping, error) {
	if len(ms) != 1 {
		return specs.LinuxIDMapping{}, invalidf("user namespace mode POD needs exactly one %s mapping, got %d", kind, len(ms))
	}
	m := specs.LinuxIDMapping{ContainerID: ms[0].GetContainerId(), HostID: ms[0].GetHostId(), Size: ms[0].GetLength()}
	switch {
	case m.Size == 0:
		return m, invalidf("user namespace %s mapping %s has length 0", kind, fmtRange(m))
	case m.ContainerID != 0:
		return m, invalidf("user namespace %s mapping %s does not map container id 0: the range must start at container id 0", kind, fmtRange(m))
	case uint64(m.HostID)+uint64(m.Size) > math.MaxUint32:
		// The last id (2^32-1) is the kernel's "invalid id" and cannot be mapped.
		return m, invalidf("user namespace %s mapping %s overflows the host id space (host id + length must stay below 2^32-1)", kind, fmtRange(m))
	case uint64(m.ContainerID)+uint64(m.Size) > math.MaxUint32:
		return m, invalidf("user namespace %s mapping %s overflows the container id space", kind, fmtRange(m))
	}
	return m, nil
}

func fmtRange(m specs.LinuxIDMapping) string {
	return fmt.Sprintf("container %d -> host %d (length %d)", m.ContainerID, m.HostID, m.Size)
}

// ContainerUserNS checks a container's userns_options against its pod's user
// namespace: a container joins the pod's user namespace or, in a pod without one,
// stays in the host's. kubelet copies the pod's options into every container, so
// options that are absent mean "the pod's"; options that are present must say the same.
func ContainerUserNS(ctr, pod *runtime.NamespaceOption) (*UserNS, error) {
	podNS, err := PodUserNS(pod)
	if err != nil {
		return nil, fmt.Errorf("pod: %w", err)
	}
	if ctr.GetUsernsOptions() == nil {
		return podNS, nil
	}
	ctrNS, err := PodUserNS(ctr)
	if err != nil {
		return nil, err
	}
	switch {
	case podNS == nil && ctrNS != nil:
		return nil, invalidf("container asks for a user namespace (%s) but its pod runs in the host's: set userns_options on the pod", fmtRange(ctrNS.UID))
	case podNS != nil && ctrNS == nil:
		return nil, invalidf("container asks for the host user namespace but its pod has its own (%s): containers join the pod's", fmtRange(podNS.UID))
	case podNS != nil && *podNS != *ctrNS:
		return nil, invalidf("container user namespace mappings %s differ from the pod's %s: containers join the pod's user namespace", fmtRange(ctrNS.UID), fmtRange(podNS.UID))
	}
	return podNS, nil
}

// CheckPodUserNS refuses the pod settings a user-namespaced pod cannot have, as
// kubelet's validation does for hostUsers: false: the host's IPC or PID namespace (the
// pod's own namespaces are created inside its user namespace, the host's belong to the
// initial one and would be out of its root's reach), and privileged pods. The host
// network is allowed, as containerd 2.x allows it (user_namespaces_host_network;
// Kubernetes sends it with the UserNamespacesHostNetworkSupport feature gate): the pod
// keeps the host's network and UTS namespaces, which its root cannot change since they
// belong to the initial user namespace.
func CheckPodUserNS(pod *runtime.PodSandboxConfig) error {
	sc := pod.GetLinux().GetSecurityContext()
	ns := sc.GetNamespaceOptions()
	if ns.GetIpc() == runtime.NamespaceMode_NODE {
		return invalidf("a pod with a user namespace cannot use the host ipc namespace (hostUsers: false excludes hostIPC)")
	}
	if ns.GetPid() == runtime.NamespaceMode_NODE {
		return invalidf("a pod with a user namespace cannot use the host pid namespace (hostUsers: false excludes hostPID)")
	}
	if sc.GetPrivileged() {
		return invalidf("a pod with a user namespace cannot be privileged")
	}
	return nil
}

// IDMappedMountsSupported reports whether user-namespaced pods can run here: the
// kernel must have user namespaces, idmapped mounts on the filesystem under dir
// (where the overlay snapshots live) and overlayfs that takes idmapped layers (5.19+).
// It mounts for real what a container of such a pod gets: an overlay of idmapped
// layers below dir, through mount.AllIDMapped, in a user namespace a throwaway child
// made; everything is unmounted and removed again. Callers probe once at start.
func IDMappedMountsSupported(dir string) error {
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		return fmt.Errorf("user namespaces: %w", err)
	}
	usernsFd, cleanup, err := probeUserNS()
	if err != nil {
		return err
	}
	defer cleanup()
	tmp, err := os.MkdirTemp(dir, ".idmap-probe-")
	if err != nil {
		return fmt.Errorf("idmapped mount probe: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return fmt.Errorf("idmapped mount probe: %w", err)
		}
	}
	merged := filepath.Join(tmp, "merged")
	ov := mount.Mount{Type: "overlay", Source: "overlay", Options: []string{
		"lowerdir=" + filepath.Join(tmp, "lower"), "upperdir=" + filepath.Join(tmp, "upper"), "workdir=" + filepath.Join(tmp, "work"),
	}}
	// The probe namespace maps its root to 65534 (probeUserNS).
	err = mount.AllIDMapped([]mount.Mount{ov}, merged, mount.IDMap{UserNS: fmt.Sprintf("/proc/self/fd/%d", usernsFd), RootUID: 65534, RootGID: 65534})
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("idmapped overlay below %s: the kernel or the filesystem does not support idmapped layers (Linux 5.19+): %w", dir, err)
		}
		return fmt.Errorf("idmapped overlay below %s: %w", dir, err)
	}
	if err := mount.Unmount(merged); err != nil {
		return fmt.Errorf("idmapped mount probe: %w", err)
	}
	return nil
}

// probeUserNS starts a short-lived child in a new user namespace (one id mapped) and
// returns a file descriptor of that namespace. The fd keeps the namespace alive after
// the child is gone, which is all mount_setattr needs. Go cannot enter a new user
// namespace in a multithreaded process, hence the child; sleep(1) is the smallest
// program every node has.
func probeUserNS() (fd int, cleanup func(), err error) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return -1, nil, fmt.Errorf("probe user namespace: %w", err)
	}
	cmd := exec.Command(sleep, "10")
	// The maps are written after the start, not with UidMappings, whose file a
	// concurrent fork can inherit (mount.WriteIDMaps).
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
	if err := cmd.Start(); err != nil {
		return -1, nil, fmt.Errorf("start a process in a new user namespace: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	one := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}}
	if err := mount.WriteIDMaps(cmd.Process.Pid, one, one); err != nil {
		stop()
		return -1, nil, fmt.Errorf("probe user namespace: %w", err)
	}
	fd, err = unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	stop()
	if err != nil {
		return -1, nil, fmt.Errorf("open user namespace of probe: %w", err)
	}
	return fd, func() { _ = unix.Close(fd) }, nil
}
