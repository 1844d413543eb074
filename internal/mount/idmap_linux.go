package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// IDMap says how to idmap a rootfs for a container in a user namespace.
type IDMap struct {
	// UserNS is the user namespace file (/proc/<pid>/ns/user) whose mapping the
	// idmapped mounts use.
	UserNS string
	// RootUID and RootGID are the host ids of the namespace's root (container id 0).
	// The overlay is mounted with these as its filesystem ids, because overlayfs
	// creates its work directory and copies up with the mounter's credentials, and
	// through an idmapped upper layer only mapped ids can create files.
	RootUID, RootGID uint32
}

// AllIDMapped mounts ms on target like All, but with idmapped layers (Linux 5.19+):
// every overlay lowerdir and the directory holding upperdir and workdir are cloned
// (open_tree(OPEN_TREE_CLONE)), idmapped with the user namespace
// (mount_setattr(MOUNT_ATTR_IDMAP)) and given to overlayfs; a bind mount is cloned and
// idmapped the same way and attached with move_mount. The files, owned on disk by
// 0..n, then appear owned by the namespace's host range, that is by 0..n inside the
// container, and what the container writes lands on disk with its in-container ids.
//
// Overlayfs takes only attached mounts as layers before Linux 6.15 (clone_private_mount
// refuses a detached one: "failed to clone lowerpath", EINVAL; Debian 12 and Ubuntu
// 24.04 run 6.1 and 6.8), so the clones are attached below a staging directory next to
// target (see stagingDir) for the overlay mount and detached right after it, as
// containerd does: overlayfs holds private references to its layers. The lower layers
// are attached read-only, so that nothing ever deletes image files through a staging
// mount a crash left behind; Unmount(target) removes such leftovers.
func AllIDMapped(ms []Mount, target string, idmap IDMap) (retErr error) {
	userns, err := unix.Open(idmap.UserNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open user namespace %s: %w", idmap.UserNS, err)
	}
	defer unix.Close(userns)
	var done int
	defer func() {
		if retErr != nil && done > 0 {
			_ = Unmount(target)
		}
	}()
	for _, m := range ms {
		var err error
		switch {
		case m.Type == "overlay":
			err = mountIDMappedOverlay(m, target, userns, &idmap)
		case isBind(m.Options):
			err = mountIDMappedBind(m, target, userns)
		default:
			err = fmt.Errorf("mount %s %s: only overlay and bind mounts can be idmapped", m.Type, m.Source)
		}
		if err != nil {
			return err
		}
		done++
	}
	return nil
}

func isBind(options []string) bool {
	flags, _ := parse(options)
	return flags&unix.MS_BIND != 0
}

// idmappedTree returns a detached, idmapped clone of the mount at path (only the mount
// itself: lower layers and snapshot directories have no submounts), read-only if ro.
func idmappedTree(path string, userns int, ro bool) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns)}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("idmap %s: %w", path, err)
	}
	return fd, nil
}

// stagingDir is where the idmapped layers of the overlay on target are attached while
// it is mounted.
func stagingDir(target string) string { return target + ".idmap" }

// attachStaged attaches the detached mount fd at a new directory name below staging.
func attachStaged(fd int, staging, name string) (string, error) {
	dir := filepath.Join(staging, name)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return "", fmt.Errorf("create staging mount point: %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		_ = os.Remove(dir)
		return "", fmt.Errorf("attach idmapped layer at %s: %w", dir, err)
	}
	return dir, nil
}

// removeStaging detaches whatever is attached below staging and removes it. It never
// deletes below a mount point: a directory that stays busy is an error.
func removeStaging(staging string) error {
	entries, err := os.ReadDir(staging)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", staging, err)
	}
	var errs []error
	for _, en := range entries {
		dir := filepath.Join(staging, en.Name())
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("detach %s: %w", dir, err))
			continue
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(staging); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountIDMappedOverlay mounts an overlay of idmapped lower layers on target. With
// idmap, the directory of upperdir and workdir is idmapped too and the overlay is
// mounted with the namespace root's filesystem ids (crisp's own snapshots store
// in-container ids); without, upperdir and workdir are used as they are and the
// overlay is mounted with the caller's ids (containerd's snapshots, whose upper dir is
// owned by the mapped root and stores host ids).
func mountIDMappedOverlay(m Mount, target string, userns int, idmap *IDMap) error {
	flags, data := parse(m.Options)
	var lowers []string
	var upper, work string
	var rest []string
	for _, o := range strings.Split(data, ",") {
		switch {
		case strings.HasPrefix(o, "lowerdir="):
			lowers = strings.Split(strings.TrimPrefix(o, "lowerdir="), ":")
		case strings.HasPrefix(o, "upperdir="):
			upper = strings.TrimPrefix(o, "upperdir=")
		case strings.HasPrefix(o, "workdir="):
			work = strings.TrimPrefix(o, "workdir=")
		case o != "":
			rest = append(rest, o)
		}
	}
	if len(lowers) == 0 {
		return fmt.Errorf("idmapped overlay on %s: no lowerdir in %v", target, m.Options)
	}
	if (upper == "") != (work == "") {
		return fmt.Errorf("idmapped overlay on %s: upperdir and workdir go together (%v)", target, m.Options)
	}
	staging := stagingDir(target)
	// A staging dir left by a crash is cleared first; the new one goes when the
	// overlay holds its layers (or failed to).
	if err := removeStaging(staging); err != nil {
		return fmt.Errorf("idmapped overlay on %s: %w", target, err)
	}
	if err := os.Mkdir(staging, 0o711); err != nil {
		return fmt.Errorf("idmapped overlay on %s: create staging dir: %w", target, err)
	}
	defer func() { _ = removeStaging(staging) }()
	n := 0
	tree := func(path string, ro bool) (string, error) {
		fd, err := idmappedTree(path, userns, ro)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		n++
		return attachStaged(fd, staging, strconv.Itoa(n))
	}
	opts := make([]string, 0, len(rest)+3)
	if upper != "" && idmap == nil {
		opts = append(opts, "upperdir="+upper, "workdir="+work)
	}
	if upper != "" && idmap != nil {
		// overlayfs wants upperdir and workdir on one mount: clone their common parent
		// (the snapshot directory) once.
		parent := filepath.Dir(upper)
		if filepath.Dir(work) != parent {
			return fmt.Errorf("idmapped overlay on %s: upperdir %s and workdir %s must share a parent directory", target, upper, work)
		}
		p, err := tree(parent, false)
		if err != nil {
			return err
		}
		opts = append(opts, "upperdir="+p+"/"+filepath.Base(upper), "workdir="+p+"/"+filepath.Base(work))
	}
	idmapped := make([]string, len(lowers))
	for i, l := range lowers {
		p, err := tree(l, true)
		if err != nil {
			return err
		}
		idmapped[i] = p
	}
	opts = append(opts, "lowerdir="+strings.Join(idmapped, ":"))
	opts = append(opts, rest...)
	optString := strings.Join(opts, ",")

	// On a thread of its own with the filesystem ids of the namespace's root: overlayfs
	// keeps the mounter's credentials for its own work (work dir, copy-up), and host
	// root is not mapped in the idmapped upper layer (EOVERFLOW). setfsuid clears the
	// file capabilities from the effective set; they are raised again from the
	// permitted set so that copy-up may still read any file, as with a normal overlay.
	// The thread is never unlocked, so Go discards it afterwards.
	if idmap == nil {
		if err := unix.Mount("overlay", target, "overlay", flags, optString); err != nil {
			return fmt.Errorf("mount overlay of idmapped lower layers on %s (lowers %v, upper %s): %w", target, lowers, upper, err)
		}
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- mountAsIDs(optString, target, flags, idmap.RootUID, idmap.RootGID)
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("mount idmapped overlay on %s (lowers %v, upper %s): %w", target, lowers, upper, err)
	}
	return nil
}

// mountAsIDs must run on a locked thread that is thrown away afterwards.
func mountAsIDs(data, target string, flags uintptr, uid, gid uint32) error {
	// setfsuid/setfsgid return the previous id and cannot fail visibly; the result is
	// checked by asking for the current one (-1 leaves it unchanged).
	_ = unix.Setfsgid(int(gid))
	_ = unix.Setfsuid(int(uid))
	if cur, _ := unix.SetfsuidRetUid(-1); cur != int(uid) {
		return fmt.Errorf("setfsuid %d: still %d", uid, cur)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	caps[0].Effective, caps[1].Effective = caps[0].Permitted, caps[1].Permitted
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return unix.Mount("overlay", target, "overlay", flags, data)
}

func mountIDMappedBind(m Mount, target string, userns int) error {
	flags, _ := parse(m.Options)
	fd, err := idmappedTree(m.Source, userns, false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if flags&unix.MS_RDONLY != 0 {
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
			return fmt.Errorf("make idmapped %s read-only: %w", m.Source, err)
		}
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach idmapped %s on %s: %w", m.Source, target, err)
	}
	return nil
}

// HostRootIDs reads the host uid and gid that container id 0 maps to in the user
// namespace of process pid (from /proc/<pid>/uid_map and gid_map).
func HostRootIDs(pid int) (uid, gid uint32, err error) {
	read := func(file string) (uint32, error) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(data), "\n") {
			var inside, outside, size uint32
			if n, _ := fmt.Sscan(line, &inside, &outside, &size); n == 3 && inside == 0 && size > 0 {
				return outside, nil
			}
		}
		return 0, fmt.Errorf("/proc/%d/%s maps no id 0", pid, file)
	}
	if uid, err = read("uid_map"); err != nil {
		return 0, 0, err
	}
	if gid, err = read("gid_map"); err != nil {
		return 0, 0, err
	}
	return uid, gid, nil
}

// errNotIDMapped is returned by UserNSPid for a path that does not name a process's
// user namespace.
var errNotIDMapped = errors.New("not a /proc/<pid>/ns/user path")

// UserNSPid extracts pid from a /proc/<pid>/ns/user path, the form in which OCI specs
// name a user namespace to join.
func UserNSPid(path string) (int, error) {
	var pid int
	if n, err := fmt.Sscanf(path, "/proc/%d/ns/user", &pid); n != 1 || err != nil || pid <= 0 || fmt.Sprintf("/proc/%d/ns/user", pid) != path {
		return 0, fmt.Errorf("user namespace %q: %w", path, errNotIDMapped)
	}
	return pid, nil
}
