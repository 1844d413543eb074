package spec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Container paths of the pod-level files and of the shared /dev/shm.
const (
	etcHostname    = "/etc/hostname"
	etcHosts       = "/etc/hosts"
	etcResolvConf  = "/etc/resolv.conf"
	devShm         = "/dev/shm"
	cgroupMountDst = "/sys/fs/cgroup"
)

// podFiles maps the files crisp writes per pod (README: root_dir/pods/<id>) to where
// containers see them.
var podFiles = []struct{ file, dst string }{
	{"hostname", etcHostname},
	{"hosts", etcHosts},
	{"resolv.conf", etcResolvConf},
}

// allowedMountOptions are the extra bind options the CRI's mount_options may carry
// (cri-api: "noexec, nodev, nosuid"). Anything else could weaken the mount or confuse
// runc, so it is refused rather than passed on.
var allowedMountOptions = []string{"noexec", "nodev", "nosuid"}

// bindMount is a CRI mount (or one crisp adds the same way) before it becomes an OCI
// bind mount.
type bindMount struct {
	src, dst    string
	readonly    bool
	rro         bool
	propagation runtime.MountPropagation
	options     []string
	// idmap, for a user-namespaced pod's volumes, makes the bind an idmapped mount:
	// host ids are shifted by the mapping, so files the host's root owns appear owned
	// by the container's root.
	idmap *UserNS
}

// mountsInput is what buildMounts needs from Generate.
type mountsInput struct {
	cfg          *runtime.ContainerConfig
	podFilesDir  string
	shmPath      string
	hostIPC      bool
	privileged   bool
	readonlyRoot bool
	cgroupNS     bool
	rroSupported bool
	// userNS is the pod's user namespace; nil for the host's.
	userNS *UserNS
	// hostNetwork: the pod uses the host's network namespace.
	hostNetwork bool
}

// buildMounts returns the container's mounts and the rootfs propagation they need:
// containerd's default mounts (minus /run, as containerd's WithoutRunMount), each
// dropped when a bind mount takes its destination (and everything under /dev when /dev
// itself is bound), then the bind mounts. All are sorted by depth, stably, so that a
// parent is mounted before its children (containerd's orderedMounts, from docker); unlike
// containerd the defaults take part, so a bind at /sys cannot hide /sys/fs/cgroup.
func buildMounts(in mountsInput) ([]specs.Mount, string, error) {
	var binds []bindMount
	taken := map[string]bool{}
	for _, m := range in.cfg.GetMounts() {
		b, err := criMount(m, in.rroSupported)
		if err != nil {
			return nil, "", err
		}
		if b.idmap, err = volumeIDMap(m, in.userNS); err != nil {
			return nil, "", err
		}
		if taken[b.dst] {
			return nil, "", invalidf("two mounts have the container path %s", b.dst)
		}
		binds = append(binds, b)
		taken[b.dst] = true
	}
	// Pod files and /dev/shm are added like CRI mounts (containerd's
	// linuxContainerMounts), unless the CRI already mounts something there (kubelet
	// mounts its own /etc/hosts, for instance). A pod file that does not exist is
	// skipped: the sandbox may have delegated it.
	if in.podFilesDir != "" {
		for _, pf := range podFiles {
			if taken[pf.dst] {
				continue
			}
			src := filepath.Join(in.podFilesDir, pf.file)
			if _, err := os.Stat(src); err != nil {
				continue
			}
			binds = append(binds, bindMount{src: src, dst: pf.dst, readonly: in.readonlyRoot})
			taken[pf.dst] = true
		}
	}
	if !taken[devShm] {
		// hostIPC shares the host's /dev/shm (POSIX shm lives there); otherwise the
		// pod's shared tmpfs, if the sandbox made one.
		switch {
		case in.hostIPC:
			binds = append(binds, bindMount{src: devShm, dst: devShm})
			taken[devShm] = true
		case in.shmPath != "":
			if _, err := os.Stat(in.shmPath); err != nil {
				return nil, "", invalidf("pod shm path %q: %v", in.shmPath, err)
			}
			binds = append(binds, bindMount{src: in.shmPath, dst: devShm})
			taken[devShm] = true
		}
	}
	var out []specs.Mount
	for _, m := range defaultMounts(in.privileged, in.cgroupNS) {
		if taken[m.Destination] || (taken["/dev"] && strings.HasPrefix(m.Destination, "/dev/")) {
			continue
		}
		if m.Destination == "/sys" && in.userNS != nil && in.hostNetwork {
			// The kernel lets only a holder of CAP_SYS_ADMIN over the user namespace
			// owning the network namespace mount sysfs: the host's network belongs to
			// the initial one, so a user-namespaced container on it gets EPERM. The
			// host's /sys is bound instead, read-only down to every submount, as
			// containerd does for the same pods.
			if !in.rroSupported {
				return nil, "", failedPreconditionf("a user-namespaced pod on the host network needs /sys bound recursively read-only, which needs mount_setattr (Linux 5.12 or later)")
			}
			m = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "rro", "nosuid", "nodev", "noexec"}}
		}
		out = append(out, m)
	}
	rootPropagation := ""
	for _, b := range binds {
		opts := []string{"rbind"}
		switch b.propagation {
		case runtime.MountPropagation_PROPAGATION_PRIVATE:
			// runc's rootfs default (rslave/rprivate) already suits this.
			opts = append(opts, "rprivate")
		case runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER:
			if err := ensurePropagation(b.src, false); err != nil {
				return nil, "", err
			}
			opts = append(opts, "rslave")
			if rootPropagation != "rshared" {
				rootPropagation = "rslave"
			}
		case runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL:
			if err := ensurePropagation(b.src, true); err != nil {
				return nil, "", err
			}
			opts = append(opts, "rshared")
			// Mounts made inside the container reach the host only if the
			// container's root is shared too.
			rootPropagation = "rshared"
		}
		switch {
		case b.rro:
			// libcontainer bind-mounts, then applies MOUNT_ATTR_RDONLY with
			// AT_RECURSIVE (mount_setattr) to the mount and every submount under it;
			// plain "ro" would leave submounts writable.
			opts = append(opts, "rro")
		case b.readonly:
			opts = append(opts, "ro")
		default:
			opts = append(opts, "rw")
		}
		opts = append(opts, b.options...)
		mnt := specs.Mount{Destination: b.dst, Type: "bind", Source: b.src, Options: opts}
		if b.idmap != nil {
			// libcontainer idmaps the bind with a user namespace of these mappings
			// (open_tree + mount_setattr(MOUNT_ATTR_IDMAP)). "idmap", not "ridmap":
			// only the volume itself, so a submount on a filesystem without idmap
			// support does not fail the container.
			mnt.Options = append(mnt.Options, "idmap")
			mnt.UIDMappings = []specs.LinuxIDMapping{b.idmap.UID}
			mnt.GIDMappings = []specs.LinuxIDMapping{b.idmap.GID}
		}
		out = append(out, mnt)
	}
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i].Destination, "/") < strings.Count(out[j].Destination, "/")
	})
	return out, rootPropagation, nil
}

// criMount validates one CRI mount. kubelet creates every volume directory itself, so a
// host path that does not exist is an error naming it (containerd would create a
// directory, which hides a wrong path). Symlinks in the host path are resolved, as
// containerd does, so that the bind follows what the host path names now. rroSupported
// says whether the kernel can make a mount read-only recursively (mount_setattr).
func criMount(m *runtime.Mount, rroSupported bool) (bindMount, error) {
	dst := m.GetContainerPath()
	if !path.IsAbs(dst) {
		return bindMount{}, invalidf("mount container_path %q must be an absolute path", dst)
	}
	dst = path.Clean(dst)
	if m.GetHostPath() == "" {
		if m.GetImage().GetImage() != "" {
			// Image volumes (KEP-4639) need the image mounted by the caller; it then
			// passes the mounted directory as host_path.
			return bindMount{}, notImplementedf("mount at %s: image volumes (%s) are not supported", dst, m.GetImage().GetImage())
		}
		return bindMount{}, invalidf("mount at %s has no host_path", dst)
	}
	if !filepath.IsAbs(m.GetHostPath()) {
		return bindMount{}, invalidf("mount host_path %q (for %s) must be an absolute path", m.GetHostPath(), dst)
	}
	src, err := filepath.EvalSymlinks(m.GetHostPath())
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return bindMount{}, invalidf("mount host_path %q (for %s) does not exist on the host", m.GetHostPath(), dst)
		}
		return bindMount{}, invalidf("mount host_path %q (for %s): %v", m.GetHostPath(), dst, err)
	}
	switch m.GetPropagation() {
	case runtime.MountPropagation_PROPAGATION_PRIVATE,
		runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER,
		runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL:
	default:
		return bindMount{}, invalidf("mount at %s: unknown propagation %d", dst, m.GetPropagation())
	}
	// cri-api: recursive_read_only needs readonly and PRIVATE propagation:
	// mount_setattr changes only the mounts present when it runs, so a submount that
	// propagated in later (rslave, rshared) would be writable. containerd and CRI-O
	// refuse the same combinations.
	if m.GetRecursiveReadOnly() {
		if !m.GetReadonly() {
			return bindMount{}, invalidf("mount at %s (host path %s): recursive_read_only needs readonly: set readOnly: true on the volume mount, or drop recursiveReadOnly", dst, m.GetHostPath())
		}
		if m.GetPropagation() != runtime.MountPropagation_PROPAGATION_PRIVATE {
			return bindMount{}, invalidf("mount at %s (host path %s): recursive_read_only needs PRIVATE propagation, not %s: use mountPropagation None, or drop recursiveReadOnly", dst, m.GetHostPath(), m.GetPropagation())
		}
		if !rroSupported {
			return bindMount{}, failedPreconditionf("mount at %s (host path %s): recursive_read_only needs mount_setattr (Linux 5.12 or later), which this kernel does not offer", dst, m.GetHostPath())
		}
	}
	var opts []string
	for _, o := range m.GetMountOptions() {
		if !slices.Contains(allowedMountOptions, o) {
			return bindMount{}, invalidf("mount at %s: mount option %q is not supported (only %s)", dst, o, strings.Join(allowedMountOptions, ", "))
		}
		if !slices.Contains(opts, o) {
			opts = append(opts, o)
		}
	}
	// selinux_relabel is the caller's to apply, from Result.Relabel (see selinux.go).
	return bindMount{
		src:         src,
		dst:         dst,
		readonly:    m.GetReadonly(),
		rro:         m.GetRecursiveReadOnly(),
		propagation: m.GetPropagation(),
		options:     opts,
	}, nil
}

// ensurePropagation checks that the host mount holding src can propagate: shared for
// BIDIRECTIONAL, shared or slave for HOST_TO_CONTAINER (containerd's ensureShared /
// ensureSharedOrSlave). Without it the container would silently see no mount events.
func ensurePropagation(src string, needShared bool) error {
	info, err := lookupMount(src)
	if err != nil {
		return fmt.Errorf("find the mount of %q: %w", src, err)
	}
	for _, opt := range strings.Fields(info.Optional) {
		if strings.HasPrefix(opt, "shared:") || (!needShared && strings.HasPrefix(opt, "master:")) {
			return nil
		}
	}
	want, mode := "shared or slave", "HOST_TO_CONTAINER"
	if needShared {
		want, mode = "shared", "BIDIRECTIONAL"
	}
	return failedPreconditionf("host path %q is on mount %q, which is not %s: %s propagation needs it (mount --make-rshared %s)",
		src, info.Mountpoint, want, mode, info.Mountpoint)
}

// defaultMounts are containerd's default Linux mounts without /run, plus the cgroup
// mount its CRI plugin adds. Privileged containers get sysfs and cgroupfs read-write
// (oci.WithPrivileged).
func defaultMounts(privileged, cgroupNS bool) []specs.Mount {
	rw := "ro"
	if privileged {
		rw = "rw"
	}
	cgroupOpts := []string{"nosuid", "noexec", "nodev", "relatime", rw}
	if !cgroupNS && cgroup2() {
		// Without its own cgroup namespace the container mounts the host's single
		// cgroup2 superblock, and mount options apply to it: keep the host's
		// nsdelegate and memory_recursiveprot or the host would lose them.
		if info, err := lookupMount(cgroupMountDst); err == nil {
			for _, o := range strings.Split(info.VFSOptions, ",") {
				if o == "nsdelegate" || o == "memory_recursiveprot" {
					cgroupOpts = append(cgroupOpts, o)
				}
			}
		}
	}
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: devShm, Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", rw}},
		{Destination: cgroupMountDst, Type: "cgroup", Source: "cgroup", Options: cgroupOpts},
	}
}

// volumeIDMap decides a CRI volume's id mapping. In a pod with a user namespace every
// volume is idmapped: with the mount's own mappings if the CRI gives them, else with the
// pod's (the ids the container sees then match the ones on the host shifted by the
// pod's range, and root-owned volume files are root-owned inside). In a pod without one,
// mount mappings make no sense: there is no container id space to map to.
func volumeIDMap(m *runtime.Mount, pod *UserNS) (*UserNS, error) {
	if len(m.GetUidMappings()) == 0 && len(m.GetGidMappings()) == 0 {
		return pod, nil
	}
	if pod == nil {
		return nil, invalidf("mount at %s has uid/gid mappings but the pod has no user namespace", m.GetContainerPath())
	}
	uid, err := oneRange("uid", m.GetUidMappings())
	if err != nil {
		return nil, fmt.Errorf("mount at %s: %w", m.GetContainerPath(), err)
	}
	gid, err := oneRange("gid", m.GetGidMappings())
	if err != nil {
		return nil, fmt.Errorf("mount at %s: %w", m.GetContainerPath(), err)
	}
	return &UserNS{UID: uid, GID: gid}, nil
}
