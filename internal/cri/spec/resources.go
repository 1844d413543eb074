package spec

import (
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// UpdateResources maps the resources of an UpdateContainerResources request. Only what
// the request sets is set (a zero CRI value means "not given", as in containerd's
// WithResources), so the result can be applied on top of the running container's
// resources the way `runc update` does. Device rules are never part of it.
func UpdateResources(r *runtime.LinuxContainerResources) (*specs.LinuxResources, error) {
	res, _, err := mapResources(r)
	return res, err
}

// mapResources is containerd's WithResources. It also returns warnings for limits the
// host cannot enforce and that are therefore left out.
func mapResources(r *runtime.LinuxContainerResources) (*specs.LinuxResources, []string, error) {
	out := &specs.LinuxResources{}
	if r == nil {
		return out, nil, nil
	}
	var warnings []string
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"cpu_period", r.GetCpuPeriod()},
		{"cpu_shares", r.GetCpuShares()},
		{"memory_limit_in_bytes", r.GetMemoryLimitInBytes()},
	} {
		if f.v < 0 {
			return nil, nil, invalidf("%s %d must not be negative", f.name, f.v)
		}
	}
	// -1 is "unlimited" for the CFS quota and for swap.
	if r.GetCpuQuota() < -1 {
		return nil, nil, invalidf("cpu_quota %d must be -1 (unlimited) or more", r.GetCpuQuota())
	}
	if r.GetMemorySwapLimitInBytes() < -1 {
		return nil, nil, invalidf("memory_swap_limit_in_bytes %d must be -1 (unlimited) or more", r.GetMemorySwapLimitInBytes())
	}

	cpu := &specs.LinuxCPU{}
	if p := r.GetCpuPeriod(); p != 0 {
		v := uint64(p)
		cpu.Period = &v
	}
	if q := r.GetCpuQuota(); q != 0 {
		cpu.Quota = &q
	}
	if s := r.GetCpuShares(); s != 0 {
		v := uint64(s)
		cpu.Shares = &v
	}
	cpu.Cpus = r.GetCpusetCpus()
	cpu.Mems = r.GetCpusetMems()
	if *cpu != (specs.LinuxCPU{}) {
		out.CPU = cpu
	}

	mem := &specs.LinuxMemory{}
	limit, swap := r.GetMemoryLimitInBytes(), r.GetMemorySwapLimitInBytes()
	if limit != 0 {
		mem.Limit = &limit
		// An equal swap limit keeps the container from swapping by default
		// (containerd, and kubelet's NoSwap behaviour).
		if swap == 0 && swapAvailable() {
			mem.Swap = &limit
		}
	}
	if swap != 0 {
		if swapAvailable() {
			mem.Swap = &swap
		} else {
			warnings = append(warnings, "memory_swap_limit_in_bytes ignored: this host has no swap accounting")
		}
	}
	if mem.Limit != nil || mem.Swap != nil {
		out.Memory = mem
	}

	if hp := r.GetHugepageLimits(); len(hp) > 0 {
		if hugetlbAvailable() {
			for _, l := range hp {
				if !pageSizeRE.MatchString(l.GetPageSize()) {
					return nil, nil, invalidf("hugepage page_size %q is not a size like 2MB or 1GB", l.GetPageSize())
				}
				out.HugepageLimits = append(out.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: l.GetPageSize(), Limit: l.GetLimit()})
			}
		} else {
			// containerd's default (tolerate_missing_hugetlb_controller = true): kubelet
			// sends limits for every page size the node has, even when unused.
			warnings = append(warnings, "hugepage limits ignored: the hugetlb cgroup controller is missing")
		}
	}

	if u := r.GetUnified(); len(u) > 0 {
		if !cgroup2() {
			keys := slices.Sorted(maps.Keys(u))
			return nil, nil, invalidf("unified cgroup settings (%s) need cgroup v2, and this host uses cgroup v1", strings.Join(keys, ", "))
		}
		out.Unified = maps.Clone(u)
	}
	return out, warnings, nil
}

// pageSizeRE is the page size format kubelet sends (runc's hugetlb controller names).
var pageSizeRE = regexp.MustCompile(`^[0-9]+[KMGTP]B$`)

// oomScoreAdj is the CRI's oom_score_adj, raised to floor when it is lower: a lower
// value needs CAP_SYS_RESOURCE and criserver (hence the shim) may run with a higher
// score itself (containerd's restrict_oom_score_adj). clamped says it was raised.
func oomScoreAdj(r *runtime.LinuxContainerResources, floor int) (adj *int, clamped bool, err error) {
	if r == nil {
		return nil, false, nil
	}
	v := int(r.GetOomScoreAdj())
	if v < -1000 || v > 1000 {
		return nil, false, invalidf("oom_score_adj %d is out of range (-1000 to 1000)", v)
	}
	if v < floor {
		v, clamped = floor, true
	}
	return &v, clamped, nil
}

// checkSysctls applies the rules for namespaced sysctls. CRI container configs carry no
// sysctls: they are the pod's (LinuxPodSandboxConfig.sysctls), already set by the pause
// process in the namespaces every container joins, so they are not repeated in the
// container's spec. They are still checked here, because a spec for a container in a
// pod with a non-namespaced sysctl, or a net.* sysctl on the host network, would change
// the node.
func checkSysctls(sysctls map[string]string, hostNetwork, hostIPC bool) error {
	for k := range sysctls {
		switch {
		case strings.HasPrefix(k, "net."):
			if hostNetwork {
				return invalidf("sysctl %s cannot be set in a pod that uses the host network", k)
			}
		case strings.HasPrefix(k, "kernel.shm"), strings.HasPrefix(k, "kernel.msg"),
			k == "kernel.sem", strings.HasPrefix(k, "fs.mqueue."):
			if hostIPC {
				return invalidf("sysctl %s cannot be set in a pod that uses the host IPC namespace", k)
			}
		default:
			return invalidf("sysctl %s is not namespaced: setting it in a pod would change the node", k)
		}
	}
	return nil
}

// MergeResources is a container's CRI resources after an UpdateContainerResources of
// upd on cur, as containerd computes them (opts.WithResources on the container's spec,
// then copyResourcesToStatus): a field the update leaves zero keeps its value, hugepage
// limits replace those of the same page size, unified keys are added or replaced.
// oom_score_adj belongs to the container's process, which an update does not touch, so
// it is cur's. Neither argument is changed.
func MergeResources(cur, upd *runtime.LinuxContainerResources) *runtime.LinuxContainerResources {
	out := &runtime.LinuxContainerResources{}
	if cur != nil {
		out = proto.Clone(cur).(*runtime.LinuxContainerResources)
	}
	if upd == nil {
		return out
	}
	if v := upd.GetCpuPeriod(); v != 0 {
		out.CpuPeriod = v
	}
	if v := upd.GetCpuQuota(); v != 0 {
		out.CpuQuota = v
	}
	if v := upd.GetCpuShares(); v != 0 {
		out.CpuShares = v
	}
	if v := upd.GetCpusetCpus(); v != "" {
		out.CpusetCpus = v
	}
	if v := upd.GetCpusetMems(); v != "" {
		out.CpusetMems = v
	}
	if v := upd.GetMemoryLimitInBytes(); v != 0 {
		out.MemoryLimitInBytes = v
		// A new limit without a swap limit gets swap = limit from the mapping
		// (no swap), so the old swap limit no longer holds.
		if upd.GetMemorySwapLimitInBytes() == 0 && out.GetMemorySwapLimitInBytes() != 0 {
			out.MemorySwapLimitInBytes = v
		}
	}
	if v := upd.GetMemorySwapLimitInBytes(); v != 0 {
		out.MemorySwapLimitInBytes = v
	}
	for _, h := range upd.GetHugepageLimits() {
		i := slices.IndexFunc(out.HugepageLimits, func(o *runtime.HugepageLimit) bool { return o.GetPageSize() == h.GetPageSize() })
		if i >= 0 {
			out.HugepageLimits[i] = proto.Clone(h).(*runtime.HugepageLimit)
		} else {
			out.HugepageLimits = append(out.HugepageLimits, proto.Clone(h).(*runtime.HugepageLimit))
		}
	}
	if len(upd.GetUnified()) > 0 {
		if out.Unified == nil {
			out.Unified = map[string]string{}
		}
		maps.Copy(out.Unified, upd.GetUnified())
	}
	return out
}
