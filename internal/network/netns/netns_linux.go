package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	// dirMu serialises making a pin directory a shared mount, so that two first pods
	// racing each other do not stack two bind mounts on it.
	dirMu sync.Mutex
	// sharedDirs are the pin directories this process has already made shared.
	sharedDirs = map[string]bool{}
)

// New creates a network namespace with lo up, pins it at dir/name and returns that path.
func New(dir, name string) (path string, err error) {
	if err := validName(name); err != nil {
		return "", err
	}
	if err := ensureSharedDir(dir); err != nil {
		return "", err
	}
	path = filepath.Join(dir, name)
	err = pinAt(path, func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare network namespace: %w", err)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return path, nil
}

// Pin pins the network namespace of process pid at dir/name, with lo up, and returns
// that path. It is for namespaces a pod makes itself: a pod with a user namespace has
// its pause process create the network namespace inside it, so that the namespace is
// owned by the pod's user namespace; CNI then configures it through this pin.
func Pin(dir, name string, pid int) (path string, err error) {
	if err := validName(name); err != nil {
		return "", err
	}
	if pid <= 0 {
		return "", fmt.Errorf("pin netns of pid %d: invalid pid", pid)
	}
	if err := ensureSharedDir(dir); err != nil {
		return "", err
	}
	// Opened first so that a pid reused between here and the mount cannot be pinned:
	// the fd names the namespace of the process that is alive now.
	src, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open network namespace of pid %d: %w", pid, err)
	}
	defer unix.Close(src)
	path = filepath.Join(dir, name)
	err = pinAt(path, func() error {
		if err := unix.Setns(src, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return path, nil
}

// pinAt creates the pin file path (O_EXCL: a leftover pin of the same name must be
// removed deliberately, not reused) and pins there the namespace enter moves a fresh
// locked thread into, with lo up; on error nothing is left at path.
func pinAt(path string, enter func() error) (err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("create netns pin %s: %w", path, err)
	}
	_ = f.Close()
	defer func() {
		if err != nil {
			if rerr := Remove(path); rerr != nil {
				err = fmt.Errorf("%w (cleanup: %v)", err, rerr)
			}
		}
	}()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: should anything leave the thread in the new namespace, the
		// runtime terminates it when this goroutine returns instead of reusing it.
		runtime.LockOSThread()
		errc <- pinFromThread(path, enter)
	}()
	return <-errc
}

// pinFromThread moves the calling (locked) thread into a network namespace with
// enter, brings lo up there and bind-mounts the namespace onto path. The thread also
// goes back to where it came from: if it is the main thread, Go parks it forever
// instead of ending it, and a thread left inside would keep the pod's namespace, and
// its veth, alive after Remove.
func pinFromThread(path string, enter func() error) (err error) {
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open current network namespace: %w", err)
	}
	defer unix.Close(orig)
	if err := enter(); err != nil {
		return err
	}
	defer func() {
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr != nil && err == nil {
			err = fmt.Errorf("return to the original network namespace: %w", serr)
		}
	}()
	// Done here, on the thread already inside the namespace, so that no loopback
	// CNI plugin has to be executed for every pod.
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in network namespace: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring lo up in network namespace: %w", err)
	}
	if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount network namespace onto %s: %w", path, err)
	}
	return nil
}

// ensureSharedDir makes dir a shared mount point the way `ip netns add` does for
// /run/netns, so that pins propagate to mount namespaces that copied dir and an
// unmount here also goes away there instead of keeping the namespace alive.
func ensureSharedDir(dir string) error {
	dir = filepath.Clean(dir)
	dirMu.Lock()
	defer dirMu.Unlock()
	if sharedDirs[dir] {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns directory: %w", err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		sharedDirs[dir] = true
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	// EINVAL: dir is not a mount point yet.
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	sharedDirs[dir] = true
	return nil
}

// Remove unpins and deletes the namespace file at path. It succeeds if path does not exist.
func Remove(path string) error {
	if path == "" {
		return errors.New("remove netns: empty path")
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove netns: %w", err)
	}
	if fi.IsDir() {
		// Refuse rather than unmount whatever a wrong path points at.
		return fmt.Errorf("remove netns %s: is a directory", path)
	}
	// A loop, bounded, because a pin can have been mounted over more than once by
	// hand or by a crashed older runtime, and the file cannot go while any is left.
	for i := 0; i < 8 && IsPinned(path); i++ {
		err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EBUSY) {
			// Someone still has the namespace file open through this mount; detach it
			// so the path is free, the namespace lives on until they close it.
			err = unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmount netns %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns: %w", err)
	}
	return nil
}

// IsPinned reports whether path exists and has a namespace (nsfs) mounted on it.
func IsPinned(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0) {
		return fmt.Errorf("invalid netns name %q: must be a single path element", name)
	}
	return nil
}
