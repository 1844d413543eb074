package cri

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// blockDevices names block devices by major:minor, as cAdvisor's device label does
// ("/dev/" + the kernel's name), from /sys/dev/block/MAJ:MIN/uevent. Each device is
// looked up once and remembered, a miss too: kubelet polls the stats of every pod
// every 10 s, and device numbers do not change names while the node runs (a device
// that goes away and comes back is a new disk sequence but the same name). The zero
// value reads the host's /sys.
type blockDevices struct {
	mu    sync.Mutex
	names map[[2]uint64]string
	// sysRoot is where sysfs is mounted; empty means /sys (tests point it elsewhere).
	sysRoot string
}

// name returns "/dev/<DEVNAME>" for the block device major:minor, or "" when the
// kernel has no such block device (a filesystem without one: tmpfs, overlay).
func (b *blockDevices) name(major, minor uint64) string {
	k := [2]uint64{major, minor}
	b.mu.Lock()
	n, ok := b.names[k]
	b.mu.Unlock()
	if ok {
		return n
	}
	root := b.sysRoot
	if root == "" {
		root = "/sys"
	}
	if data, err := os.ReadFile(filepath.Join(root, "dev", "block", fmt.Sprintf("%d:%d", major, minor), "uevent")); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("DEVNAME=")); ok && len(v) > 0 {
				n = "/dev/" + string(v)
				break
			}
		}
	}
	b.mu.Lock()
	if b.names == nil {
		b.names = map[[2]uint64]string{}
	}
	b.names[k] = n
	b.mu.Unlock()
	return n
}

// label is the device label of IO series: the device's name, or "MAJ:MIN" when the
// kernel names none, so that two unnamed devices never share a series.
func (b *blockDevices) label(major, minor uint64, known string) string {
	if known != "" {
		return known
	}
	if n := b.name(major, minor); n != "" {
		return n
	}
	return fmt.Sprintf("%d:%d", major, minor)
}

// filesystem returns the block device holding the filesystem mounted at mountpoint
// and its capacity, or "" and nil when it is on no block device or cannot be read.
func (b *blockDevices) filesystem(mountpoint string) (string, *fsCapacity) {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return "", nil
	}
	dev := b.name(uint64(unix.Major(st.Dev)), uint64(unix.Minor(st.Dev)))
	if dev == "" {
		return "", nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(mountpoint, &fs); err != nil {
		return "", nil
	}
	return dev, &fsCapacity{
		limitBytes:  fs.Blocks * uint64(fs.Bsize),
		inodesTotal: fs.Files,
		inodesFree:  fs.Ffree,
	}
}
