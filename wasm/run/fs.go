package run

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"
)

// confinedFS is a directory preopened for the module whose symlinks resolve inside
// it. wazero's own DirFS joins a guest path to its directory and lets the host kernel
// follow symlinks, so a symlink in an image (or one the module creates: WASI has
// path_symlink) to "/" would open the host's files. Every path is resolved here with
// SecureJoin first, as if the directory were "/", and only the resolved path, which
// holds no symlink, is handed to DirFS. Operations on a link itself (lstat, readlink,
// unlink, rename, link, symlink, mkdir, rmdir, an O_NOFOLLOW open) resolve only the
// parent and keep the last name as it is.
//
// A module runs alone in its process and WASI preview 1 has no threads, so only
// another container sharing a writable bind mount could swap a directory for a
// symlink between the resolution and the use; the shim runs the module in the
// container's mount namespace when it needs more than this.
type confinedFS struct {
	experimentalsys.UnimplementedFS
	root string // cleaned, symlinks resolved
	dir  experimentalsys.FS
}

// newConfinedFS returns dir (a host directory whose own path is trusted) confined to
// itself, read-only when ro.
func newConfinedFS(dir string, ro bool) experimentalsys.FS {
	var f experimentalsys.FS = &confinedFS{root: dir, dir: sysfs.DirFS(dir)}
	if ro {
		f = &readOnlyFS{ReadFS: sysfs.ReadFS{FS: f}}
	}
	return f
}

// readOnlyFS is wazero's ReadFS (every change refused with EROFS, files opened
// read-only wrapped so that they cannot be changed through their descriptor) but for
// its open for writing, which it refuses with ENOSYS ("Not implemented") and lets
// O_CREAT and O_TRUNC through: here all three are EROFS, "read-only file system", as
// on a read-only mount.
type readOnlyFS struct {
	sysfs.ReadFS
}

// OpenFile implements experimentalsys.FS.
func (r *readOnlyFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	writes := flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR) != 0 ||
		flag&(experimentalsys.O_CREAT|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0
	if !writes {
		return r.ReadFS.OpenFile(p, flag, perm)
	}
	if flag&experimentalsys.O_DIRECTORY != 0 {
		return nil, experimentalsys.EISDIR
	}
	return nil, experimentalsys.EROFS
}

// resolve returns guest path p (relative to the mount, as wazero passes it) with
// every symlink resolved inside the mount, relative to it again.
func (c *confinedFS) resolve(p string) (string, experimentalsys.Errno) {
	host, err := securejoin.SecureJoin(c.root, p)
	if err != nil {
		return "", errnoOf(err)
	}
	rel, err := filepath.Rel(c.root, host)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		// SecureJoin never leaves root; this is the backstop.
		return "", experimentalsys.EPERM
	}
	return rel, 0
}

// resolveParent resolves the directory of p and keeps its last name.
func (c *confinedFS) resolveParent(p string) (string, experimentalsys.Errno) {
	dir, name := path.Split(strings.TrimSuffix(p, "/"))
	if name == "" || name == "." || name == ".." {
		// The mount's root, or a name the kernel resolves itself: resolve it whole.
		return c.resolve(p)
	}
	d, errno := c.resolve(dir)
	if errno != 0 {
		return "", errno
	}
	return path.Join(d, name), 0
}

func errnoOf(err error) experimentalsys.Errno {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return experimentalsys.ENOENT
	case errors.Is(err, fs.ErrPermission):
		return experimentalsys.EACCES
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return experimentalsys.UnwrapOSError(pe.Err)
	}
	return experimentalsys.EIO
}

// OpenFile implements experimentalsys.FS.
func (c *confinedFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	var (
		r     string
		errno experimentalsys.Errno
	)
	if flag&experimentalsys.O_NOFOLLOW != 0 {
		r, errno = c.resolveParent(p)
	} else {
		r, errno = c.resolve(p)
	}
	if errno != 0 {
		return nil, errno
	}
	return c.dir.OpenFile(r, flag, perm)
}

// Lstat implements experimentalsys.FS.
func (c *confinedFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	r, errno := c.resolveParent(p)
	if errno != 0 {
		return sys.Stat_t{}, errno
	}
	return c.dir.Lstat(r)
}

// Stat implements experimentalsys.FS.
func (c *confinedFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	r, errno := c.resolve(p)
	if errno != 0 {
		return sys.Stat_t{}, errno
	}
	return c.dir.Stat(r)
}

// Mkdir implements experimentalsys.FS.
func (c *confinedFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	r, errno := c.resolveParent(p)
	if errno != 0 {
		return errno
	}
	return c.dir.Mkdir(r, perm)
}

// Chmod implements experimentalsys.FS.
func (c *confinedFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	r, errno := c.resolve(p)
	if errno != 0 {
		return errno
	}
	return c.dir.Chmod(r, perm)
}

// Rename implements experimentalsys.FS.
func (c *confinedFS) Rename(from, to string) experimentalsys.Errno {
	rf, errno := c.resolveParent(from)
	if errno != 0 {
		return errno
	}
	rt, errno := c.resolveParent(to)
	if errno != 0 {
		return errno
	}
	return c.dir.Rename(rf, rt)
}

// Rmdir implements experimentalsys.FS.
func (c *confinedFS) Rmdir(p string) experimentalsys.Errno {
	r, errno := c.resolveParent(p)
	if errno != 0 {
		return errno
	}
	return c.dir.Rmdir(r)
}

// Unlink implements experimentalsys.FS.
func (c *confinedFS) Unlink(p string) experimentalsys.Errno {
	r, errno := c.resolveParent(p)
	if errno != 0 {
		return errno
	}
	return c.dir.Unlink(r)
}

// Link implements experimentalsys.FS: like linkat without AT_SYMLINK_FOLLOW, the
// old path's last name is not followed.
func (c *confinedFS) Link(oldPath, newPath string) experimentalsys.Errno {
	ro, errno := c.resolveParent(oldPath)
	if errno != 0 {
		return errno
	}
	rn, errno := c.resolveParent(newPath)
	if errno != 0 {
		return errno
	}
	return c.dir.Link(ro, rn)
}

// Symlink implements experimentalsys.FS. The target is stored as given: it is only
// ever resolved by this FS, inside the mount.
func (c *confinedFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	r, errno := c.resolveParent(linkName)
	if errno != 0 {
		return errno
	}
	return c.dir.Symlink(oldPath, r)
}

// Readlink implements experimentalsys.FS.
func (c *confinedFS) Readlink(p string) (string, experimentalsys.Errno) {
	r, errno := c.resolveParent(p)
	if errno != 0 {
		return "", errno
	}
	return c.dir.Readlink(r)
}

// Utimens implements experimentalsys.FS.
func (c *confinedFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	r, errno := c.resolve(p)
	if errno != 0 {
		return errno
	}
	return c.dir.Utimens(r, atim, mtim)
}
