package runc

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/mount"
)

// rootfsPath is where the container's root filesystem is (or gets mounted).
func rootfsPath(bundle string, spec *specs.Spec) string {
	if filepath.IsAbs(spec.Root.Path) {
		return filepath.Clean(spec.Root.Path)
	}
	return filepath.Join(bundle, spec.Root.Path)
}

// libcontainerConfig converts spec with specconv. specconv resolves relative paths (root,
// bind sources) against the working directory, because runc runs in the bundle; the shim
// serves many bundles at once and must not chdir, so those paths are made absolute first.
func libcontainerConfig(id, bundle string, spec *specs.Spec) (*configs.Config, error) {
	spec.Root.Path = rootfsPath(bundle, spec)
	for i, m := range spec.Mounts {
		if m.Source != "" && !filepath.IsAbs(m.Source) && isBind(m) {
			spec.Mounts[i].Source = filepath.Join(bundle, m.Source)
		}
	}
	cgPath := ""
	if spec.Linux != nil {
		cgPath = spec.Linux.CgroupsPath
	}
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName: id,
		// "slice:prefix:name" is how the systemd driver's paths look; cgroupfs paths
		// are absolute.
		UseSystemdCgroup: cgPath != "" && !strings.HasPrefix(cgPath, "/") && strings.Count(cgPath, ":") == 2,
		NoPivotRoot:      false,
		Spec:             spec,
	})
	if err != nil {
		return nil, err
	}
	for i, l := range cfg.Labels {
		if strings.HasPrefix(l, "bundle=") {
			cfg.Labels[i] = "bundle=" + bundle
		}
	}
	// cgroup v1 controllers dereference Resources; specconv sets it, but a nil here
	// would only show as a panic deep in Apply.
	if cfg.Cgroups.Resources == nil {
		cfg.Cgroups.Resources = &cgroups.Resources{}
	}
	// A parent-death signal would kill the containers whenever the shim dies; they are
	// meant to outlive it.
	cfg.ParentDeathSignal = 0
	return cfg, nil
}

func isBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// privatePIDNamespace reports whether the container gets a PID namespace of its own (then
// its processes die with its init; otherwise the shim has to kill the leftovers).
func privatePIDNamespace(spec *specs.Spec) bool {
	if spec.Linux == nil {
		return false
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.PIDNamespace {
			return ns.Path == ""
		}
	}
	return false
}

// newProcess converts an OCI process as runc's newProcess (utils_linux.go) does.
func newProcess(p *specs.Process) (*libcontainer.Process, error) {
	lp := &libcontainer.Process{
		Args:            p.Args,
		Env:             p.Env,
		UID:             int(p.User.UID),
		GID:             int(p.User.GID),
		Cwd:             p.Cwd,
		Label:           p.SelinuxLabel,
		NoNewPrivileges: &p.NoNewPrivileges,
		AppArmorProfile: p.ApparmorProfile,
		Scheduler:       p.Scheduler,
		IOPriority:      p.IOPriority,
	}
	if p.ConsoleSize != nil {
		lp.ConsoleWidth = uint16(p.ConsoleSize.Width)
		lp.ConsoleHeight = uint16(p.ConsoleSize.Height)
	}
	if c := p.Capabilities; c != nil {
		lp.Capabilities = &configs.Capabilities{
			Bounding:    c.Bounding,
			Effective:   c.Effective,
			Inheritable: c.Inheritable,
			Permitted:   c.Permitted,
			Ambient:     c.Ambient,
		}
	}
	for _, g := range p.User.AdditionalGids {
		lp.AdditionalGroups = append(lp.AdditionalGroups, int(g))
	}
	for _, rl := range p.Rlimits {
		typ, ok := rlimits[rl.Type]
		if !ok {
			return nil, fmt.Errorf("unknown rlimit %q", rl.Type)
		}
		lp.Rlimits = append(lp.Rlimits, configs.Rlimit{Type: typ, Hard: rl.Hard, Soft: rl.Soft})
	}
	aff, err := configs.ConvertCPUAffinity(p.ExecCPUAffinity)
	if err != nil {
		return nil, err
	}
	lp.CPUAffinity = aff
	return lp, nil
}

var rlimits = map[string]int{
	"RLIMIT_CPU":        unix.RLIMIT_CPU,
	"RLIMIT_FSIZE":      unix.RLIMIT_FSIZE,
	"RLIMIT_DATA":       unix.RLIMIT_DATA,
	"RLIMIT_STACK":      unix.RLIMIT_STACK,
	"RLIMIT_CORE":       unix.RLIMIT_CORE,
	"RLIMIT_RSS":        unix.RLIMIT_RSS,
	"RLIMIT_NPROC":      unix.RLIMIT_NPROC,
	"RLIMIT_NOFILE":     unix.RLIMIT_NOFILE,
	"RLIMIT_MEMLOCK":    unix.RLIMIT_MEMLOCK,
	"RLIMIT_AS":         unix.RLIMIT_AS,
	"RLIMIT_LOCKS":      unix.RLIMIT_LOCKS,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_MSGQUEUE":   unix.RLIMIT_MSGQUEUE,
	"RLIMIT_NICE":       unix.RLIMIT_NICE,
	"RLIMIT_RTPRIO":     unix.RLIMIT_RTPRIO,
	"RLIMIT_RTTIME":     unix.RLIMIT_RTTIME,
}

// updateResources returns a copy of cur with r applied the way `runc update` applies it:
// only what r sets changes. cur itself is left alone, because libcontainer keeps using
// the config it was given until Set succeeds.
func updateResources(cur *cgroups.Resources, r *specs.LinuxResources) *cgroups.Resources {
	res := *cur
	if r.Memory != nil {
		m := r.Memory
		// Without a swap value, -1 (unlimited) memory would fail with "unable to set
		// swap limit without memory limit".
		if m.Limit != nil && *m.Limit == -1 && m.Swap == nil {
			zero := int64(0)
			m.Swap = &zero
		}
		if m.Limit != nil {
			res.Memory = *m.Limit
		}
		if m.Reservation != nil {
			res.MemoryReservation = *m.Reservation
		}
		if m.Swap != nil {
			res.MemorySwap = *m.Swap
		}
		if m.CheckBeforeUpdate != nil {
			res.MemoryCheckBeforeUpdate = *m.CheckBeforeUpdate
		}
	}
	if c := r.CPU; c != nil {
		if c.Shares != nil {
			res.CpuShares = *c.Shares
			res.CpuWeight = cgroups.ConvertCPUSharesToCgroupV2Value(*c.Shares)
		} else if c.Idle != nil {
			// cpu.idle with no weight fails on v2 ("invalid argument"), as runc notes.
			res.CpuShares, res.CpuWeight = 0, 0
		}
		// Quota and period only make sense together; one given alone keeps the other.
		if c.Period != nil && *c.Period != 0 {
			res.CpuPeriod = *c.Period
		}
		if c.Quota != nil && *c.Quota != 0 {
			res.CpuQuota = *c.Quota
		}
		if c.Burst != nil {
			res.CpuBurst = c.Burst
		}
		if c.RealtimePeriod != nil {
			res.CpuRtPeriod = *c.RealtimePeriod
		}
		if c.RealtimeRuntime != nil {
			res.CpuRtRuntime = *c.RealtimeRuntime
		}
		if c.Cpus != "" {
			res.CpusetCpus = c.Cpus
		}
		if c.Mems != "" {
			res.CpusetMems = c.Mems
		}
		if c.Idle != nil {
			res.CPUIdle = c.Idle
		}
	}
	if r.Pids != nil && r.Pids.Limit != nil {
		res.PidsLimit = r.Pids.Limit
	}
	if b := r.BlockIO; b != nil && b.Weight != nil {
		res.BlkioWeight = *b.Weight
	}
	if len(r.HugepageLimits) > 0 {
		res.HugetlbLimit = nil
		for _, h := range r.HugepageLimits {
			res.HugetlbLimit = append(res.HugetlbLimit, &cgroups.HugepageLimit{Pagesize: h.Pagesize, Limit: h.Limit})
		}
	}
	if r.Unified != nil {
		res.Unified = r.Unified
	}
	return &res
}

// mountRootfs mounts the container's rootfs at target. Mounts with containerd's
// uidmap=/gidmap= options (containerd's overlayfs snapshot of a user-namespaced pod)
// are idmapped as containerd-shim-runc-v2 mounts them: containerd chose the mapping
// and prepared the upper dir for it. A container that joins a user namespace by a
// /proc/<pid>/ns/user path (the pod's, as crisp's controller and containerd ask) gets
// crisp's idmapped layers, so that the image's files, owned by root on disk, are owned
// by root inside the container, and what it writes is stored with its in-container
// ids, unless the snapshot was already chowned for the namespace (see chownedFor).
// Without a user namespace, or with one named otherwise (containerd's pinned user
// namespace of its pause container, whose rootfs containerd prepared), the layers are
// mounted as they are, as containerd's runc shim mounts them.
func mountRootfs(spec *specs.Spec, ms []mount.Mount, target string) error {
	if mount.Remapped(ms) {
		return mount.All(ms, target)
	}
	path := ""
	if spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.UserNamespace {
				path = ns.Path
			}
		}
	}
	if path == "" {
		return mount.All(ms, target)
	}
	pid, err := mount.UserNSPid(path)
	if err != nil {
		return mount.All(ms, target)
	}
	uid, gid, err := mount.HostRootIDs(pid)
	if err != nil {
		return fmt.Errorf("idmapped rootfs: %w", err)
	}
	if chownedFor(ms, uid, gid) {
		return mount.All(ms, target)
	}
	return mount.AllIDMapped(ms, target, mount.IDMap{UserNS: path, RootUID: uid, RootGID: gid})
}

// chownedFor reports whether the writable layer of ms (an overlay's upperdir, or a
// bind mount's source) is owned by uid:gid, the host ids of the user namespace's root:
// containerd's snapshotters chown a snapshot for a user-namespaced pod so where the
// kernel cannot idmap overlay layers (slow_chown), and such a snapshot stores host ids,
// which idmapping would map a second time. crisp's own snapshots store in-container
// ids: their upper dir is never owned by the mapped root.
func chownedFor(ms []mount.Mount, uid, gid uint32) bool {
	if len(ms) != 1 {
		return false
	}
	m := ms[0]
	dir := ""
	if m.Type == "overlay" {
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				dir = v
			}
		}
	} else if slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind") {
		dir = m.Source
	}
	var st unix.Stat_t
	if dir == "" || unix.Stat(dir, &st) != nil {
		return false
	}
	return st.Uid == uid && st.Gid == gid
}
