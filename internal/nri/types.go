package nri

import (
	"fmt"
	"maps"
	"slices"

	"github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Pod is what plugins are told of a pod.
type Pod struct {
	ID, Name, UID, Namespace string
	Labels, Annotations      map[string]string
	RuntimeHandler           string
	// CgroupParent is the pod's cgroup parent (kubelet's), CgroupsPath its own cgroup.
	CgroupParent, CgroupsPath string
	// Pid is the pod's sandbox process (0: not known).
	Pid uint32
	IPs []string
	// Overhead and Resources are the pod-level resources of UpdatePodSandboxResources.
	Overhead, Resources *runtime.LinuxContainerResources
}

// Container is what plugins are told of a container. Spec is its OCI spec: at
// CreateContainer the one being built (adjustments are applied to it); later, when
// crisp keeps none, nil, and Resources says what the container runs with.
type Container struct {
	ID, PodID, Name     string
	State               runtime.ContainerState
	Labels, Annotations map[string]string
	Spec                *rspec.Spec
	Resources           *runtime.LinuxContainerResources
	Pid                 uint32
	CreatedAt           int64
	StartedAt           int64
	FinishedAt          int64
	ExitCode            int32
	Reason, Message     string
	// Seccomp is the seccomp profile the container's config asks for (nil: none),
	// as containerd reports it: the default validator's seccomp keys judge by it.
	Seccomp *runtime.SecurityProfile
}

func (p Pod) toNRI() *api.PodSandbox {
	return &api.PodSandbox{
		Id:             p.ID,
		Name:           p.Name,
		Uid:            p.UID,
		Namespace:      p.Namespace,
		Labels:         maps.Clone(p.Labels),
		Annotations:    maps.Clone(p.Annotations),
		RuntimeHandler: p.RuntimeHandler,
		Pid:            p.Pid,
		Ips:            slices.Clone(p.IPs),
		Linux: &api.LinuxPodSandbox{
			PodOverhead:  FromCRIResources(p.Overhead),
			PodResources: FromCRIResources(p.Resources),
			CgroupParent: p.CgroupParent,
			CgroupsPath:  p.CgroupsPath,
		},
	}
}

func (c Container) toNRI() *api.Container {
	nc := &api.Container{
		Id:            c.ID,
		PodSandboxId:  c.PodID,
		Name:          c.Name,
		State:         nriState(c.State),
		Labels:        maps.Clone(c.Labels),
		Annotations:   maps.Clone(c.Annotations),
		Pid:           c.Pid,
		CreatedAt:     c.CreatedAt,
		StartedAt:     c.StartedAt,
		FinishedAt:    c.FinishedAt,
		ExitCode:      c.ExitCode,
		StatusReason:  c.Reason,
		StatusMessage: c.Message,
		Linux:         &api.LinuxContainer{Resources: FromCRIResources(c.Resources)},
	}
	if sp := c.Seccomp; sp != nil {
		nc.Linux.SeccompProfile = &api.SecurityProfile{ProfileType: api.SecurityProfile_ProfileType(sp.GetProfileType()), LocalhostRef: sp.GetLocalhostRef()}
	}
	s := c.Spec
	if s == nil {
		return nc
	}
	// As containerd reports a container from its spec.
	nc.Mounts = api.FromOCIMounts(s.Mounts)
	nc.Hooks = api.FromOCIHooks(s.Hooks)
	if p := s.Process; p != nil {
		nc.Args = slices.Clone(p.Args)
		nc.Env = slices.Clone(p.Env)
		nc.User = &api.User{Uid: p.User.UID, Gid: p.User.GID, AdditionalGids: slices.Clone(p.User.AdditionalGids)}
		for _, l := range p.Rlimits {
			nc.Rlimits = append(nc.Rlimits, &api.POSIXRlimit{Type: l.Type, Hard: l.Hard, Soft: l.Soft})
		}
		nc.Linux.OomScoreAdj = api.Int(p.OOMScoreAdj)
		nc.Linux.IoPriority = api.FromOCILinuxIOPriority(p.IOPriority)
		if p.Scheduler != nil {
			nc.Linux.Scheduler = api.FromOCILinuxScheduler(p.Scheduler)
		}
	}
	if l := s.Linux; l != nil {
		nc.Linux.Namespaces = api.FromOCILinuxNamespaces(l.Namespaces)
		nc.Linux.Devices = api.FromOCILinuxDevices(l.Devices)
		nc.Linux.Resources = api.FromOCILinuxResources(l.Resources, s.Annotations)
		nc.Linux.CgroupsPath = l.CgroupsPath
		nc.Linux.Sysctl = maps.Clone(l.Sysctl)
		if l.Seccomp != nil {
			nc.Linux.SeccompPolicy = api.FromOCILinuxSeccomp(l.Seccomp)
		}
		nc.Linux.NetDevices = api.FromOCILinuxNetDevices(l.NetDevices)
	}
	return nc
}

func nriState(s runtime.ContainerState) api.ContainerState {
	switch s {
	case runtime.ContainerState_CONTAINER_CREATED:
		return api.ContainerState_CONTAINER_CREATED
	case runtime.ContainerState_CONTAINER_RUNNING:
		return api.ContainerState_CONTAINER_RUNNING
	case runtime.ContainerState_CONTAINER_EXITED:
		return api.ContainerState_CONTAINER_STOPPED
	}
	return api.ContainerState_CONTAINER_UNKNOWN
}

// adjustSpec applies adj to s with the library's generator, as containerd does.
func adjustSpec(s *rspec.Spec, adj *api.ContainerAdjustment, cdi func(*rspec.Spec, []string) error) error {
	g := nrigen.SpecGenerator(newSpecGen(s),
		nrigen.WithCDIDeviceInjector(cdi),
		// As containerd: an RDT class is the container's CLOS.
		nrigen.WithRdtResolver(func(class string) (*rspec.LinuxIntelRdt, error) {
			if class == "" {
				return nil, nil
			}
			return &rspec.LinuxIntelRdt{ClosID: class}, nil
		}),
		// crisp has no block I/O class configuration (containerd's comes from
		// goresctrl's): a class is refused by name rather than silently dropped.
		nrigen.WithBlockIOResolver(func(class string) (*rspec.LinuxBlockIO, error) {
			if class == "" {
				return nil, nil
			}
			return nil, fmt.Errorf("block I/O class %q: crisp has no block I/O classes", class)
		}),
	)
	return g.Adjust(adj)
}

// FromCRIResources converts CRI container resources to NRI's form, as containerd does.
func FromCRIResources(c *runtime.LinuxContainerResources) *api.LinuxResources {
	if c == nil {
		return nil
	}
	shares, quota, period := uint64(c.CpuShares), c.CpuQuota, uint64(c.CpuPeriod)
	r := &api.LinuxResources{
		Cpu: &api.LinuxCPU{
			Shares: api.UInt64(&shares),
			Quota:  api.Int64(&quota),
			Period: api.UInt64(&period),
			Cpus:   c.CpusetCpus,
			Mems:   c.CpusetMems,
		},
		Memory: &api.LinuxMemory{
			Limit: api.Int64(&c.MemoryLimitInBytes),
		},
	}
	for _, l := range c.HugepageLimits {
		r.HugepageLimits = append(r.HugepageLimits, &api.HugepageLimit{PageSize: l.PageSize, Limit: l.Limit})
	}
	if len(c.Unified) != 0 {
		r.Unified = maps.Clone(c.Unified)
	}
	return r
}

// ToCRIResources converts NRI resources to the CRI's form, as containerd does; the
// OOM score adjustment, which NRI keeps outside the resources, is oomScoreAdj.
func ToCRIResources(r *api.LinuxResources, oomScoreAdj int64) *runtime.LinuxContainerResources {
	if r == nil {
		return nil
	}
	o := &runtime.LinuxContainerResources{}
	if r.Memory != nil {
		o.MemoryLimitInBytes = r.Memory.GetLimit().GetValue()
		o.OomScoreAdj = oomScoreAdj
	}
	if r.Cpu != nil {
		o.CpuShares = int64(r.Cpu.GetShares().GetValue())
		o.CpuPeriod = int64(r.Cpu.GetPeriod().GetValue())
		o.CpuQuota = r.Cpu.GetQuota().GetValue()
		o.CpusetCpus = r.Cpu.Cpus
		o.CpusetMems = r.Cpu.Mems
	}
	for _, l := range r.HugepageLimits {
		o.HugepageLimits = append(o.HugepageLimits, &runtime.HugepageLimit{PageSize: l.PageSize, Limit: l.Limit})
	}
	if len(r.Unified) != 0 {
		o.Unified = maps.Clone(r.Unified)
	}
	return o
}
