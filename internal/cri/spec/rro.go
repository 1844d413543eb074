package spec

import (
	"errors"

	"golang.org/x/sys/unix"
)

// RecursiveReadOnlySupported reports whether the kernel has mount_setattr(2) (Linux
// 5.12), which libcontainer uses for the OCI "rro" option: MOUNT_ATTR_RDONLY with
// AT_RECURSIVE makes a bind mount and every mount below it read-only.
//
// The probe calls mount_setattr on an invalid file descriptor, so it can never change
// a mount: a kernel with the syscall answers EBADF (or EINVAL), one without it ENOSYS.
// EPERM counts as unsupported too: a seccomp filter that refuses the call to criserver
// is most likely the node's, and the shim and container init it starts inherit it. It
// costs one syscall; callers probe once at start.
func RecursiveReadOnlySupported() bool {
	err := unix.MountSetattr(-1, "", unix.AT_EMPTY_PATH, &unix.MountAttr{})
	return !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM)
}
