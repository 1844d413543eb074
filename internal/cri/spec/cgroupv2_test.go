package spec

import (
	"testing"

	"github.com/opencontainers/cgroups/systemd"
	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestKubeletPodsOnCgroupV2 generates the specs of containers as kubelet 1.36 asks for
// them on a cgroup v2 node with the systemd driver: the cgroupsPath libcontainer takes
// ("<pod slice>:crisp:<id>") and the resources, one per QoS class. What libcontainer
// writes into the v2 files for these resources is shim/runc's TestV2ResourceFiles.
func TestKubeletPodsOnCgroupV2(t *testing.T) {
	const uid = "0c4f1ad3_5a7e_4b1e_9e43_2b1f0d6a7c11"
	// kubelet sends a limit for every page size the node has, 0 when the pod asks none.
	noHugepages := []*runtime.HugepageLimit{{PageSize: "2MB"}, {PageSize: "1GB"}}
	noHugepagesOCI := []specs.LinuxHugepageLimit{{Pagesize: "2MB"}, {Pagesize: "1GB"}}
	for _, tc := range []struct {
		name   string
		parent string
		res    *runtime.LinuxContainerResources
		path   string
		want   *specs.LinuxResources
	}{
		{
			name:   "burstable: requests 250m/128Mi, limits 500m/256Mi",
			parent: "kubepods-burstable-pod" + uid + ".slice",
			res: &runtime.LinuxContainerResources{
				CpuShares: 256, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 256 << 20,
				HugepageLimits: noHugepages,
				// kubelet on v2: kill the whole container on OOM (singleProcessOOMKill off).
				Unified: map[string]string{"memory.oom.group": "1"},
			},
			path: "kubepods-burstable-pod" + uid + ".slice:crisp:c1",
			want: &specs.LinuxResources{
				CPU:            &specs.LinuxCPU{Shares: ptr(uint64(256)), Quota: ptr(int64(50000)), Period: ptr(uint64(100000))},
				Memory:         &specs.LinuxMemory{Limit: ptr(int64(256 << 20)), Swap: ptr(int64(256 << 20))},
				HugepageLimits: noHugepagesOCI,
				Unified:        map[string]string{"memory.oom.group": "1"},
			},
		},
		{
			name:   "guaranteed: 1 CPU, 512Mi, MemoryQoS",
			parent: "kubepods-pod" + uid + ".slice",
			res: &runtime.LinuxContainerResources{
				CpuShares: 1024, CpuQuota: 100000, CpuPeriod: 100000, MemoryLimitInBytes: 512 << 20,
				HugepageLimits: noHugepages,
				Unified:        map[string]string{"memory.oom.group": "1", "memory.min": "536870912"},
			},
			path: "kubepods-pod" + uid + ".slice:crisp:c1",
			want: &specs.LinuxResources{
				CPU:            &specs.LinuxCPU{Shares: ptr(uint64(1024)), Quota: ptr(int64(100000)), Period: ptr(uint64(100000))},
				Memory:         &specs.LinuxMemory{Limit: ptr(int64(512 << 20)), Swap: ptr(int64(512 << 20))},
				HugepageLimits: noHugepagesOCI,
				Unified:        map[string]string{"memory.oom.group": "1", "memory.min": "536870912"},
			},
		},
		{
			name:   "besteffort: minimum shares only",
			parent: "kubepods-besteffort-pod" + uid + ".slice",
			res:    &runtime.LinuxContainerResources{CpuShares: 2, CpuPeriod: 100000, HugepageLimits: noHugepages},
			path:   "kubepods-besteffort-pod" + uid + ".slice:crisp:c1",
			want: &specs.LinuxResources{
				CPU:            &specs.LinuxCPU{Shares: ptr(uint64(2)), Period: ptr(uint64(100000))},
				HugepageLimits: noHugepagesOCI,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setHost(t, defaultHost()) // cgroup v2, swap accounting, hugetlb
			in := baseInput(t)
			in.CgroupParent, in.SystemdCgroup = tc.parent, true
			in.Config.Linux.Resources = tc.res
			res := mustGenerate(t, in)
			equal(t, "cgroupsPath", res.Spec.Linux.CgroupsPath, tc.path)
			r := *res.Spec.Linux.Resources
			r.Devices = nil
			equal(t, "resources", &r, tc.want)
			if len(res.Warnings) != 0 {
				t.Errorf("warnings: %q", res.Warnings)
			}
		})
	}
}

// TestSystemdSliceNames: a cgroup_parent the systemd driver gets is accepted exactly
// when systemd (libcontainer's ExpandSlice) can place it; a name it cannot is
// InvalidArgument here rather than a failure deep in container creation.
func TestSystemdSliceNames(t *testing.T) {
	setHost(t, defaultHost())
	for _, parent := range []string{
		"system.slice", "kubepods.slice", "kubepods-burstable.slice",
		"kubepods-burstable-pod0c4f1ad3_5a7e_4b1e_9e43_2b1f0d6a7c11.slice", "kubepods-pod1.slice",
		"-.slice", "a.b.slice", "a_b.slice", "a\\x2db.slice",
		"kubepods--burstable.slice", "-kubepods.slice", "kubepods-.slice", "--.slice",
		".slice", "slice", "kubepods", "/kubepods.slice", "a/b.slice", "kubepods.slice.x", "a b.slice", "",
	} {
		in := baseInput(t)
		in.CgroupParent, in.SystemdCgroup = parent, true
		_, err := Generate(in)
		want := parent
		if want == "" {
			want = "system.slice" // the default
		}
		_, expErr := systemd.ExpandSlice(want)
		// ExpandSlice only checks the dashes and the suffix; the character set is
		// crisp's (and the shim's) own narrower rule.
		if expErr != nil && err == nil {
			t.Errorf("%q: accepted, but systemd cannot expand it: %v", parent, expErr)
		}
		if err != nil && !isInvalid(err) {
			t.Errorf("%q: %v is not InvalidArgument", parent, err)
		}
		if expErr == nil && err != nil && sliceRE.MatchString(want) {
			t.Errorf("%q: refused (%v), but it is a valid slice", parent, err)
		}
	}
}
