package mount

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one filesystem to mount: the same shape as an OCI or containerd mount.
type Mount struct {
	Type    string
	Source  string
	Options []string
}

// flagOptions are the options that are mount flags rather than filesystem data.
var flagOptions = map[string]struct {
	set   bool
	flags uintptr
}{
	"ro":          {true, unix.MS_RDONLY},
	"rw":          {false, unix.MS_RDONLY},
	"bind":        {true, unix.MS_BIND},
	"rbind":       {true, unix.MS_BIND | unix.MS_REC},
	"nosuid":      {true, unix.MS_NOSUID},
	"nodev":       {true, unix.MS_NODEV},
	"noexec":      {true, unix.MS_NOEXEC},
	"relatime":    {true, unix.MS_RELATIME},
	"noatime":     {true, unix.MS_NOATIME},
	"strictatime": {true, unix.MS_STRICTATIME},
}

// parse splits options into mount flags and the data string for the filesystem.
func parse(options []string) (uintptr, string) {
	var flags uintptr
	var data []string
	for _, o := range options {
		if f, ok := flagOptions[o]; ok {
			if f.set {
				flags |= f.flags
			} else {
				flags &^= f.flags
			}
			continue
		}
		data = append(data, o)
	}
	return flags, strings.Join(data, ",")
}

// All mounts ms on target in order; on failure it unmounts what it mounted. A mount
// with containerd's uidmap= and gidmap= options is idmapped as containerd mounts it
// (see mountRemapped).
func All(ms []Mount, target string) (retErr error) {
	var done int
	defer func() {
		if retErr != nil && done > 0 {
			_ = Unmount(target)
		}
	}()
	for _, m := range ms {
		if _, _, _, ok := remapOptions(m.Options); ok {
			if err := mountRemapped(m, target); err != nil {
				return err
			}
			done++
			continue
		}
		flags, data := parse(m.Options)
		typ := m.Type
		if flags&unix.MS_BIND != 0 {
			typ = ""
			data = ""
		}
		if err := unix.Mount(m.Source, target, typ, flags&^unix.MS_RDONLY, data); err != nil {
			return fmt.Errorf("mount %s %s on %s (options %v): %w", m.Type, m.Source, target, m.Options, err)
		}
		done++
		// A read-only bind takes a second, remount call: the kernel ignores MS_RDONLY
		// on the bind itself.
		if flags&unix.MS_RDONLY != 0 {
			extra := uintptr(0)
			if flags&unix.MS_BIND != 0 {
				extra = unix.MS_BIND
			}
			if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_RDONLY|extra, data); err != nil {
				return fmt.Errorf("make %s read-only: %w", target, err)
			}
		}
	}
	return nil
}

// Unmount unmounts everything stacked on target, falling back to a lazy unmount when
// the mount is busy; a target with nothing mounted is not an error. The staging mounts
// of an idmapped overlay that a crash left next to target (AllIDMapped) go too.
func Unmount(target string) error {
	for i := 0; i < 64; i++ {
		err := unix.Unmount(target, 0)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return removeStaging(stagingDir(target))
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", target, err)
			}
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted after 64 unmounts", target)
}
