package spec

import (
	"fmt"
	"maps"
	"regexp"
	"slices"

	criann "github.com/crisp-runtime/crisp/api/annotations"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RootfsPath is the rootfs directory relative to the bundle: the caller mounts the
// container's rootfs at <bundle>/rootfs.
const RootfsPath = "rootfs"

// idRE is the container id format crisp accepts (it ends up in cgroup names).
var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Input is everything the mapping needs.
type Input struct {
	// ContainerID is crisp's id of the new container.
	ContainerID string
	// SandboxID is the pod's id, for the io.kubernetes.cri.sandbox-id annotation
	// (left out when empty).
	SandboxID string
	// Config is the CRI request's container config.
	Config *runtime.ContainerConfig
	// Pod is the pod's config, as RunPodSandbox received it.
	Pod *runtime.PodSandboxConfig
	// Image is the image's OCI config (Entrypoint, Cmd, Env, WorkingDir, User, ...).
	Image ocispec.Image
	// ImageName is the image reference reported in the io.kubernetes.cri.image-name
	// annotation; empty means Config.Image's user_specified_image, else its image.
	ImageName string
	// RootfsPath is a directory where the container's rootfs is readable (mounted) now;
	// users and groups are resolved from its etc/passwd and etc/group.
	RootfsPath string
	// PausePid is the pod's pause process: its ipc, uts and pid namespaces are joined
	// via /proc/<pid>/ns/*.
	PausePid int
	// NetNSPath is the pod's pinned network namespace; "" means the host network.
	NetNSPath string
	// PodFilesDir holds hostname, hosts and resolv.conf, bind-mounted at /etc/...
	PodFilesDir string
	// ShmPath is a tmpfs the pod's containers share as /dev/shm; "" gives the
	// container a tmpfs /dev/shm of its own.
	ShmPath string
	// CgroupParent is the pod's CRI cgroup_parent ("" = "/crisp", or system.slice with
	// systemd). The container's cgroup is CgroupParent/crisp-<ContainerID> (cgroupfs)
	// or <CgroupParent>:crisp:<ContainerID> (systemd).
	CgroupParent string
	// SystemdCgroup selects the systemd cgroup driver's path form.
	SystemdCgroup bool
	// TargetPid is, for pid namespace mode TARGET, the target container's init pid.
	TargetPid int
	// OOMScoreAdjFloor is the lowest oom_score_adj the container may get (criserver's
	// own); lower requests are raised to it with a warning.
	OOMScoreAdjFloor int
	// RecursiveReadOnlyMounts says the kernel has mount_setattr (see
	// RecursiveReadOnlySupported), which the OCI "rro" option needs. Without it a
	// recursive_read_only mount is refused rather than silently left writable below.
	RecursiveReadOnlyMounts bool
	// AppArmor is the host's AppArmor; nil when the host has none or it is disabled
	// (a container then gets no profile, and asking for one is refused).
	AppArmor AppArmor
	// CDI resolves the container's CDI devices (CRI CDIDevices and cdi.k8s.io/
	// annotations); nil is CDI turned off, and a container that requests a CDI
	// device is refused.
	CDI *CDI
	// ProcessLabel and MountLabel are the container's SELinux labels ("" when crisp
	// does not label: enable_selinux off or no SELinux on the host). A privileged
	// container runs without its process label, as in containerd: the policy moves
	// it to its privileged type (spc_t) when the runtime starts it.
	ProcessLabel, MountLabel string
}

// Result is the generated spec and what the caller reports or logs about it.
type Result struct {
	// Spec is the OCI runtime spec, for <bundle>/config.json.
	Spec *specs.Spec
	// User is what ContainerStatus reports as the container's user.
	User UserInfo
	// Relabel are the host paths of the mounts kubelet asked to relabel
	// (selinux_relabel), symlinks resolved: the caller gives them MountLabel. Empty
	// when the container has no MountLabel.
	Relabel []string
	// Warnings name settings that were adjusted or ignored (clamped oom_score_adj, a
	// seccomp profile on a privileged container, limits the host cannot enforce, ...).
	Warnings []string
}

// Generate maps the CRI container config, its pod's config and its image's config to an
// OCI runtime spec with the semantics kubelet expects, as containerd implements them.
// Errors caused by the request wrap errdefs.ErrInvalidArgument (a user or group the
// image does not have: errdefs.ErrNotFound; an unsupported feature:
// errdefs.ErrNotImplemented; a host not set up for mount propagation:
// errdefs.ErrFailedPrecondition). Generate only reads the host (the rootfs's user
// files, mount host paths, devices, seccomp profiles, /proc and /sys facts).
//
// SELinux labels are the caller's (Input.ProcessLabel, MountLabel: allocating them
// reserves a level); without them SELinux options yield a warning. Not mapped, on
// purpose: image VOLUMEs (they
// stay ordinary directories of the writable rootfs, like CRI-O's image_volumes=ignore),
// and stdin/stdin_once (they concern the caller's IO, not the spec). CDI devices are
// applied last, over the rest, as containerd's WithCDI does; an unknown one is
// errdefs.ErrInvalidArgument.
func Generate(in Input) (*Result, error) {
	userNS, err := checkInput(in)
	if err != nil {
		return nil, err
	}
	cfg, pod := in.Config, in.Pod
	sc := cfg.GetLinux().GetSecurityContext()
	privileged := sc.GetPrivileged()
	var warnings []string

	modes := namespaceModes(cfg, pod)
	hostNetwork := modes.network == runtime.NamespaceMode_NODE
	if err := checkSysctls(pod.GetLinux().GetSysctls(), hostNetwork, modes.ipc == runtime.NamespaceMode_NODE); err != nil {
		return nil, err
	}

	process, ident, err := processFor(in, privileged)
	if err != nil {
		return nil, err
	}

	cgroupNS := cgroup2() && !privileged
	mounts, rootPropagation, err := buildMounts(mountsInput{
		cfg:          cfg,
		podFilesDir:  in.PodFilesDir,
		shmPath:      in.ShmPath,
		hostIPC:      modes.ipc == runtime.NamespaceMode_NODE,
		privileged:   privileged,
		readonlyRoot: sc.GetReadonlyRootfs(),
		cgroupNS:     cgroupNS,
		rroSupported: in.RecursiveReadOnlyMounts,
		userNS:       userNS,
		hostNetwork:  hostNetwork,
	})
	if err != nil {
		return nil, err
	}

	devices, deviceRules, err := deviceAccess(cfg, privileged)
	if err != nil {
		return nil, err
	}

	resources, resWarnings, err := mapResources(cfg.GetLinux().GetResources())
	if err != nil {
		return nil, err
	}
	warnings = append(warnings, resWarnings...)
	resources.Devices = deviceRules
	oom, clamped, err := oomScoreAdj(cfg.GetLinux().GetResources(), in.OOMScoreAdjFloor)
	if err != nil {
		return nil, err
	}
	if clamped {
		warnings = append(warnings, fmt.Sprintf("oom_score_adj %d raised to %d: lower than criserver's own",
			cfg.GetLinux().GetResources().GetOomScoreAdj(), *oom))
	}

	nss, err := namespaces(in, modes, privileged)
	if err != nil {
		return nil, err
	}
	if userNS != nil {
		if in.PausePid <= 0 {
			return nil, invalidf("the pod's pause pid is needed to join its user namespace")
		}
		// Joined by path only, without linux.uidMappings: libcontainer reads the
		// mappings from the namespace and only warns (or fails, on a mismatch) when a
		// spec carries both. The pod's other namespaces are owned by this one.
		nss = append(nss, specs.LinuxNamespace{Type: specs.UserNamespace, Path: fmt.Sprintf("/proc/%d/ns/user", in.PausePid)})
	}
	cgPath, err := CgroupsPath(in.CgroupParent, in.ContainerID, in.SystemdCgroup)
	if err != nil {
		return nil, err
	}
	masked, readonly := maskedAndReadonlyPaths(sc, userNS != nil)

	process.OOMScoreAdj = oom
	s := &specs.Spec{
		Version:     specs.Version,
		Process:     process,
		Root:        &specs.Root{Path: RootfsPath, Readonly: sc.GetReadonlyRootfs()},
		Mounts:      mounts,
		Annotations: annotations(in),
		Linux: &specs.Linux{
			Resources:         resources,
			CgroupsPath:       cgPath,
			Namespaces:        nss,
			Devices:           devices,
			RootfsPropagation: rootPropagation,
			MaskedPaths:       masked,
			ReadonlyPaths:     readonly,
		},
	}
	secWarnings, err := applySecurityProfiles(s, sc, in.AppArmor)
	if err != nil {
		return nil, err
	}
	warnings = append(warnings, secWarnings...)
	relabel, seWarning, err := applySELinux(s, in, privileged)
	if err != nil {
		return nil, err
	}
	if seWarning != "" {
		warnings = append(warnings, seWarning)
	}
	if err := in.CDI.injectCDI(s, cfg); err != nil {
		return nil, err
	}
	return &Result{Spec: s, User: ident, Warnings: warnings, Relabel: relabel}, nil
}

// processFor makes the container's process from its config and its image's: the
// command, environment, working directory, user (resolved in the rootfs) and
// capabilities. The OOM score is the caller's to set.
func processFor(in Input, privileged bool) (*specs.Process, UserInfo, error) {
	cfg, imgCfg := in.Config, in.Image.Config
	sc := cfg.GetLinux().GetSecurityContext()
	args, err := processArgs(cfg, imgCfg)
	if err != nil {
		return nil, UserInfo{}, err
	}
	hostname := in.Pod.GetHostname()
	if hostname == "" {
		// containerd: a pod without a hostname (crictl) has the node's.
		if hostname, err = osHostname(); err != nil {
			return nil, UserInfo{}, fmt.Errorf("hostname for HOSTNAME: %w", err)
		}
	}
	env, err := processEnv(cfg, imgCfg, hostname)
	if err != nil {
		return nil, UserInfo{}, err
	}
	cwd, err := workingDir(cfg, imgCfg)
	if err != nil {
		return nil, UserInfo{}, err
	}
	ident, err := resolveIdentity(in.RootfsPath, sc, imgCfg.User)
	if err != nil {
		return nil, UserInfo{}, err
	}
	caps, err := capabilities(sc.GetCapabilities(), privileged)
	if err != nil {
		return nil, UserInfo{}, err
	}
	return &specs.Process{
		Terminal: cfg.GetTty(),
		User: specs.User{
			UID:            ident.UID,
			GID:            ident.GID,
			AdditionalGids: slices.Clone(ident.AdditionalGIDs),
		},
		Args:            args,
		Env:             env,
		Cwd:             cwd,
		Capabilities:    caps,
		NoNewPrivileges: sc.GetNoNewPrivs(),
	}, ident, nil
}

// checkInput refuses a request Generate cannot map: missing configs, a bad id, a
// privileged container in an unprivileged pod or in a user namespace. It returns the
// container's user namespace (nil: none).
func checkInput(in Input) (*UserNS, error) {
	cfg, pod := in.Config, in.Pod
	if cfg == nil {
		return nil, invalidf("container config is required")
	}
	if pod == nil {
		return nil, invalidf("pod sandbox config is required")
	}
	if !idRE.MatchString(in.ContainerID) {
		return nil, invalidf("container id %q is not valid", in.ContainerID)
	}
	if cfg.GetMetadata().GetName() == "" {
		return nil, invalidf("container config has no metadata name")
	}
	sc := cfg.GetLinux().GetSecurityContext()
	privileged := sc.GetPrivileged()
	// containerd and CRI-O: a privileged container needs a privileged pod (kubelet
	// marks the pod privileged when any of its containers is).
	if privileged && !pod.GetLinux().GetSecurityContext().GetPrivileged() {
		return nil, invalidf("privileged container %q is not allowed in a pod that is not privileged", cfg.GetMetadata().GetName())
	}
	userNS, err := ContainerUserNS(sc.GetNamespaceOptions(), pod.GetLinux().GetSecurityContext().GetNamespaceOptions())
	if err != nil {
		return nil, err
	}
	if userNS != nil && privileged {
		return nil, invalidf("privileged container %q cannot run in a user namespace", cfg.GetMetadata().GetName())
	}
	return userNS, nil
}

// deviceAccess returns the container's devices and its device cgroup rules.
func deviceAccess(cfg *runtime.ContainerConfig, privileged bool) ([]specs.LinuxDevice, []specs.LinuxDeviceCgroup, error) {
	devices, deviceRules, err := criDevices(cfg.GetDevices())
	if err != nil {
		return nil, nil, err
	}
	if !privileged {
		// Deny everything, then allow the CRI's devices; runc adds its default
		// devices (/dev/null, /dev/zero, ...) and their rules itself.
		return devices, append([]specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}, deviceRules...), nil
	}
	// Privileged: every host device, and the device cgroup allows all (containerd's
	// WithHostDevices + WithAllDevicesAllowed). A CRI device keeps its own path.
	host, err := hostDevices()
	if err != nil {
		return nil, nil, fmt.Errorf("list host devices: %w", err)
	}
	for _, d := range host {
		if !slices.ContainsFunc(devices, func(x specs.LinuxDevice) bool { return x.Path == d.Path }) {
			devices = append(devices, d)
		}
	}
	return devices, []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}, nil
}

// applySecurityProfiles sets the container's seccomp filter and AppArmor profile on s,
// which must be otherwise complete (the default seccomp profile depends on its
// capabilities), and returns the warnings they give.
func applySecurityProfiles(s *specs.Spec, sc *runtime.LinuxContainerSecurityContext, aa AppArmor) ([]string, error) {
	var warnings []string
	seccompFilter, warning, err := seccompFor(sc, s)
	if err != nil {
		return nil, err
	}
	s.Linux.Seccomp = seccompFilter
	if warning != "" {
		warnings = append(warnings, warning)
	}
	if s.Process.ApparmorProfile, warning, err = apparmorFor(sc, aa); err != nil {
		return nil, err
	}
	if warning != "" {
		warnings = append(warnings, warning)
	}
	return warnings, nil
}

// annotations are the CRI's container annotations plus containerd's, which are set last
// so that a request cannot forge them.
func annotations(in Input) map[string]string {
	a := maps.Clone(in.Config.GetAnnotations())
	if a == nil {
		a = map[string]string{}
	}
	image := in.ImageName
	if image == "" {
		image = in.Config.GetImage().GetUserSpecifiedImage()
	}
	if image == "" {
		image = in.Config.GetImage().GetImage()
	}
	md := in.Pod.GetMetadata()
	a[criann.ContainerType] = criann.ContainerTypeContainer
	delete(a, criann.SandboxID) // never the request's own
	if in.SandboxID != "" {
		a[criann.SandboxID] = in.SandboxID
	}
	a[criann.SandboxName] = md.GetName()
	a[criann.SandboxNamespace] = md.GetNamespace()
	a[criann.SandboxUID] = md.GetUid()
	a[criann.ContainerName] = in.Config.GetMetadata().GetName()
	a[criann.ImageName] = image
	return a
}
