package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	continuityfs "github.com/containerd/continuity/fs"
	"golang.org/x/sys/unix"
)

// lowerLayers is the parent chain of a layer being committed, as the guard sees it.
type lowerLayers struct {
	dirs []string // topmost first

	// cache holds the merged view of the lower layers per directory path; they do
	// not change while a layer is committed on them (they are pinned).
	cache map[string]lowerView
}

// lowerView is what the lower layers together show at one path.
type lowerView struct {
	kind kind
	// merged are the indexes of the lowers whose directory at this path is part of the
	// merged directory (topmost first; stops at an opaque one).
	merged []int
}

type kind int

const (
	absent  kind = iota
	isDir        // a directory
	isLink       // a symlink
	isOther      // a file, device, whiteout…: nothing beneath it is visible
)

// check refuses c's entry if a directory its layer creates is, as the mounted image
// will show it, a symlink of a lower layer: the topmost lower layer having something
// there has a symlink. It is what the unpack's guard would have checked with the lower
// layers at hand.
func (l *lowerLayers) check(c lowerCheck) error {
	for i := c.from; i < len(c.dir); {
		end := len(c.dir)
		if j := indexSlash(c.dir[i:]); j >= 0 {
			end = i + j
		}
		prefix := c.dir[:end]
		v, err := l.view(prefix)
		if err != nil {
			return refuse(c.entry, fmt.Sprintf("check parent %q: %s", prefix, err))
		}
		switch v.kind {
		case isLink:
			return refuse(c.entry, fmt.Sprintf("parent %q is a symlink in a lower layer", prefix))
		case isDir:
			i = end + 1
			continue
		}
		return nil // absent or hidden below: created afresh in this layer
	}
	return nil
}

func indexSlash(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}

// view returns what the lower layers together show at the clean relative path p,
// following overlayfs: the topmost layer having p decides its kind; a directory merges
// with the directories at p of the layers below, down to an opaque one or a non-directory.
func (l *lowerLayers) view(p string) (lowerView, error) {
	if v, ok := l.cache[p]; ok {
		return v, nil
	}
	var candidates []int
	if parent := filepath.Dir(p); parent == "." {
		candidates = make([]int, len(l.dirs))
		for i := range candidates {
			candidates[i] = i
		}
	} else {
		pv, err := l.view(parent)
		if err != nil {
			return lowerView{}, err
		}
		if pv.kind != isDir {
			return lowerView{}, nil
		}
		candidates = pv.merged
	}
	var v lowerView
	for _, i := range candidates {
		// p's parent is a real directory in lower i, so this follows no symlink.
		full := filepath.Join(l.dirs[i], p)
		fi, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return lowerView{}, err
		}
		if !fi.IsDir() {
			if v.kind == absent {
				v.kind = isOther
				if fi.Mode()&fs.ModeSymlink != 0 {
					v.kind = isLink
				}
			}
			break // hides this path in the layers below
		}
		v.kind = isDir
		v.merged = append(v.merged, i)
		if isOpaque(full) {
			break
		}
	}
	if l.cache == nil {
		l.cache = map[string]lowerView{}
	}
	l.cache[p] = v
	return v, nil
}

// fixParentDir gives the directory rel of layer, which archive.Apply created as the
// parent of an entry (made says whether an entry of its own came later), the attributes
// containerd's archive.Apply gives it when unpacking with the lower layers at hand
// (mkparent): those of the directory at rel in the topmost lower layer having
// something there, symlinks resolved within that layer; none (0755, root) if that is
// not a directory or no layer has anything. An entry of its own has set owner, mode
// and times since, and added its extended attributes to the lower directory's.
func (l *lowerLayers) fixParentDir(layer, rel string, made madeBy) error {
	path := filepath.Join(layer, rel)
	// The layer's directories are real ones (the guard refuses entries through a
	// symlink of the layer); make sure nothing below is followed out of it.
	if real, err := continuityfs.RootPath(layer, rel); err != nil || real != path {
		return fmt.Errorf("directory %q of the layer is reached through a symlink (%s, %v)", rel, real, err)
	}
	for _, lower := range l.dirs {
		src, err := continuityfs.RootPath(lower, rel)
		if err != nil {
			return fmt.Errorf("look up %q in lower layer %s: %w", rel, lower, err)
		}
		fi, err := os.Lstat(src)
		// containerd stops at ENOTDIR (a lower file where rel has a directory) with an
		// error, failing the unpack; the file hides nothing that could be copied.
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("look up %q in lower layer %s: %w", rel, lower, err)
		}
		if !fi.IsDir() {
			return nil // replaced there: the defaults
		}
		if made == byParent {
			if err := copyDirInfo(fi, path); err != nil {
				return err
			}
		}
		return copyUpXAttrs(path, src)
	}
	return nil
}

// copyDirInfo gives path the owner, mode and times of fi, as containerd's archive
// package does (tar_unix.go).
func copyDirInfo(fi os.FileInfo, path string) error {
	st := fi.Sys().(*syscall.Stat_t)
	if err := os.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
		// Some filesystems (NFS) refuse even a chown to the same owner.
		var cur unix.Stat_t
		if !os.IsPermission(err) || unix.Lstat(path, &cur) != nil || cur.Uid != st.Uid || cur.Gid != st.Gid {
			return fmt.Errorf("chown %s: %w", path, err)
		}
	}
	// Chmod follows a symlink: path is checked to be a real directory.
	if err := os.Chmod(path, fi.Mode()); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimes %s: %w", path, err)
	}
	return nil
}

// copyUpXAttrs copies src's extended attributes to dst, except trusted.* (overlay's own)
// and those dst has, as containerd's archive package does (tar_unix.go).
func copyUpXAttrs(dst, src string) error {
	keys, err := listXattrs(src)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENODATA) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list xattrs of %s: %w", src, err)
	}
	for _, k := range keys {
		if len(k) >= len("trusted.") && k[:len("trusted.")] == "trusted." {
			continue
		}
		v, err := getXattr(src, k)
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return fmt.Errorf("get xattr %q of %s: %w", k, src, err)
		}
		err = unix.Lsetxattr(dst, k, v, unix.XATTR_CREATE)
		if err != nil && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("set xattr %q on %s: %w", k, dst, err)
		}
	}
	return nil
}

// listXattrs returns the names of path's extended attributes.
func listXattrs(path string) ([]string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Llistxattr(path, nil); err != nil {
				return nil, err
			}
			buf = make([]byte, n+256)
			continue
		}
		if err != nil {
			return nil, err
		}
		var keys []string
		for start := 0; start < n; {
			end := start
			for end < n && buf[end] != 0 {
				end++
			}
			if end > start {
				keys = append(keys, string(buf[start:end]))
			}
			start = end + 1
		}
		return keys, nil
	}
}

// getXattr returns the value of path's extended attribute key.
func getXattr(path, key string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, key, buf)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Lgetxattr(path, key, nil); err != nil {
				return nil, err
			}
			buf = make([]byte, n+256)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}
