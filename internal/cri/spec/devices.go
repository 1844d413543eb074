package spec

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// errNotADevice marks a path that is not a character or block device.
var errNotADevice = errors.New("not a device node")

// deviceFromPath reads a device node's type and numbers from the host (like
// containerd's oci.DeviceFromPath and runc's devices.DeviceFromPath), without following
// a final symlink: callers resolve symlinks first.
func deviceFromPath(p string) (specs.LinuxDevice, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return specs.LinuxDevice{}, &fs.PathError{Op: "lstat", Path: p, Err: err}
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	default:
		return specs.LinuxDevice{}, errNotADevice
	}
	mode := os.FileMode(st.Mode &^ unix.S_IFMT)
	uid, gid := st.Uid, st.Gid
	rdev := uint64(st.Rdev) //nolint:unconvert // 32-bit on some architectures
	return specs.LinuxDevice{
		Path:     p,
		Type:     typ,
		Major:    int64(unix.Major(rdev)),
		Minor:    int64(unix.Minor(rdev)),
		FileMode: &mode,
		UID:      &uid,
		GID:      &gid,
	}, nil
}

// criDevices maps the CRI devices to OCI devices plus the cgroup rules that allow them.
// A host path that is a directory adds every device below it (containerd's
// oci.WithDevices), with container paths mirrored under container_path; a host path
// that is neither a device nor a directory is refused.
func criDevices(devs []*runtime.Device) ([]specs.LinuxDevice, []specs.LinuxDeviceCgroup, error) {
	var (
		out   []specs.LinuxDevice
		rules []specs.LinuxDeviceCgroup
	)
	for _, d := range devs {
		ctrPath := d.GetContainerPath()
		if !path.IsAbs(ctrPath) {
			return nil, nil, invalidf("device container_path %q must be an absolute path", ctrPath)
		}
		ctrPath = path.Clean(ctrPath)
		perms := d.GetPermissions()
		if perms == "" {
			perms = "rwm"
		}
		if strings.Trim(perms, "rwm") != "" {
			return nil, nil, invalidf("device %s: permissions %q may only contain r, w and m", d.GetHostPath(), d.GetPermissions())
		}
		if !filepath.IsAbs(d.GetHostPath()) {
			return nil, nil, invalidf("device host_path %q (for %s) must be an absolute path", d.GetHostPath(), ctrPath)
		}
		src, err := filepath.EvalSymlinks(d.GetHostPath())
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil, invalidf("device host_path %q (for %s) does not exist on the host", d.GetHostPath(), ctrPath)
			}
			return nil, nil, invalidf("device host_path %q (for %s): %v", d.GetHostPath(), ctrPath, err)
		}
		found, err := devicesAt(src, ctrPath)
		if err != nil {
			return nil, nil, err
		}
		if len(found) == 0 {
			return nil, nil, invalidf("device host_path %q (for %s) is not a device node and holds none", d.GetHostPath(), ctrPath)
		}
		for _, dev := range found {
			out = append(out, dev)
			rules = append(rules, specs.LinuxDeviceCgroup{
				Allow:  true,
				Type:   dev.Type,
				Major:  &dev.Major,
				Minor:  &dev.Minor,
				Access: perms,
			})
		}
	}
	return out, rules, nil
}

// devicesAt returns the device at src (with container path ctrPath), or, for a
// directory, every device below it; entries that are not devices are skipped there.
func devicesAt(src, ctrPath string) ([]specs.LinuxDevice, error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, invalidf("device host_path %q: %v", src, err)
	}
	if !st.IsDir() {
		dev, err := deviceFromPath(src)
		if errors.Is(err, errNotADevice) {
			return nil, invalidf("device host_path %q (for %s) is not a character or block device", src, ctrPath)
		}
		if err != nil {
			return nil, invalidf("device host_path %q: %v", src, err)
		}
		dev.Path = ctrPath
		return []specs.LinuxDevice{dev}, nil
	}
	var out []specs.LinuxDevice
	err = filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() || e.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		dev, err := deviceFromPath(p)
		if errors.Is(err, errNotADevice) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		dev.Path = path.Join(ctrPath, filepath.ToSlash(rel))
		out = append(out, dev)
		return nil
	})
	if err != nil {
		return nil, invalidf("device host_path %q: %v", src, err)
	}
	return out, nil
}
