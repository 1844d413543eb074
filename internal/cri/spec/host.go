package spec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/moby/sys/mountinfo"
)

// Host facts the mapping depends on. They are package variables so that tests can
// describe a host (cgroup v1 or v2, mount propagation, capabilities) without root.
var (
	// cgroup2 reports whether /sys/fs/cgroup is the cgroup v2 unified hierarchy. On a
	// hybrid host (v1 controllers at /sys/fs/cgroup, cgroup2 at /sys/fs/cgroup/unified)
	// this is false, which is what runc and kubelet also conclude.
	cgroup2 = sync.OnceValue(func() bool {
		_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
		return err == nil
	})

	// swapAvailable reports whether memory+swap can be limited (containerd's
	// SwapControllerAvailable): memory.memsw.* on v1, memory.swap.max on v2.
	swapAvailable = sync.OnceValue(func() bool {
		if cgroup2() {
			own, err := ownCgroup2Path()
			if err != nil {
				return false
			}
			_, err = os.Stat(filepath.Join("/sys/fs/cgroup", own, "memory.swap.max"))
			return err == nil
		}
		_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
		return err == nil
	})

	// hugetlbAvailable reports whether the hugetlb controller exists.
	hugetlbAvailable = sync.OnceValue(func() bool {
		if cgroup2() {
			b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
			return err == nil && slices.Contains(strings.Fields(string(b)), "hugetlb")
		}
		_, err := os.Stat("/sys/fs/cgroup/hugetlb")
		return err == nil
	})

	// lookupMount returns the mount that holds path (the longest mount point that is a
	// parent of it), as containerd's LookupMount does.
	lookupMount = func(path string) (*mountinfo.Info, error) {
		infos, err := mountinfo.GetMounts(mountinfo.ParentsFilter(path))
		if err != nil {
			return nil, fmt.Errorf("read mountinfo: %w", err)
		}
		var best *mountinfo.Info
		for _, i := range infos {
			if best == nil || len(i.Mountpoint) > len(best.Mountpoint) {
				best = i
			}
		}
		if best == nil {
			return nil, fmt.Errorf("no mount holds %q", path)
		}
		return best, nil
	}

	// allCapabilities is what "all capabilities" means (privileged, add: ALL). containerd
	// uses the daemon's effective set; criserver runs as root, where that equals its
	// bounding set. The bounding set is used because it is also meaningful for a
	// non-root caller (tests) and never names a capability this host cannot grant.
	allCapabilities = sync.OnceValues(func() ([]string, error) {
		f, err := os.Open("/proc/self/status")
		if err != nil {
			return nil, err
		}
		defer f.Close()
		sets, err := cap.ParseProcPIDStatus(f)
		if err != nil {
			return nil, fmt.Errorf("parse /proc/self/status: %w", err)
		}
		names, _ := cap.FromBitmap(sets[cap.Bounding])
		known := cap.Known()
		var out []string
		for _, n := range names {
			if slices.Contains(known, n) {
				out = append(out, n)
			}
		}
		return out, nil
	})

	// hostDevices lists every device node under /dev for privileged containers.
	hostDevices = oci.HostDevices

	// osHostname is the fallback for HOSTNAME when the pod names none (containerd).
	osHostname = os.Hostname

	// throttlePaths are the per-CPU thermal_throttle directories that containerd masks
	// by default (they let a container infer other tenants' load).
	throttlePaths = sync.OnceValue(func() []string {
		p, _ := filepath.Glob("/sys/devices/system/cpu/cpu*/thermal_throttle")
		return p
	})
)

// ownCgroup2Path is this process's path in the unified hierarchy (from /proc/self/cgroup).
func ownCgroup2Path() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}
