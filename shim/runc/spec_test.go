package runc

import (
	"io"
	"log/slog"

	"path/filepath"
	"testing"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/crisp-runtime/crisp/internal/cgstats"
	"github.com/crisp-runtime/crisp/internal/cgstats/v2test"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestLibcontainerConfigPaths(t *testing.T) {
	bundle := t.TempDir()
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs"},
		Process: &specs.Process{Args: []string{"true"}, Cwd: "/"},
		Mounts: []specs.Mount{
			{Destination: "/data", Type: "bind", Source: "data", Options: []string{"rbind"}},
			{Destination: "/abs", Type: "none", Source: "/srv", Options: []string{"bind"}},
			{Destination: "/proc", Type: "proc", Source: "proc"},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/pod/ctr",
			Namespaces:  []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace, Path: "/proc/1/ns/pid"}},
		},
	}
	cfg, err := libcontainerConfig("ctr", bundle, spec)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rootfs != filepath.Join(bundle, "rootfs") {
		t.Errorf("rootfs = %s", cfg.Rootfs)
	}
	srcs := map[string]string{}
	for _, m := range cfg.Mounts {
		srcs[m.Destination] = m.Source
	}
	if srcs["/data"] != filepath.Join(bundle, "data") || srcs["/abs"] != "/srv" || srcs["/proc"] != "proc" {
		t.Errorf("mount sources = %v", srcs)
	}
	found := false
	for _, l := range cfg.Labels {
		if l == "bundle="+bundle {
			found = true
		}
	}
	if !found {
		t.Errorf("labels %v lack bundle=%s", cfg.Labels, bundle)
	}
	if cfg.Cgroups.Path != "/pod/ctr" || cfg.Cgroups.Systemd || cfg.Cgroups.Resources == nil {
		t.Errorf("cgroup = %+v", cfg.Cgroups)
	}
	if cfg.ParentDeathSignal != 0 {
		t.Errorf("parent death signal %d: containers would die with the shim", cfg.ParentDeathSignal)
	}
	if privatePIDNamespace(spec) {
		t.Error("a pid namespace with a path is shared")
	}
	spec.Linux.Namespaces[1].Path = ""
	if !privatePIDNamespace(spec) {
		t.Error("a pid namespace without a path is the container's own")
	}
}

func TestUpdateResources(t *testing.T) {
	quota, period := int64(50000), uint64(100000)
	shares := uint64(512)
	limit := int64(-1)
	pids := int64(64)
	cur := &cgroups.Resources{Memory: 1 << 30, CpuQuota: 1, CpuPeriod: 2, CpusetCpus: "0"}
	got := updateResources(cur, &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &limit},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period, Shares: &shares},
		Pids:   &specs.LinuxPids{Limit: &pids},
	})
	if cur.Memory != 1<<30 || cur.CpuQuota != 1 {
		t.Error("the current resources were modified")
	}
	if got.Memory != -1 || got.MemorySwap != 0 || got.CpuQuota != quota || got.CpuPeriod != period ||
		got.CpuShares != 512 || got.CpuWeight == 0 || *got.PidsLimit != 64 || got.CpusetCpus != "0" {
		t.Errorf("updated = %+v", got)
	}
	// Quota alone keeps the period.
	got = updateResources(cur, &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &quota}})
	if got.CpuQuota != quota || got.CpuPeriod != 2 {
		t.Errorf("quota only: quota %d period %d", got.CpuQuota, got.CpuPeriod)
	}
}

// TestV2ResourceFiles follows a container's OCI resources (as crisp's internal/cri/spec makes
// them from the CRI's LinuxContainerResources, see internal/cri/spec's TestCgroupV2Resources)
// through the shim's libcontainer config into the files libcontainer's cgroup v2
// manager writes, in a v2 node's layout. libcontainer converts cpu shares to cpu.weight
// and memory+swap to memory.swap.max; crisp relies on that and must not do it twice.
func TestV2ResourceFiles(t *testing.T) {
	cgroups.TestMode = true // write plain files instead of requiring cgroupfs
	t.Cleanup(func() { cgroups.TestMode = false })
	for _, tc := range []struct {
		name string
		res  *specs.LinuxResources
		want map[string]string // file → content; "" = must not be written
	}{
		{"burstable: 250m request, 500m limit, 256Mi", &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Shares: u64(256), Quota: i64(50000), Period: u64(100000)},
			Memory: &specs.LinuxMemory{Limit: i64(256 << 20), Swap: i64(256 << 20)},
		}, map[string]string{
			"cpu.max": "50000 100000", "cpu.weight": "35", "memory.max": "268435456",
			// swap = limit: no swap at all
			"memory.swap.max": "0", "pids.max": "",
		}},
		{"default shares", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(1024)}},
			map[string]string{"cpu.weight": "100", "cpu.max": "", "memory.max": ""}},
		{"besteffort: minimum shares", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(2)}},
			map[string]string{"cpu.weight": "1"}},
		{"maximum shares", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(262144)}},
			map[string]string{"cpu.weight": "10000"}},
		{"100m", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(102), Quota: i64(10000)}},
			map[string]string{"cpu.weight": "17", "cpu.max": "10000 100000"}},
		{"unlimited quota", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1), Period: u64(100000)}},
			map[string]string{"cpu.max": "max 100000"}},
		{"swap limit above memory", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(128 << 20), Swap: i64(192 << 20)}},
			map[string]string{"memory.max": "134217728", "memory.swap.max": "67108864"}},
		{"unlimited swap", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(128 << 20), Swap: i64(-1)}},
			map[string]string{"memory.max": "134217728", "memory.swap.max": "max"}},
		{"pids", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(1024)}},
			map[string]string{"pids.max": "1024"}},
		{"pids unlimited", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(-1)}},
			map[string]string{"pids.max": "max"}},
		{"hugepages", &specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 4 << 20}, {Pagesize: "1GB", Limit: 0}}},
			map[string]string{"hugetlb.2MB.max": "4194304", "hugetlb.2MB.rsvd.max": "4194304", "hugetlb.1GB.max": "0"}},
		// kubelet's unified settings (memory.oom.group for a whole-container OOM kill,
		// memory.high from MemoryQoS) are written as they are.
		{"unified", &specs.LinuxResources{Unified: map[string]string{"memory.oom.group": "1", "memory.high": "201326592"}},
			map[string]string{"memory.oom.group": "1", "memory.high": "201326592"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &specs.Spec{
				Version: specs.Version,
				Root:    &specs.Root{Path: "rootfs"},
				Process: &specs.Process{Args: []string{"true"}, Cwd: "/"},
				Linux:   &specs.Linux{CgroupsPath: "kubepods-burstable-podx.slice:crisp:c1", Resources: tc.res},
			}
			cfg, err := libcontainerConfig("c1", t.TempDir(), spec)
			if err != nil {
				t.Fatal(err)
			}
			node := v2test.New(t)
			dir := node.Mkdir("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/crisp-c1.scope")
			r := cfg.Cgroups.Resources
			r.Devices, r.SkipDevices = nil, true // device rules are eBPF, not files
			m, err := fs2.NewManager(cfg.Cgroups, dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Set(r); err != nil {
				t.Fatal(err)
			}
			for file, want := range tc.want {
				if got := node.Read(dir, file); got != want {
					t.Errorf("%s = %q, want %q", file, got, want)
				}
			}
		})
	}
}

// TestContainerCgroupSystemd: the container's cgroupsPath from internal/cri/spec
// ("<pod slice>:crisp:<id>") makes libcontainer use the systemd driver with that slice,
// prefix and name, and the stats are read from the scope libcontainer makes.
func TestContainerCgroupSystemd(t *testing.T) {
	const pod = "kubepods-burstable-pod0c4f1ad3_5a7e_4b1e_9e43_2b1f0d6a7c11.slice"
	for _, tc := range []struct {
		cgPath  string
		systemd bool
		rel     string
	}{
		{pod + ":crisp:c1", true, "/kubepods.slice/kubepods-burstable.slice/" + pod + "/crisp-c1.scope"},
		{"system.slice:crisp:c1", true, "/system.slice/crisp-c1.scope"},
		{"/kubepods/burstable/podx/crisp-c1", false, "/kubepods/burstable/podx/crisp-c1"},
	} {
		spec := &specs.Spec{
			Version: specs.Version,
			Root:    &specs.Root{Path: "rootfs"},
			Process: &specs.Process{Args: []string{"true"}, Cwd: "/"},
			Linux:   &specs.Linux{CgroupsPath: tc.cgPath},
		}
		cfg, err := libcontainerConfig("c1", t.TempDir(), spec)
		if err != nil {
			t.Fatal(err)
		}
		cg := cfg.Cgroups
		if cg.Systemd != tc.systemd {
			t.Errorf("%s: systemd = %v", tc.cgPath, cg.Systemd)
		}
		// What container.cgroup does.
		rel, err := cgstats.RelPath(cg.Systemd, cg.Path, cg.Parent, cg.ScopePrefix, cg.Name)
		if err != nil || rel != tc.rel {
			t.Errorf("%s: stats from %q, %v; want %q", tc.cgPath, rel, err, tc.rel)
		}
		node := v2test.New(t)
		node.Write(node.Mkdir(tc.rel), v2test.Busy)
		c, err := cgstats.LoadV2(node.Root, rel)
		if err != nil {
			t.Errorf("%s: %v", tc.cgPath, err)
			continue
		}
		if _, err := c.Read(); err != nil {
			t.Errorf("%s: %v", tc.cgPath, err)
		}
	}
}

func u64(v uint64) *uint64 { return &v }
func i64(v int64) *int64   { return &v }
